// A log line that a fault can make thousands of times a second (every delivery refused while the database is
// away, or while the ingest queue is full). The first of each interval is written at once; the rest are
// counted, and the last of them is written at the end of the interval with `suppressed`: how many more like it
// were not written. So a stretch of refusals costs one line a second, and none goes unaccounted for. The
// metrics count every one (webhook_deliveries_total{outcome="rejected"}).

/** Written lines carry `suppressed` when others like them were counted instead of written since the last. */
export type LimitedFields<F> = F & { suppressed?: number }

/** A limited line; `flush()` writes the line held back, if any, now (a stop's last word: nothing is written after it). */
export type LimitedLine<F> = ((fields: F) => void) & { flush(): void }

export function limitLines<F extends object>(
  write: (fields: LimitedFields<F>) => void,
  { intervalMs = 1_000, now = () => Date.now() }: { intervalMs?: number; now?: () => number } = {},
): LimitedLine<F> {
  // the end of the interval that began with the last line written
  let intervalEnd = -Infinity
  // calls since the last line written, the last of them held to be written at the interval's end
  let counted = 0
  let held: F | undefined
  let timer: NodeJS.Timeout | undefined

  const writeHeld = () => {
    timer = undefined
    const fields = held!
    const suppressed = counted - 1
    held = undefined
    counted = 0
    intervalEnd = now() + intervalMs
    write(suppressed > 0 ? { ...fields, suppressed } : fields)
  }

  const line = (fields: F) => {
    const at = now()
    if (at >= intervalEnd && timer === undefined) {
      intervalEnd = at + intervalMs
      write(fields)
      return
    }
    counted += 1
    held = fields
    // unref'd: a line held back does not keep the process alive (an exit loses at most a second's count)
    timer ??= setTimeout(writeHeld, Math.max(0, intervalEnd - at)).unref()
  }
  const flush = () => {
    if (timer === undefined) return
    clearTimeout(timer)
    writeHeld()
  }
  return Object.assign(line, { flush })
}

/**
 * limitLines for each key on its own (a reaction handler and its error's code): each key's first line is written at
 * once whatever the others do, and its repeats are counted in its own `suppressed`. A key with no line for two
 * intervals is forgotten once more than `forgetPast` keys are kept (its held line, if any, was written by then), so
 * keys that come and go (handlers removed, codes of a fork's own) do not pile up.
 */
export function limitLinesBy<F extends object>(
  keyOf: (fields: F) => string,
  write: (fields: LimitedFields<F>) => void,
  { intervalMs = 1_000, now = () => Date.now(), forgetPast = 256 }: { intervalMs?: number; now?: () => number; forgetPast?: number } = {},
): LimitedLine<F> {
  const limited = new Map<string, { line: LimitedLine<F>; lastAt: number }>()
  const line = (fields: F) => {
    const key = keyOf(fields)
    const at = now()
    let entry = limited.get(key)
    if (!entry) {
      if (limited.size >= forgetPast) {
        for (const [other, { lastAt }] of limited) if (at - lastAt > 2 * intervalMs) limited.delete(other)
      }
      entry = { line: limitLines(write, { intervalMs, now }), lastAt: at }
      limited.set(key, entry)
    }
    entry.lastAt = at
    entry.line(fields)
  }
  const flush = () => {
    for (const { line: keyed } of limited.values()) keyed.flush()
  }
  return Object.assign(line, { flush })
}
