// `proposals create|respond`: resolve a dispute the only way the API allows, by a proposal one party makes
// and the other accepts (accepting splits the funds at once; no release step follows).
import type { Command } from 'commander'
import type { Party, ProposalOutcome } from '../partner-api/types.js'
import { printable } from '../printable.js'
import { quoteForShell } from '../quote-for-shell.js'
import { orderReference } from './cli-arguments.js'
import { escaped, printJson, UsageError, write } from './cli-context.js'
import { pollOnlyRecorded, runTradeCall } from './trades.command.js'

/** The order's reference as a word of a command to copy: quoted for a shell where it needs it, on one line. */
const shellWord = (reference: string) => printable(quoteForShell(reference))

export function registerProposalsCommands(proposals: Command): void {
  proposals
    .command('create')
    .description('propose an outcome for the open dispute')
    .argument('<reference>', 'the order’s external reference', orderReference)
    .requiredOption('--party <party>', 'the side that proposes: buyer or seller')
    .requiredOption('--outcome <outcome>', 'buyer_win, seller_win or split')
    .option('--split-buyer-pct <pct>', 'buyer’s share for a split, a decimal from 0 to 100')
    .option('--json', 'print the proposal record as JSON')
    .action(
      async (
        reference: string,
        options: { party: string; outcome: string; splitBuyerPct?: string; json?: boolean },
      ) => {
        const { runTradeOperation } = await import('../trades/run-trade-operation.js')
        await runTradeCall(
          (deps) =>
            runTradeOperation(deps, reference, {
              kind: 'proposal',
              request: {
                outcome: options.outcome as ProposalOutcome,
                party: options.party as Party,
                ...(options.splitBuyerPct !== undefined && { split_buyer_pct: options.splitBuyerPct }),
              },
            }),
          (proposal) => {
            if (options.json) printJson({ proposal })
            else write(escaped`${reference}: proposal ${proposal.proposal_id} (${proposal.outcome ?? '?'}) is ${proposal.status ?? '?'}\n`)
          },
          {
            // the call has no idempotency key: sent again, a proposal that was made is made twice
            unknownOutcome:
              `The proposal may or may not have been made: \`trades get ${shellWord(reference)}\` lists the dispute's ` +
              'proposals, each with who made it and its status; check there before proposing again, as a second ' +
              '`proposals create` makes a second proposal (the order is polled soon).',
            recorded: () => pollOnlyRecorded('a proposal record'),
          },
        )
      },
    )

  proposals
    .command('respond')
    .description('accept or reject a proposal')
    .argument('<reference>', 'the order’s external reference', orderReference)
    .argument('<proposalId>', 'the platform’s proposal id')
    .requiredOption('--party <party>', 'the side that responds: buyer or seller')
    .option('--accept', 'accept the proposal (the funds are split at once)')
    .option('--reject', 'reject it (the dispute stays open)')
    .option('--json', 'print the proposal and the trade as JSON')
    .action(
      async (
        reference: string,
        proposalId: string,
        options: { party: string; accept?: boolean; reject?: boolean; json?: boolean },
      ) => {
        if (options.accept === options.reject) throw new UsageError('Give exactly one of --accept or --reject')
        const { runTradeOperation } = await import('../trades/run-trade-operation.js')
        await runTradeCall(
          (deps) =>
            runTradeOperation(deps, reference, {
              kind: 'respond',
              proposalId,
              request: { accept: options.accept === true, party: options.party as Party },
            }),
          (result) => {
            if (options.json) printJson(result)
            else {
              write(
                escaped`${reference}: proposal ${result.proposal.proposal_id} is ${result.proposal.status ?? '?'}; ` +
                  escaped`trade ${result.trade.trade_id} is ${result.trade.status}\n`,
              )
            }
          },
          {
            unknownOutcome:
              `The response may or may not have been taken: \`trades get ${shellWord(reference)}\` shows the proposal's ` +
              'status and the trade’s (the order is polled soon).',
          },
        )
      },
    )
}
