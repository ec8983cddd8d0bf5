// The reaction handlers of one service instance (Octokit-style: an instance, never a module-level list).
// `on('trade.funded', 'ship-goods', handler)` runs a handler for one status; `on('trade.*', 'ledger', h)`
// for every transition; `on(['trade.funded', 'trade.released'], 'crm', h)` for several (still one job per
// event: a handler's patterns are one set). Each (event, handler name) is one job: the name is stored with the job, so it is
// what must stay stable across deploys (renaming a handler orphans its unfinished jobs). A timeout the lease would cut
// off first is refused with a ReactionSetupError. Imports nothing of ours but types, the lease's margin and that error.
import { leaseMarginMs } from './dispatcher-settings.js'
import type { ReactionHandler } from './reaction-event.js'
import { ReactionSetupError } from './reaction-setup-error.js'

export interface ReactionHandlerOptions {
  /**
   * The longest one call of the handler may take. At this many ms its signal is aborted (with a HandlerTimeoutError)
   * and the attempt is failed, "timed out after N ms", and retried as any failure; a call that ignores its signal keeps
   * its slot until it returns, and what it returns then is not taken (README, "A handler's timeout"). A call is started
   * only while at least this much of its lease is left, so a job that waited for a slot is given back for a fresh
   * lease rather than started and cut off at the lease's end (and run twice). At most REACTION_LEASE_S less the
   * margin at which a call is stopped before its lease ends (refused otherwise). Unset: the handler's own
   * (ownTimeoutMs: the forwarder's, the RabbitMQ publisher's), else no limit but the lease.
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
  /**
   * The timeoutMs of `name`: the one it was registered with, else its handler's own (ownTimeoutMs); undefined when
   * it has neither (or no such handler).
   */
  timeoutOf(name: string): number | undefined
  /**
   * The types `name` takes, as its stream row holds them: its patterns, sorted, comma-joined (`trade.*`,
   * `trade.funded,trade.released`); undefined when no such handler.
   */
  typesOf(name: string): string | undefined
  /** Every registered name, sorted. */
  readonly names: readonly string[]
}

export interface ReactionRegistrySettings {
  /**
   * REACTION_LEASE_S in ms: a timeoutMs past it less leaseMarginMs is refused (the call would be stopped at its lease's
   * end first, its timeout never reached). Absent: any timeoutMs.
   */
  leaseMs?: number | undefined
}

const NAME = /^[a-z0-9_.-]+$/
const PATTERN = /^trade\.(\*|[a-z0-9_]+)$/
const NONE: readonly string[] = Object.freeze([])

export function createReactionRegistry({ leaseMs }: ReactionRegistrySettings = {}): ReactionRegistry {
  // the longest timeoutMs: a call still running a margin before its lease ends is stopped there
  const longestCallMs = leaseMs === undefined ? Infinity : leaseMs - leaseMarginMs(leaseMs)
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
        throw new ReactionSetupError('reaction_timeout_invalid', `reaction handler ${name}: timeoutMs must be a positive number of milliseconds`)
      }
      const effectiveMs = timeoutMs ?? handler.ownTimeoutMs
      if (effectiveMs !== undefined && effectiveMs > longestCallMs) {
        throw new ReactionSetupError(
          'reaction_timeout_invalid',
          `reaction handler ${name}: timeoutMs ${effectiveMs} must be at most ${longestCallMs} ms (REACTION_LEASE_S=${leaseMs! / 1000} ` +
            `less the ${leaseMs! - longestCallMs} ms before its end at which a running call is stopped): a call is cut off at its lease's end first`,
        )
      }
      entries.set(name, { patterns, handler, timeoutMs: effectiveMs })
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
