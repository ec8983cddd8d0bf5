// The variables of an environment that look meant for the service and that it does not read: a misspelled name is
// otherwise ignored without a word (DATABSE_URL ran the service on an embedded database of its own, FORWARD_EVENT
// forwarded every event type). Pure: the names it is given are the ones the service reads (config.ts).

export interface UnreadVariable {
  /** The variable as set. */
  readonly name: string
  /** The variable the service reads whose name is nearest, when it is near enough to be the one meant. */
  readonly nearest?: string
}

/**
 * The edits (a character inserted, removed or replaced, or two neighbours swapped) that turn `a` into `b`, letter
 * case aside: the optimal string alignment distance, so DATABSE_URL is one edit from DATABASE_URL, not two.
 */
export function editDistance(a: string, b: string): number {
  const x = a.toUpperCase()
  const y = b.toUpperCase()
  // rows of the table: two back, one back, this one
  let twoBack: number[] = []
  let previous = Array.from({ length: y.length + 1 }, (_, j) => j)
  for (let i = 1; i <= x.length; i++) {
    const row = [i]
    for (let j = 1; j <= y.length; j++) {
      const cost = x[i - 1] === y[j - 1] ? 0 : 1
      let best = Math.min(previous[j]! + 1, row[j - 1]! + 1, previous[j - 1]! + cost)
      if (i > 1 && j > 1 && x[i - 1] === y[j - 2] && x[i - 2] === y[j - 1]) best = Math.min(best, twoBack[j - 2]! + 1)
      row.push(best)
    }
    twoBack = previous
    previous = row
  }
  return previous[y.length]!
}

/**
 * The prefixes of the service's own variables: the part up to the first `_` that two or more of them share
 * (DATABASE_, PARTNER_, WEBHOOK_, …), less `notOurs`. One that a single variable has (NO_ of NO_PROXY, SLOW_ of
 * SLOW_BODY_MS) is as likely another program's, and the lower-case proxy names are curl's convention.
 */
export function sharedPrefixes(known: readonly string[], notOurs: readonly string[] = []): string[] {
  const counts = new Map<string, number>()
  for (const name of known) {
    const at = name.indexOf('_')
    if (at <= 0 || name !== name.toUpperCase()) continue
    const prefix = name.slice(0, at + 1)
    counts.set(prefix, (counts.get(prefix) ?? 0) + 1)
  }
  return [...counts]
    .filter(([prefix, count]) => count >= 2 && !notOurs.includes(prefix))
    .map(([prefix]) => prefix)
    .sort()
}

/** What the start (a log line) and a command (a note on stderr) say of one: by name, never by value. */
export function unreadVariableMessage({ name, nearest }: UnreadVariable): string {
  return `${name} is set but is not a variable the service reads${nearest ? `: did you mean ${nearest}?` : ''}`
}

export interface UnreadVariableOptions {
  /**
   * Names that other programs read too (the proxy variables): a near miss of one is as likely theirs (FTP_PROXY is
   * two edits from HTTP_PROXY), so it is named only under a prefix of the service's.
   */
  readonly sharedWithOthers?: readonly string[]
  /** Prefixes two of the service's variables share that other programs use as much (MAX_: MAX_JOBS is a build tool's). */
  readonly prefixesNotOurs?: readonly string[]
}

// How many edits a name may be from the one it is taken to mean: few for a short name, where one edit makes
// another word (HOME is two from HOST)
function editsAllowed(name: string, prefixed: boolean): number {
  if (prefixed) return Math.max(2, Math.floor(name.length / 5))
  if (name.length >= 8) return 2
  return name.length >= 5 ? 1 : 0
}

/**
 * The variables set in `env` (to a value: an empty one sets nothing) that the service does not read and that look
 * meant for it, by name: one with a prefix of its own (`sharedPrefixes`), or one within a few edits of a name it
 * reads. Each with its nearest name where one is near enough. Sorted by name; values are never looked at beyond
 * being set.
 */
export function unreadVariables(
  env: Record<string, string | undefined>,
  known: readonly string[],
  { sharedWithOthers = [], prefixesNotOurs = [] }: UnreadVariableOptions = {},
): UnreadVariable[] {
  const knownSet = new Set(known)
  const prefixes = sharedPrefixes(known, prefixesNotOurs)
  const unread: UnreadVariable[] = []
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined || value === '' || knownSet.has(name)) continue
    const prefixed = prefixes.some((prefix) => name.startsWith(prefix))
    const allowed = editsAllowed(name, prefixed)
    let nearest: string | undefined
    let nearestEdits = allowed + 1
    for (const candidate of known) {
      // at least as many edits as the lengths differ: such a name cannot be near enough, and the distance is not
      // worked out (a command's start compared each of npm's 75 variables with every name, 110 ms of its CPU)
      if (Math.abs(candidate.length - name.length) > allowed) continue
      if (!prefixed && sharedWithOthers.includes(candidate)) continue
      const edits = editDistance(name, candidate)
      if (edits < nearestEdits) {
        nearest = candidate
        nearestEdits = edits
      }
    }
    if (nearest !== undefined) unread.push({ name, nearest })
    else if (prefixed) unread.push({ name })
  }
  return unread.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))
}
