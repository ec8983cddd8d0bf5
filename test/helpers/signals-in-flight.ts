// Stop signals to a trade command run as its own process (startedCli) while its call is held at the platform
// (helpers/holding-platform.ts), as src/cli/hold-signals-for-call.ts takes them: the first waits for the answer, a
// second stops waiting, and the call ends as a timeout does, its outcome not known, exit 130. The shapes the trade,
// dispute and proposal commands' tests share (test/trades-cli-interrupt.test.ts,
// test/disputes-proposals-interrupt-process.test.ts).
import { expect } from 'vitest'
import type { startedCli } from './cli-process.js'
import type { HeldRequest } from './holding-platform.js'
import { eventually } from './reconcile-poller.js'

type Run = ReturnType<typeof startedCli>
type Ended = Awaited<ReturnType<Run['ended']>>

/** The first signal's line while the call is at the platform. */
export const FIRST_IN_FLIGHT =
  'waiting for the platform’s answer to the call in flight, to record it and say what was recorded (a second Ctrl-C ' +
  'stops waiting: what the platform did is then not known)\n'

/** EXPECTED_WEBHOOK_S's default: a call whose outcome is unknown has its order polled this much later. */
export const EXPECTED_WEBHOOK_MS = 600_000

/** Waits until `run` has written `text` to stderr, failing if it ends first. */
export function says(run: Run, text: string): Promise<void> {
  return eventually(() => {
    if (run.closed()) throw new Error(`the command ended before saying "${text}":\n${run.stderr()}`)
    return run.stderr().includes(text)
  }, `the command says "${text}"`, 120_000)
}

/**
 * Two signals while `request` is held at the platform: the first, once its line is said, then a second, which the
 * platform sees as its connection closed with no answer taken. How the command ended, once it has.
 */
export async function stopWaitingAtASecondSignal(run: Run, request: HeldRequest): Promise<Ended> {
  run.child.kill('SIGINT')
  await says(run, FIRST_IN_FLIGHT)
  run.child.kill('SIGTERM')
  await request.abandoned
  return run.ended()
}

/**
 * A wait the second signal abandoned: nothing printed, the first signal's line, then the timeout's words (`unknown`,
 * the command's own on a call whose outcome is not known) after the stop's, exit 130.
 */
export function expectStoppedWaiting(ended: Ended, unknown: string): void {
  expect({ code: ended.code, signal: ended.signal }, ended.stderr.slice(-2_000)).toEqual({ code: 130, signal: null })
  expect(ended.stdout).toBe('')
  expect(ended.stderr).toBe(`${FIRST_IN_FLIGHT}Stopped waiting for the platform’s answer (a second stop signal). ${unknown} [outcome_unknown]\n`)
}

/** An order polled EXPECTED_WEBHOOK_S after a call that ended between `before` and `after` (not at its old next poll). */
export function expectPolledAfterTheCall(nextPollAt: Date | null, { before, after }: { before: number; after: number }, label: string): void {
  expect(nextPollAt?.getTime(), label).toBeGreaterThanOrEqual(before + EXPECTED_WEBHOOK_MS - 1_000)
  expect(nextPollAt?.getTime(), label).toBeLessThanOrEqual(after + EXPECTED_WEBHOOK_MS + 1_000)
}
