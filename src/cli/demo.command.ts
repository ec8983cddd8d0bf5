import type { Command } from 'commander'
import { stopOnSignals, untilStopSignal } from '../stop-signals.js'
import { demoTrades, MAX_DEMO_TRADES, portNumber, wholeNumber } from './cli-arguments.js'
import { setExitCode, write, writeError } from './cli-context.js'

export function registerDemoCommand(demo: Command): void {
  demo
    .option('--trades <n>', `how many trades (at most ${MAX_DEMO_TRADES})`, demoTrades, 50)
    // any whole number, as the sandbox's --seed: the fault injection's random source takes 0 too
    .option('--seed <n>', 'seed of the injected faults', wholeNumber, 7)
    .option('--json', 'print the report as JSON')
    .option('--console', 'afterwards, keep the operator console open on what the run left (the default on a terminal)')
    .option('--no-console', 'end as soon as the report is printed (the default when piped)')
    .option('--console-port <n>', 'the console\'s port (default: a free one)', portNumber)
    .action(async (options: { trades: number; seed: number; json?: boolean; console?: boolean; consolePort?: number }) => {
      // the run is under way from here: a stop signal ends it, said so (it ended killed by the signal without a word);
      // its database is in memory, so nothing of it is left behind
      const stopRun = stopOnSignals(() => {
        writeError('Stopped by a signal during the demo run: no report; its database was in memory, nothing is kept [stopped]\n')
        process.exit(130)
      })
      const out = options.json ? process.stderr : process.stdout
      const keepConsole = options.console ?? (process.stdout.isTTY === true && !options.json)
      // a console port another process holds is said now, not after the whole run
      if (keepConsole && options.consolePort) {
        const { probeListenTargets } = await import('../probe-listen-targets.js')
        await probeListenTargets([{ portSetting: '--console-port', hostSetting: 'the console host', port: options.consolePort, host: '127.0.0.1' }])
      }
      // at once, before the demo's modules load (seconds under tsx)
      out.write(`demo: starting ${options.trades} trades…\n`)
      const { formatDemoReport, runDemo } = await import('../demo/run-demo.js')
      const report = await runDemo({
        trades: options.trades,
        seed: options.seed,
        out,
        keepConsole,
        // a free port unless told: a service started with npm start may hold ADMIN_PORT
        consolePort: options.consolePort ?? 0,
      })
      stopRun()
      const { console: demoConsole, ...printed } = report
      write(options.json ? `${JSON.stringify(printed, null, 2)}\n` : formatDemoReport(report))
      // the demo is a check too: an order that does not match the platform, or a transition the forwarder's
      // receiver did not get once, fails it
      const unforwarded = report.rows.some((row) => row.forwarded !== row.transitions) || report.forward.invalid > 0
      if (report.mismatches.length > 0 || unforwarded) setExitCode(1)
      if (demoConsole) {
        out.write(
          [
            '',
            `console   ${demoConsole.url}   (log in with the admin token: ${demoConsole.token})`,
            '          what this run left is under "Needs a human": retry the failed reactions, re-apply or inspect the',
            '          parked delivery, look at the flagged order. The database is in memory: Ctrl-C ends it all.',
            '',
          ].join('\n'),
        )
        await untilStopSignal()
        await demoConsole.close()
      }
    })
}
