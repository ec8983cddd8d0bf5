import type { Command } from 'commander'
import { positiveInteger } from './cli-arguments.js'
import { setExitCode, write } from './cli-context.js'

export function registerDemoCommand(program: Command): void {
  program
    .command('demo')
    .description('run ~50 trades of every kind against the sandbox with lost, repeated and reordered webhooks')
    .option('--trades <n>', 'how many trades', positiveInteger, 50)
    .option('--seed <n>', 'seed of the injected faults', positiveInteger, 7)
    .option('--json', 'print the report as JSON')
    .action(async (options: { trades: number; seed: number; json?: boolean }) => {
      const out = options.json ? process.stderr : process.stdout
      // at once, before the demo's modules load (seconds under tsx)
      out.write(`demo: starting ${options.trades} trades…\n`)
      const { formatDemoReport, runDemo } = await import('../demo/run-demo.js')
      const report = await runDemo({ trades: options.trades, seed: options.seed, out })
      write(options.json ? `${JSON.stringify(report, null, 2)}\n` : formatDemoReport(report))
      // the demo is a check too: an order that does not match the platform, or a transition the forwarder's
      // receiver did not get once, fails it
      const unforwarded = report.rows.some((row) => row.forwarded !== row.transitions) || report.forward.invalid > 0
      if (report.mismatches.length > 0 || unforwarded) setExitCode(1)
    })
}
