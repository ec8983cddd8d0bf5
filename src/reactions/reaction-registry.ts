// The reaction handlers of one service instance (Octokit-style: an instance, never a module-level list).
// `on('trade.funded', 'ship-goods', handler)` runs a handler for one status; `on('trade.*', 'ledger', h)`
// for every transition; `on(['trade.funded', 'trade.released'], 'crm', h)` for several (still one job per
// event: a handler's patterns are one set). Each (event, handler name) is one job: the name is stored with the job, so it is
// what must stay stable across deploys (renaming a handler orphans its unfinished jobs). A registration that could
// never run as written (a status the table does not know, a name taken, a timeout past the lease) is refused with a
// ReactionSetupError, so the process stops at its start with one coded line. Imports nothing of ours but types, the
// status table, the lease's margin, a timer's longest wait and that error.
import { MAX_TIMER_MS } from '../clock.js'
import { leaseMarginMs } from './dispatcher-settings.js'
import { isKnownStatus, TRADE_STATUSES, type TradeStatus } from '../orders/trade-status.js'
import type { ReactionHandler } from './reaction-event.js'
import { ReactionSetupError } from './reaction-setup-error.js'

/**
 * What a handler is registered for: `trade.<status>` of a status the table knows (src/orders/trade-status.ts), or
 * `trade.*` for every transition, statuses the table does not know included.
 */
export type ReactionPattern = `trade.${TradeStatus}` | 'trade.*'

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
  on(pattern: ReactionPattern | readonly ReactionPattern[], name: string, handler: ReactionHandler, options?: ReactionHandlerOptions): ReactionRegistry
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
const KNOWN_TYPES = Object.keys(TRADE_STATUSES).map((status) => `trade.${status}`)

/** A value of the fork's as an error shows it: JSON, cut at 60 characters. */
const shown = (value: unknown) => {
  const text = typeof value === 'string' ? value : String(value)
  return JSON.stringify(text.length > 60 ? `${text.slice(0, 60)}…` : text)
}

/**
 * A registry whose `on` refuses `names` (the built-in handlers' names): what the fork's code and a program's
 * `register` get, while the service registers its own on the registry itself.
 */
export function reservingNames(registry: ReactionRegistry, names: readonly string[], reason: string): ReactionRegistry {
  const reserved = new Set(names)
  const guarded: ReactionRegistry = {
    on(pattern, name, handler, options) {
      if (reserved.has(name)) {
        throw new ReactionSetupError('reaction_name_reserved', `reaction handler name ${shown(name)} is reserved: ${reason}; choose another`)
      }
      registry.on(pattern, name, handler, options)
      return guarded
    },
    handlersFor: (type) => registry.handlersFor(type),
    handler: (name) => registry.handler(name),
    timeoutOf: (name) => registry.timeoutOf(name),
    typesOf: (name) => registry.typesOf(name),
    get names() {
      return registry.names
    },
  }
  return guarded
}

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
      // (typed for a fork's code; checked here for a JavaScript caller, a cast, or a pattern built at run time)
      if (typeof name !== 'string' || !NAME.test(name)) {
        throw new ReactionSetupError('reaction_name_invalid', `reaction handler name ${shown(name)} must match [a-z0-9_.-]+`)
      }
      const patterns: readonly string[] = typeof pattern === 'string' ? [pattern] : [...pattern]
      if (patterns.length === 0) throw new ReactionSetupError('reaction_pattern_invalid', `reaction handler ${name} is registered for no pattern`)
      for (const one of patterns) {
        if (typeof one !== 'string' || !PATTERN.test(one)) {
          throw new ReactionSetupError('reaction_pattern_invalid', `reaction pattern ${shown(one)} of handler ${name} must be 'trade.<status>' or 'trade.*'`)
        }
        // as FORWARD_EVENTS is checked (config.ts): a status the table does not know would get no event of a known
        // status, and a misspelt one none at all, the handler never running without a word
        if (one !== 'trade.*' && !isKnownStatus(one.slice('trade.'.length))) {
          throw new ReactionSetupError(
            'reaction_status_unknown',
            `reaction pattern ${shown(one)} of handler ${name} matches no event type; the types are ${KNOWN_TYPES.join(', ')}, or trade.* ` +
              '(add a status the platform sends to the table in src/orders/trade-status.ts first)',
          )
        }
      }
      if (entries.has(name)) throw new ReactionSetupError('reaction_name_taken', `a reaction handler named ${name} is already registered`)
      if (typeof handler !== 'function') throw new ReactionSetupError('reaction_handler_invalid', `reaction handler ${name} is not a function`)
      // (past a timer's longest wait, Node fires it after 1 ms: every call would time out at once)
      if (timeoutMs !== undefined && !(Number.isFinite(timeoutMs) && timeoutMs > 0 && timeoutMs <= MAX_TIMER_MS)) {
        throw new ReactionSetupError(
          'reaction_timeout_invalid',
          `reaction handler ${name}: timeoutMs must be a positive number of milliseconds, at most ${MAX_TIMER_MS} (a timer's longest wait)`,
        )
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
