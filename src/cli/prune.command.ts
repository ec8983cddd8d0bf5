// `prune [--dry-run]`: one retention pass now, as `serve` runs on its interval (src/retention/prune.ts).
// On Postgres it takes the same advisory lock as the replicas: while one of them is pruning, this says so
// and exits 1 rather than prune alongside it. Run on its own (no service running, or on Postgres), the first
// SIGINT, SIGTERM or SIGHUP stops the pass after the batch in flight, as a replica's shutdown does: what it
// pruned is printed and the exit code is 130; a second one ends the process at once, saying its batch in flight may
// or may not have been pruned (exit 130).
import type { Command } from 'commander'
import { CommandFailedError, markTookEffect, printJson, runsInService, setExitCode, withDatabase, write, writeError } from './cli-context.js'

export function registerPruneCommand(prune: Command): void {
  prune
    .option('--dry-run', 'count what a pass would prune now, change nothing')
    .option('--json', 'print the result as JSON')
    .action(async (options: { dryRun?: boolean; json?: boolean }) => {
      const [{ runPrunePass, prunerSettings }, { systemClock }, { stopOnSignals }] = await Promise.all([
        import('../retention/prune.js'),
        import('../clock.js'),
        import('../stop-signals.js'),
      ])
      await withDatabase(async ({ db, holdLock, vacuum, config, logger, retentionHooks }) => {
        if (!holdLock) throw new Error('prune runs on a database handle (its lock keeps one pass at a time)')
        // inside a running service the signals are the service's, and its shutdown stops its own passes
        const stop = new AbortController()
        // a second signal ended the process without a word, its batch in flight perhaps committed
        const off = runsInService()
          ? () => {}
          : stopOnSignals(
              () => {
                stop.abort()
                writeError('stopping after the batch in flight (a second Ctrl-C ends the process now: that batch may still commit)\n')
              },
              () => {
                writeError(
                  'Stopped by a second signal during a batch: it may or may not have been pruned (on Postgres a statement sent runs on ' +
                    'without this process); the batches before it were; `prune --dry-run` counts what is left [stopped]\n',
                )
                process.exit(130)
              },
            )
        let result: Awaited<ReturnType<typeof runPrunePass>>
        try {
          // run inside a service, the pass feeds its metrics as its own do: retention_rows_pruned_total and the last
          // pass's time, which PartnerEscrowPruningStalled reads (its runbook says to run this command)
          result = await runPrunePass(
            { db, holdLock, vacuum, clock: systemClock, logger, onPruned: retentionHooks?.onPruned },
            prunerSettings(config.retention),
            { dryRun: options.dryRun === true, signal: stop.signal },
          )
          if (result.ran && !result.dryRun && !result.interrupted) retentionHooks?.onPass(new Date(systemClock.now()))
        } finally {
          off()
        }
        // each batch is committed on its own: what the pass counts is pruned, whatever its output then meets
        if (result.ran && !result.dryRun) await markTookEffect({ done: 'what it counts was pruned', see: '`prune --dry-run` counts what is left' })
        if (result.lockLost) {
          // another replica may prune now: this pass stopped rather than run beside it
          writeError(
            'the retention lock was lost with its database connection: stopped after the batch in flight; what was pruned so far is below; the next pass goes on [lock_lost]\n',
          )
          setExitCode(1)
        } else if (result.interrupted) {
          // each batch is its own transaction: what is counted is done, the next pass goes on from there
          writeError('stopped by a signal after the batch in flight: what was pruned so far is below; the next pass goes on\n')
          setExitCode(130)
        }
        if (!result.ran) {
          throw new CommandFailedError(
            'prune_running',
            'Another replica is pruning now (it holds the retention lock): nothing done; try again later',
          )
        }
        if (result.clockAheadS !== undefined) {
          // the pass's own warning goes to the log, which a command shows from errors up only
          writeError(
            `this machine's clock is ${result.clockAheadS} s ahead of the database's: ages were counted by the database's clock (check this machine's clock: NTP)\n`,
          )
        }
        if (options.json) {
          printJson(result)
          return
        }
        const verb = result.dryRun ? 'would prune' : 'pruned'
        write(
          [
            `${verb}: ${result.counts.body} raw bodies (received before ${result.bodiesBefore.toISOString()}, ${config.retention.bodyDays} days)`,
            `${verb}: ${result.counts.delivery} delivery rows (received before ${result.deliveriesBefore.toISOString()}, ${config.retention.deliveryDays} days)`,
            `${verb}: ${result.counts.reaction_job} done reaction jobs (finished before ${result.deliveriesBefore.toISOString()})`,
            `${verb}: ${result.counts.reconcile_run} reconcile runs (started before ${result.deliveriesBefore.toISOString()})`,
          ].join('\n') + '\n',
        )
      })
    })
}
