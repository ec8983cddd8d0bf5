// `disputes open`: open a dispute on an order's trade, naming the acting party (the API never infers it).
import type { Command } from 'commander'
import type { Party } from '../partner-api/types.js'
import { orderReference } from './cli-arguments.js'
import { escaped, printJson, write } from './cli-context.js'
import { pollOnlyRecorded, runTradeCall } from './trades.command.js'

export function registerDisputesCommands(disputes: Command): void {
  disputes
    .command('open')
    .description('open a dispute on the order’s trade')
    .argument('<reference>', 'the order’s external reference', orderReference)
    .requiredOption('--party <party>', 'the side that is acting: buyer or seller')
    .requiredOption('--reason <reason>', 'why (at least 20 characters)')
    .option('--category <category>', 'category of the dispute')
    .option('--json', 'print the dispute record as JSON')
    .action(
      async (reference: string, options: { party: string; reason: string; category?: string; json?: boolean }) => {
        const { runTradeOperation } = await import('../trades/run-trade-operation.js')
        await runTradeCall(
          (deps) =>
            runTradeOperation(deps, reference, {
              kind: 'dispute',
              request: {
                reason: options.reason,
                party: options.party as Party,
                ...(options.category !== undefined && { category: options.category }),
              },
            }),
          (dispute) => {
            if (options.json) printJson({ dispute })
            else write(escaped`${reference}: dispute ${dispute.dispute_id} opened by the ${dispute.party ?? '?'} (${dispute.status ?? '?'})\n`)
          },
          { recorded: () => pollOnlyRecorded('a dispute record') },
        )
      },
    )
}
