// How the commands that POST to the platform (`trades open|fund|deliver|release|cancel|milestone`, `disputes open`,
// `proposals create|respond`) hold a stop signal (SIGINT, SIGTERM, SIGHUP) when run on their own; inside a
// service the signals are the service's, which finishes the command.
//
// Such a call may move money or a trade, is sent once and carries no idempotency key: a process killed while it is
// at the platform leaves the operator with no word of what happened. So, as `prune` and `reconcile --once` do:
//   before the call is sent  the first signal stops the command there: nothing sent, exit 130
//   while it is in flight    the first signal waits for the answer, which is recorded and printed as usual, exit
//                            130 (said as "to record it and say what was recorded": a `trades open` answer whose
//                            order is gone or whose create was taken over records nothing, or a flag); a second
//                            stops waiting: the call ends as a timeout does (outcome unknown, the
//                            order left as a timeout leaves it), exit 130, or, its connection not up yet (nothing
//                            written: PartnerStoppedBeforeSentError), as a stop before sending, the order as it was
//   once it has settled      the answer is recorded (one transaction) and printed, exit 130; a call that got no
//                            answer (outcome unknown, as is one answered with a record of something else), was
//                            refused or was not sent is said as that, never as answered, with what the command records of it (CallEnd: the mark of a create as
//                            unknown, the poll brought forward, a create set back) and where to look; an answer
//                            whose record depends on what the recording reads (`trades open`: the order, under its
//                            lock) is said as being decided until it is, then as what the recording found (CallEnd's
//                            deciding and found)
// A third signal once the call has settled ends the process saying what it leaves of the answer's record
// (stoppedAfterTheCall, below), exit 130; one after a second abandoned the wait, before the call has ended, says its
// outcome is not known and nothing of it recorded, exit 130; any other later signal (a second one before the call is
// sent with no write in flight) ends the process at once, as the other commands' second one does. Before the recording transaction's COMMIT is sent, the end of the process rolls it
// back, nothing of the answer recorded; once it is sent, the record may or may not be made (commit-in-flight.ts), and
// the line says where to look (it ended the process without a word, whether the answer was recorded not known).
// What a signal that ends the process leaves: a transaction whose COMMIT was not sent is rolled back by the end of the
// process, but on Postgres a statement outside one (the pending mark of a create, its sent stamp, its setting back)
// runs on without it: a mark that waited on a lock committed once the lock went, after the process had ended. So a
// second signal while such a write is in flight (CallGuard.writing) ends the process saying that the write may or may
// not have been made and where to look, exit 130; and the pending mark of a create says whether the create left
// (open-trade-for-order.ts: a mark is "not sent" until the stamp written as the create leaves), so a mark committed
// after its command ended reads as a create never sent, never as one whose answer was lost.
// A POST is never retried (partner-api-transport.ts), so there is no backoff to cut short: the call in flight is
// its one attempt, and without a second signal the wait ends at PARTNER_API_TIMEOUT_MS at the latest.
import { commitInFlight } from '../db/commit-in-flight.js'
import { PartnerAnswerAbandonedError } from '../partner-api/partner-api-error.js'
import { onStopSignals, type StopSignal } from '../stop-signals.js'
import type { CallEnd, CallGuard } from '../trades/trade-deps.js'
import { writeError } from './cli-context.js'

export interface HeldSignals {
  /** What the trade functions consult (src/trades/trade-deps.ts). */
  guard: CallGuard
  /** True once a stop signal came. */
  stopped(): boolean
  /** Takes the listeners off: from then on a signal does what it does by default. */
  off(): void
}

export function holdSignalsForCall(): HeldSignals {
  let phase: 'before' | 'in_flight' | 'settled' = 'before'
  // how the call ended, once settled
  let end: CallEnd = { outcome: 'answered' }
  let signals = 0
  // the local write before the call that is in flight now, if any (CallGuard.writing)
  let write: { change: string; see: string } | undefined
  // the recording of the platform's answer (CallGuard.recording): under way, then made
  let record: { answer: string; see: string; committed: boolean } | undefined
  const abandon = new AbortController()
  const off = onStopSignals(
    () => {
      signals = 1
      if (phase === 'before') {
        writeError('stopping before the call to the platform is sent (a second Ctrl-C ends the process now)\n')
      } else if (phase === 'in_flight') {
        writeError(
          'waiting for the platform’s answer to the call in flight, to record it and say what was recorded (a second Ctrl-C ' +
            'stops waiting: what the platform did is then not known)\n',
        )
      } else {
        writeError(`${settledLine(end)}\n`)
      }
    },
    (signal: StopSignal) => {
      signals += 1
      if (signals === 2 && phase === 'in_flight') {
        // the call rejects with this reason, and its caller records it as it records a timeout
        abandon.abort(new PartnerAnswerAbandonedError('Stopped waiting for the platform’s answer (a second stop signal)'))
        return
      }
      if (signals === 2 && phase === 'before' && write) {
        writeError(
          `Stopped by a second signal while ${write.change} was in flight: nothing was sent to the platform, and the ` +
            'write may or may not have been made (on Postgres a statement sent runs on without this process); ' +
            `${write.see} [stopped]\n`,
        )
        process.exit(130)
      }
      if (signals === 2 && phase === 'settled') {
        // the call's end is known: ending now would throw its record away for a few milliseconds' wait
        writeError(`${secondSettledLine(end)}\n`)
        return
      }
      if (phase === 'settled') {
        writeError(`${stoppedAfterTheCall(write, record, end)}\n`)
        process.exit(130)
      }
      if (phase === 'in_flight' && abandon.signal.aborted) {
        // the wait was abandoned and the call is ending (not yet settled): its outcome is not known, and nothing of it
        // is recorded yet
        writeError(`${stoppedAfterAbandoning(write)}\n`)
        process.exit(130)
      }
      off()
      process.kill(process.pid, signal)
    },
  )
  return {
    guard: {
      stopRequested: () => signals > 0,
      sending: () => {
        phase = 'in_flight'
        return abandon.signal
      },
      settled: (how) => {
        phase = 'settled'
        end = how
      },
      writing: (what) => {
        write = what
        return () => {
          if (write === what) write = undefined
        }
      },
      recording: (what) => {
        const current = { ...what, committed: false }
        record = current
        return (committed) => {
          if (record !== current) return
          if (committed) current.committed = true
          else record = undefined
        }
      },
    },
    stopped: () => signals > 0,
    off,
  }
}

/**
 * What a third signal once the call has settled says of what it leaves locally. A local write outside a transaction
 * in flight (CallGuard.writing) may or may not be made; the answer's recording transaction (CallGuard.recording) may
 * or may not be made once its COMMIT is sent, is rolled back before, and is made once committed.
 */
function stoppedAfterTheCall(
  write: { change: string; see: string } | undefined,
  recordOfTheCall: { answer: string; see: string; committed: boolean } | undefined,
  end: CallEnd,
): string {
  // what the recording found, once it has decided, says where to look in its case (`trades open`: an order linked to
  // another trade meanwhile, which `trades link` would refuse)
  const record = recordOfTheCall && end.outcome === 'answered' && end.found ? { ...recordOfTheCall, see: end.found.see } : recordOfTheCall
  if (write) {
    return (
      `Stopped by a third signal while ${write.change} was in flight, after ${theCall(end)}: the write may or ` +
      `may not have been made (on Postgres a statement sent runs on without this process); ${write.see} [stopped]`
    )
  }
  if (record?.committed && end.outcome === 'answered' && end.found) {
    // "was recorded" was not true of an answer of which the recording wrote nothing (`trades open`: the order gone)
    return (
      `Stopped by a third signal once the recording of ${record.answer} was committed (${end.found.what}: it recorded ` +
      `${end.found.records}), before that was said; ${record.see} [stopped]`
    )
  }
  if (record?.committed) {
    return `Stopped by a third signal after ${record.answer} was recorded, before it was printed; ${record.see} [stopped]`
  }
  if (record && commitInFlight()) {
    return (
      `Stopped by a third signal while the record of ${record.answer} was being committed: the platform answered, and ` +
      'the record may or may not have been made (its COMMIT was sent and not yet answered; on Postgres the database ' +
      `finishes it without this process); ${record.see} [stopped]`
    )
  }
  if (record) {
    return (
      `Stopped by a third signal before the record of ${record.answer} was committed: the platform answered, and ` +
      `nothing of its answer was recorded (its transaction is rolled back, its COMMIT not sent); ${record.see} [stopped]`
    )
  }
  if (commitInFlight()) {
    return (
      'Stopped by a third signal while a local write was being committed, after the call to the platform: it may or ' +
      'may not have been made (its COMMIT was sent and not yet answered; on Postgres the database finishes it without ' +
      'this process); `orders show` shows the order [stopped]'
    )
  }
  // the call failed (no answer, a refusal) or its answer is not recorded yet: no local write is in flight, and one
  // under way in a transaction is rolled back
  const see = end.outcome === 'answered' ? '' : end.records ? `; ${end.records.see}` : end.deciding ? `; ${end.deciding.see}` : ''
  return (
    `Stopped by a third signal after ${theCall(end)}, with no local write in flight (one under way in a ` +
    `transaction is rolled back, its COMMIT not sent)${see} [stopped]`
  )
}

/** What a call that ended without an answer to record came to, in a few words. */
function endWords(end: CallEnd): string {
  if (end.outcome === 'unknown') return 'its outcome is not known (the platform may or may not have done it)'
  if (end.outcome === 'refused') return 'the platform refused it (nothing was done there)'
  return 'it was not sent (nothing was done there)'
}

/** The call, with what it came to when that was not an answer. */
function theCall(end: CallEnd): string {
  if (end.outcome === 'unknown') return 'the call to the platform, whose outcome is not known'
  if (end.outcome === 'refused') return 'the call to the platform, which it refused'
  if (end.outcome === 'not_sent') return 'the call to the platform, which was not sent'
  return 'the call to the platform'
}

/** What the first signal says once the call has settled: what it came to, and what the command records of it. */
function settledLine(end: CallEnd): string {
  if (end.outcome === 'answered') {
    // what the recording found, once it has decided, or that it is deciding: "recording and printing its answer" was
    // said of a `trades open` answer whose order was gone or whose create another command had taken over
    if (end.found) return `the platform has answered, and ${end.found.what}: recording ${end.found.records} and saying so, then stopping`
    if (end.deciding) return `the platform has answered: reading ${end.deciding} to record its answer, then saying what was recorded and stopping`
    return 'the platform has answered: recording and printing its answer, then stopping'
  }
  // what the recording writes is known only once it has read the order (`trades open` answered with another order's
  // record): "recording the mark" was said of an order gone, or whose create another command had taken over, meanwhile
  if (end.deciding) {
    return (
      `the call to the platform is over, and ${endWords(end)}; ${end.deciding.why}: reading ${end.deciding.reads} to ` +
      `decide what to record, then saying what was recorded and stopping; ${end.deciding.see}`
    )
  }
  const recording = end.records ? `recording ${end.records.change} and saying so, then stopping; ${end.records.see}` : 'saying so, then stopping'
  return `the call to the platform is over, and ${endWords(end)}: ${recording}`
}

/** What the second signal once the call has settled says: what is being recorded, and that a third ends the process. */
function secondSettledLine(end: CallEnd): string {
  if (end.outcome === 'answered') {
    const what = end.found
      ? `, and ${end.found.what}: recording ${end.found.records}`
      : end.deciding
        ? `: reading ${end.deciding} to record its answer`
        : ': recording its answer'
    return (
      `the platform has answered${what} (another Ctrl-C ends the process now: before its COMMIT is ` +
      'sent, nothing of the answer is recorded; once it is sent, whether it was recorded is not known, and the line ' +
      'says where to look)'
    )
  }
  const what = end.records
    ? `: recording ${end.records.change}`
    : end.deciding
      ? `; ${end.deciding.why}: reading ${end.deciding.reads} to decide what to record`
      : ': saying so'
  return `the call to the platform is over, and ${endWords(end)}${what} (another Ctrl-C ends the process now, and says what it leaves)`
}

/**
 * What a third signal says when it comes after a second abandoned the wait for the answer, before the call has ended:
 * the outcome is not known (or, the connection not up yet, nothing was sent), and nothing of it is recorded.
 */
function stoppedAfterAbandoning(write: { change: string; see: string } | undefined): string {
  const writing = write
    ? `; ${write.change} was in flight, and may or may not have been made (on Postgres a statement sent runs on without ` +
      `this process); ${write.see}`
    : ''
  return (
    'Stopped by a third signal after the wait for the platform’s answer was abandoned, before the call had ended: its ' +
    'outcome is not known (the platform may or may not have done it, unless its connection was not up yet), and ' +
    'nothing of it was recorded here (no mark of an unknown outcome, no poll brought forward): check the platform ' +
    `before sending the call again${writing} [stopped]`
  )
}
