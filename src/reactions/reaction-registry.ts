// The reaction handlers of one service instance (Octokit-style: an instance, never a module-level list).
// `on('trade.funded', 'ship-goods', handler)` runs a handler for one status; `on('trade.*', 'ledger', h)`
// for every transition; `on(['trade.funded', 'trade.released'], 'crm', h)` for several (still one job per
// event: a handler's patterns are one set). Each (event, handler name) is one job: the name is stored with the job, so it is
// what must stay stable across deploys (renaming a handler orphans its unfinished jobs). Pure: imports
// nothing of ours but types.
import type { ReactionHandler } from './reaction-event.js'

export interface ReactionHandlerOptions {
  /**
   * The longest one call of the handler may take (its own timeout, e.g. FORWARD_TIMEOUT_MS): a call is started only
   * while at least this much of its lease is left, so a job that waited for a slot is given back for a fresh lease
   * rather than started and cut off at the lease's end (and run twice). Unset: started however little is left.
   */
  timeoutMs?: number
}

/** What the observation statement needs: the names to enqueue a job for. */
export interface ReactionRouting {
  /** The names (sorted) of the handlers whose pattern matches `type` ('trade.<status>'). */
  handlersFor(type: string): readonly string[]
}

export interface ReactionRegistry extends ReactionRouting {
  /**
   * Registers `handler` under a unique `name` ([a-z0-9_.-]+) for 'trade.<status>' or 'trade.*', or for a
   * list of them (an event matching any of them).
   */
  on(pattern: string | readonly string[], name: string, handler: ReactionHandler, options?: ReactionHandlerOptions): ReactionRegistry
  /** The handler registered under `name`; undefined when none is (a job left by a removed handler). */
  handler(name: string): ReactionHandler | undefined
  /** The timeoutMs `name` was registered with; undefined when none was given (or no such handler). */
  timeoutOf(name: string): number | undefined
  /**
   * The types `name` takes, as its stream row holds them: its patterns, sorted, comma-joined (`trade.*`,
   * `trade.funded,trade.released`); undefined when no such handler.
   */
  typesOf(name: string): string | undefined
  /** Every registered name, sorted. */
  readonly names: readonly string[]
}

const NAME = /^[a-z0-9_.-]+$/
const PATTERN = /^trade\.(\*|[a-z0-9_]+)$/
const NONE: readonly string[] = Object.freeze([])

export function createReactionRegistry(): ReactionRegistry {
  const entries = new Map<string, { patterns: readonly string[]; handler: ReactionHandler; timeoutMs: number | undefined }>()
  // handlersFor runs for every observation on the ingest path, so its answers are worked out when a handler is
  // registered: one per type a pattern names, and one shared by every other trade.<status> (the trade.*
  // handlers). The types come from signed deliveries and the platform's answers, so a cache filled per type
  // asked grew by one entry for each distinct status ever seen; this one holds only what was registered.
  let byType = new Map<string, readonly string[]>()
  let anyTrade: readonly string[] = NONE
  const takes = (patterns: readonly string[], type: string) =>
    patterns.some((one) => (one === 'trade.*' ? type.startsWith('trade.') : one === type))
  const namesFor = (type: string) =>
    Object.freeze(
      [...entries]
        .filter(([, entry]) => takes(entry.patterns, type))
        .map(([name]) => name)
        .sort(),
    )
  const registry: ReactionRegistry = {
    on(pattern, name, handler, { timeoutMs } = {}) {
      const patterns: readonly string[] = typeof pattern === 'string' ? [pattern] : [...pattern]
      if (patterns.length === 0) throw new Error(`reaction handler ${name} is registered for no pattern`)
      for (const one of patterns) {
        if (!PATTERN.test(one)) {
          throw new Error(`reaction pattern ${JSON.stringify(one)} must be 'trade.<status>' or 'trade.*'`)
        }
      }
      if (!NAME.test(name)) throw new Error(`reaction handler name ${JSON.stringify(name)} must match [a-z0-9_.-]+`)
      if (entries.has(name)) throw new Error(`a reaction handler named ${name} is already registered`)
      if (typeof handler !== 'function') throw new Error(`reaction handler ${name} is not a function`)
      if (timeoutMs !== undefined && !(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
        throw new Error(`reaction handler ${name}: timeoutMs must be a positive number of milliseconds`)
      }
      entries.set(name, { patterns, handler, timeoutMs })
      // a type no pattern names is taken by the trade.* handlers alone ('trade.' itself stands for them)
      anyTrade = namesFor('trade.')
      const named = new Set([...entries.values()].flatMap((entry) => entry.patterns).filter((one) => one !== 'trade.*'))
      byType = new Map([...named].map((type) => [type, namesFor(type)]))
      return registry
    },
    handlersFor(type) {
      return byType.get(type) ?? (type.startsWith('trade.') ? anyTrade : NONE)
    },
    handler(name) {
      return entries.get(name)?.handler
    },
    timeoutOf(name) {
      return entries.get(name)?.timeoutMs
    },
    typesOf(name) {
      const patterns = entries.get(name)?.patterns
      return patterns && [...new Set(patterns)].sort().join(',')
    },
    get names() {
      return [...entries.keys()].sort()
    },
  }
  return registry
}
