// `orders create|show|list`: the partner's orders as the service keeps them.
import type { Command } from 'commander'
import type { PartnerEnv } from '../config.js'
import { linkedElsewhere, unsentCreate } from '../orders/order.js'
import { printable } from '../printable.js'
import { quoteForShell } from '../quote-for-shell.js'
import { invalidOrder, listLimit, MAX_LIST_LIMIT, orderReference } from './cli-arguments.js'
import { CommandFailedError, markTookEffect, printJson, printTable, withDatabase, write } from './cli-context.js'
import { orderJson } from './order-json.js'

export function registerOrdersCommands(orders: Command): void {
  orders
    .command('create')
    .description('create an order; webhooks parked for its reference are applied at once')
    .requiredOption('--external-reference <ref>', 'the order’s own id, sent to the platform as external_reference', orderReference)
    .option('--json', 'print the order as JSON')
    .action(async (options: { externalReference: string; json?: boolean }) => {
      const [{ createOrder }, { OrderExistsError }, { observationSettings }, { PartnerValidationError }] = await Promise.all([
        import('../orders/create-order.js'),
        import('../orders/order.repository.js'),
        import('../orders/observations.js'),
        import('../partner-api/partner-api-error.js'),
      ])
      await withDatabase(async ({ db, config, reactions }) => {
        try {
          const { order, appliedDeliveries, parkedDeliveries } = await createOrder(
            db,
            {
              externalReference: options.externalReference,
              now: () => new Date(),
              // committed: an output lost from here loses only its report (output-gone.ts), and a stop signal during
              // the second pass over parked deliveries (commits of their own) lets it finish, as the order exists
              onCreated: () => markTookEffect({ done: 'the order was created', see: 'see it with `orders show`' }),
            },
            observationSettings(config, reactions.handlersFor),
          )
          if (options.json) printJson({ ...orderJson(order), appliedDeliveries, parkedDeliveries })
          else {
            write(`created order ${printable(order.externalReference)} (id ${order.id})\n`)
            // each parked delivery's own outcome, as `deliveries reapply` says it: one may be a trade_mismatch
            // (its trade already another order's) and leave the order without a status
            for (const parked of parkedDeliveries) {
              const status = parked.toStatus ? ` (order status ${parked.toStatus})` : ''
              write(`parked webhook ${printable(parked.deliveryId)}: ${parked.outcome}${status}\n`)
            }
          }
        } catch (error) {
          if (error instanceof PartnerValidationError) throw invalidOrder(error)
          if (!(error instanceof OrderExistsError)) throw error
          throw new CommandFailedError(error.code, `An order with external reference ${printable(options.externalReference)} already exists`)
        }
      }, {
        committing: {
          change: "the order's creation",
          see: `\`orders show ${quoteForShell(options.externalReference)}\` says whether the order exists`,
        },
      })
    })

  orders
    .command('show')
    .description('show one order: current status, trade, and its status history')
    .argument('<external-reference>', 'the order’s external reference', orderReference)
    .option('--json', 'print as JSON')
    .action(async (externalReference: string, options: { json?: boolean }) => {
      const { findOrderByExternalReference, orderHistory } = await import('../orders/order.repository.js')
      await withDatabase(async ({ db, config }) => {
        const order = await findOrderByExternalReference(db, externalReference)
        if (!order) throw new CommandFailedError('order_not_found', `No order with external reference ${printable(externalReference)}`)
        const history = await orderHistory(db, order.id)
        if (options.json) {
          printJson({ ...orderJson(order), history })
          return
        }
        write(
          [
            `order      ${printable(order.externalReference)} (id ${order.id})`,
            `status     ${printable(order.tradeStatus ?? '-')}${order.statusSource ? ` (by ${order.statusSource})` : ''}`,
            `trade      ${printable(order.tradeId ?? '-')} ${printable(order.tradeReference ?? '')}`.trimEnd(),
            `create     ${order.tradeCreateState}${unsentCreate(order) ? ' (marked, not sent)' : ''}`,
            ...(order.tradeId === null ? [] : [`env        ${environmentOf(order, config.partner.env)}`]),
            `next poll  ${order.nextPollAt?.toISOString() ?? '-'}`,
            ...(order.attention ? [`attention  ${order.attention}`] : []),
            'history',
          ].join('\n') + '\n',
        )
        printTable(
          history.map((change) => ({
            at: change.recordedAt,
            from: change.fromStatus,
            to: change.toStatus,
            source: change.source,
            delivery: change.deliveryId,
          })),
          '  (no status yet)',
        )
      })
    })

  orders
    .command('list')
    .description('list orders, newest first')
    .option('--limit <n>', `how many (at most ${MAX_LIST_LIMIT})`, listLimit, 50)
    .option('--json', 'print as JSON')
    .action(async (options: { limit: number; json?: boolean }) => {
      const { listOrders } = await import('../orders/order.repository.js')
      await withDatabase(async ({ db }) => {
        const found = await listOrders(db, { limit: options.limit })
        if (options.json) printJson(found.map(orderJson))
        else
          printTable(
            found.map((order) => ({
              reference: order.externalReference,
              status: order.tradeStatus,
              trade: order.tradeId,
              env: order.partnerEnv,
              source: order.statusSource,
              nextPoll: order.nextPollAt,
              attention: order.attention,
            })),
            '(no orders)',
          )
      })
    })
}

/**
 * The platform environment a linked order's trade lives in, as `orders show` says it: one linked under the other
 * PARTNER_ENV is not polled by this one (README, "Going live"); one linked before it was recorded is taken as this one's.
 */
function environmentOf(order: { partnerEnv: PartnerEnv | null }, current: PartnerEnv): string {
  if (order.partnerEnv === null) return `${current} (not recorded: linked before it was kept, taken as PARTNER_ENV's)`
  const elsewhere = linkedElsewhere(order, current)
  return elsewhere ? `${elsewhere} (not polled nor moved while PARTNER_ENV=${current})` : order.partnerEnv
}
