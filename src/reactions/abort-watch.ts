// What stops with one signal: one `abort` listener on each signal while anything runs under it, not one added and
// removed per call (a stream batch gives every one of its events the same signal, and each event's handler call and
// its requests would otherwise each listen on it).

/** Anything that can be stopped with a reason: an AbortController, a request on its way. */
export interface Abortable {
  abort(reason: unknown): void
}

export interface AbortWatch<T extends Abortable> {
  /** `item` is aborted with `signal`'s reason when `signal` aborts; at once if it already has. */
  add(signal: AbortSignal, item: T): void
  /** `item` ended: no longer aborted with `signal` (the listener goes with the signal's last item). */
  delete(signal: AbortSignal, item: T): void
}

export function createAbortWatch<T extends Abortable>(): AbortWatch<T> {
  const watched = new WeakMap<AbortSignal, { items: Set<T>; onAbort: () => void }>()
  return {
    add(signal, item) {
      if (signal.aborted) {
        item.abort(signal.reason)
        return
      }
      const entry = watched.get(signal)
      if (entry) {
        entry.items.add(item)
        return
      }
      const items = new Set([item])
      const onAbort = () => {
        watched.delete(signal)
        for (const each of items) each.abort(signal.reason)
      }
      watched.set(signal, { items, onAbort })
      signal.addEventListener('abort', onAbort, { once: true })
    },
    delete(signal, item) {
      const entry = watched.get(signal)
      if (!entry || !entry.items.delete(item) || entry.items.size > 0) return
      watched.delete(signal)
      signal.removeEventListener('abort', entry.onAbort)
    },
  }
}
