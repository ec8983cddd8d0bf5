// `deliveries list|show|reapply`: the webhooks as received, and re-running one's effect.
import type { Command } from 'commander'
import { InvalidArgumentError } from 'commander'
import { applyObservation } from '../orders/apply-observation.js'
import { findOrderByExternalReference } from '../orders/order.repository.js'
import { type DeliveryOutcome, findDelivery, listDeliveries, updateDeliveryOutcome } from '../webhooks/delivery.repository.js'
import { classifyDelivery, parseBody } from '../webhooks/parse-delivery.js'
import { positiveInteger } from './cli-arguments.js'
import { printJson, printTable, setExitCode, withDatabase, write, writeError } from './cli-context.js'

const OUTCOMES: DeliveryOutcome[] = ['applied', 'duplicate_effect', 'stale', 'unmatched', 'ignored', 'invalid', 'trade_mismatch']

function outcome(value: string): string {
  if (!(OUTCOMES as string[]).includes(value)) throw new InvalidArgumentError(`must be one of ${OUTCOMES.join(', ')}`)
  return value
}

export function registerDeliveriesCommands(program: Command): void {
  const deliveries = program.command('deliveries').description('webhook deliveries as received: list, show, reapply')

  deliveries
    .command('list')
    .description('list deliveries, newest first')
    .option('--outcome <outcome>', `only this outcome (${OUTCOMES.join(', ')})`, outcome)
    .option('--limit <n>', 'how many', positiveInteger, 50)
    .option('--json', 'print as JSON')
    .action(async (options: { outcome?: string; limit: number; json?: boolean }) => {
      await withDatabase(async ({ db }) => {
        const found = await listDeliveries(db, { outcome: options.outcome, limit: options.limit })
        if (options.json) printJson(found)
        else
          printTable(
            found.map((delivery) => ({
              delivery: delivery.deliveryId,
              received: delivery.receivedAt,
              event: delivery.eventType,
              reference: delivery.externalReference,
              outcome: delivery.outcome,
            })),
            '(no deliveries)',
          )
      })
    })

  deliveries
    .command('show')
    .description('show one delivery, with its raw body (an operator view: it is never logged)')
    .argument('<delivery-id>', 'the X-Partner-Delivery-Id')
    .option('--json', 'print as JSON')
    .action(async (deliveryId: string, options: { json?: boolean }) => {
      await withDatabase(async ({ db }) => {
        const delivery = await findDelivery(db, deliveryId)
        if (!delivery) {
          writeError(`No delivery ${deliveryId}\n`)
          setExitCode(1)
          return
        }
        if (options.json) printJson(delivery)
        else
          write(
            Object.entries(delivery)
              .map(([key, value]) => `${key.padEnd(18)} ${value instanceof Date ? value.toISOString() : (value ?? '-')}`)
              .join('\n') + '\n',
          )
      })
    })

  deliveries
    .command('reapply')
    .description('re-run the effect of a stored trade delivery (after an operator fixed a mapping or created the order)')
    .argument('<delivery-id>', 'the X-Partner-Delivery-Id')
    .option('--json', 'print the result as JSON')
    .action(async (deliveryId: string, options: { json?: boolean }) => {
      await withDatabase(async ({ db, config }) => {
        const delivery = await findDelivery(db, deliveryId)
        if (!delivery) {
          writeError(`No delivery ${deliveryId}\n`)
          setExitCode(1)
          return
        }
        const event = classifyDelivery(parseBody(Buffer.from(delivery.rawBody)).body)
        if (event.kind !== 'trade') {
          writeError(`Delivery ${deliveryId} is a ${event.eventType} event: only trade events have an effect to re-run\n`)
          setExitCode(1)
          return
        }
        const order = await findOrderByExternalReference(db, event.externalReference)
        const now = new Date()
        const result = order
          ? await applyObservation(
              db,
              {
                target: { orderId: order.id },
                tradeId: event.tradeId,
                tradeReference: event.tradeReference,
                externalReference: event.externalReference,
                status: event.status,
                source: 'webhook',
                deliveryId,
                observedAt: now,
              },
              { staleAfterS: config.poll.staleAfterS },
            )
          : { outcome: 'unmatched' as const, orderId: null, fromStatus: null, toStatus: null }
        await updateDeliveryOutcome(db, deliveryId, result.outcome, result.outcome === 'applied' ? now : null)
        if (options.json) printJson({ deliveryId, ...result })
        else write(`${deliveryId}: ${result.outcome}${result.toStatus ? ` (order status ${result.toStatus})` : ''}\n`)
      })
    })
}
