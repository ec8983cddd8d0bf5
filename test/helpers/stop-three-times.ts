// Three stop signals to a trade command run as its own process (src/cli/hold-signals-for-call.ts), each a different
// one (the same signal within a second is taken as npm's copy of the first), each sent once the line of the one before
// is on stderr: the test then asserts the lines whole, once the command has ended.
import type { startedCli } from './cli-process.js'
import { eventually } from './reconcile-poller.js'

export async function stopThreeTimes(run: ReturnType<typeof startedCli>): Promise<void> {
  const saysLine = (count: number) =>
    eventually(() => {
      if (run.closed()) throw new Error(`the command ended before its line ${count}:\n${run.stderr()}`)
      return run.stderr().split('\n').length > count
    }, `the command's line ${count}`, 120_000)
  run.child.kill('SIGINT')
  await saysLine(1)
  run.child.kill('SIGTERM')
  await saysLine(2)
  run.child.kill('SIGHUP')
  await eventually(() => run.closed() !== undefined, 'the command ends', 120_000)
}
