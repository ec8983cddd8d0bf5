// The handler slots shared by the dispatcher's job loop (dispatcher.ts) and its stream workers (stream-worker.ts).

/**
 * The handlers this process runs at once (REACTION_CONCURRENCY), shared by the job loop and the streams. The
 * job loop takes a slot when one is free; a stream waits for one (`whenFree`), first come first served.
 */
export function createSlots(size: number, onFree: () => void = () => {}) {
  let busy = 0
  const waiters: (() => void)[] = []
  const slots = {
    get busy() {
      return busy
    },
    get free() {
      return size - busy
    },
    take() {
      busy += 1
    },
    /** Gives a slot back: to the longest waiting stream if one waits (it stays taken), else free. */
    give() {
      const waiter = waiters.shift()
      if (waiter) {
        waiter()
        return
      }
      busy -= 1
      onFree()
    },
    /** Takes a slot if one is free and nobody waits for one (no promise made): false, call whenFree. */
    tryTake(): boolean {
      if (busy >= size || waiters.length > 0) return false
      busy += 1
      return true
    },
    /** Resolves true once a slot is the caller's (first come, first served); false when `signal` gives up waiting. */
    whenFree(signal: AbortSignal): Promise<boolean> {
      if (signal.aborted) return Promise.resolve(false)
      if (slots.tryTake()) return Promise.resolve(true)
      return new Promise<boolean>((resolve) => {
        const served = () => {
          signal.removeEventListener('abort', gaveUp)
          resolve(true)
        }
        const gaveUp = () => {
          waiters.splice(waiters.indexOf(served), 1)
          resolve(false)
        }
        waiters.push(served)
        signal.addEventListener('abort', gaveUp, { once: true })
      })
    },
  }
  return slots
}

export type Slots = ReturnType<typeof createSlots>
