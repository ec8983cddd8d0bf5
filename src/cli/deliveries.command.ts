// `deliveries list|show|reapply`: the webhooks as received, and re-running one's effect.
//
// `reapply` takes one delivery and re-runs it in one transaction, so nothing is ever half-written. Run on its own
// (not inside a service), it still holds the first SIGINT, SIGTERM or SIGHUP as `prune` and `reconcile --once`
// do: a signal before the delivery is reapplied stops the command there, one while it is lets it finish (a lock
// wait on Postgres, or PGlite writing) and print what it did; either way it exits 130. A second signal ends the
// process at once, and an open transaction is then rolled back.
import type { Command } from 'commander'
import { InvalidArgumentError } from 'commander'
import { WEBHOOK_OUTCOMES } from '../webhooks/delivery-outcome.js'
import { printable } from '../printable.js'
import { quoteForShell } from '../quote-for-shell.js'
import { deliveryIdArgument, listLimit, MAX_LIST_LIMIT, orderReference } from './cli-arguments.js'
import { commitInFlight } from '../db/commit-in-flight.js'
import {
  CommandFailedError,
  markTookEffect,
  printJson,
  printTable,
  runsInService,
  setExitCode,
  stoppedWhileCommitting,
  UsageError,
  withDatabase,
  write,
  writeError,
} from './cli-context.js'

// (a poll's lease_lost is never a stored delivery's)
const OUTCOMES: readonly string[] = WEBHOOK_OUTCOMES

function outcome(value: string): string {
  if (!OUTCOMES.includes(value)) throw new InvalidArgumentError(`must be one of ${OUTCOMES.join(', ')}`)
  return value
}

function sha256Prefix(value: string): string {
  if (!/^[0-9a-fA-F]{4,64}$/.test(value)) throw new InvalidArgumentError('must be 4 to 64 hex digits of the body’s SHA-256')
  return value.toLowerCase()
}

function deliveryNotFound(deliveryId: string, bodySha256: string | undefined): CommandFailedError {
  return new CommandFailedError(
    'delivery_not_found',
    `No delivery ${printable(deliveryId)}${bodySha256 ? ` with body SHA-256 ${bodySha256}…` : ''}`,
  )
}

const BODY_OPTION = ['--body-sha256 <hex>', 'when the id was reused for several bodies: the one whose SHA-256 starts so'] as const

export function registerDeliveriesCommands(deliveries: Command): void {
  deliveries
    .command('list')
    .description('list deliveries, newest first')
    .option('--outcome <outcome>', `only this outcome (${OUTCOMES.join(', ')})`, outcome)
    .option('--limit <n>', `how many (at most ${MAX_LIST_LIMIT})`, listLimit, 50)
    .option('--json', 'print as JSON')
    .action(async (options: { outcome?: string; limit: number; json?: boolean }) => {
      const { listDeliveries } = await import('../webhooks/delivery.repository.js')
      await withDatabase(async ({ db }) => {
        const found = await listDeliveries(db, { outcome: options.outcome, limit: options.limit })
        if (options.json) printJson(found)
        else
          printTable(
            found.map((delivery) => ({
              delivery: delivery.deliveryId,
              received: delivery.receivedAt,
              event: delivery.eventType,
              body: delivery.bodySha256.slice(0, 12),
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
    .argument('<delivery-id>', 'the X-Partner-Delivery-Id', deliveryIdArgument)
    .option(...BODY_OPTION, sha256Prefix)
    .option('--json', 'print as JSON')
    .action(async (deliveryId: string, options: { json?: boolean; bodySha256?: string }) => {
      const [{ countBodiesOfDelivery, findDelivery }, { invalidReason }] = await Promise.all([
        import('../webhooks/delivery.repository.js'),
        import('../webhooks/invalid-reason.js'),
      ])
      await withDatabase(async ({ db, config }) => {
        const delivery = await findDelivery(db, deliveryId, options.bodySha256)
        if (!delivery) throw deliveryNotFound(deliveryId, options.bodySha256)
        const bodies = await countBodiesOfDelivery(db, deliveryId)
        // rawBody null: pruned by retention (the row and its hash stay)
        const pruned = delivery.rawBody === null ? { bodyPrunedAfterDays: config.retention.bodyDays } : {}
        // not stored: read again from the body by the checks that refused it, unknown once the body is pruned
        const invalid =
          delivery.outcome === 'invalid' ? { invalidReason: delivery.rawBody === null ? null : invalidReason(delivery.rawBody) } : {}
        if (options.json) printJson({ ...delivery, ...invalid, ...pruned, bodiesUnderThisId: bodies })
        else {
          const prunedNote = `(pruned: raw bodies are kept ${config.retention.bodyDays} days)`
          const { rawBody, ...fields } = delivery
          // the reason above the raw body, which stays last
          const shown = { ...fields, ...invalid, rawBody }
          write(
            Object.entries(shown)
              .map(([key, value]) => {
                if (key === 'rawBody') return `${key.padEnd(18)} ${value === null ? prunedNote : value}`
                if (key === 'invalidReason' && value === null) return `${key.padEnd(18)} (not known: the raw body it is read from was pruned)`
                // a field on its line; the raw body, last, keeps its own lines
                return `${key.padEnd(18)} ${value instanceof Date ? value.toISOString() : printable(String(value ?? '-'))}`
              })
              .join('\n') + '\n',
          )
          if (bodies > 1) write(`(this id was reused: ${bodies} bodies stored; pick one with --body-sha256, see \`deliveries list\`)\n`)
        }
      })
    })

  deliveries
    .command('reapply')
    .description(
      're-run the effect of a stored delivery: a trade event’s on its order (after an operator fixed a mapping or created the order), a seller or buyer event’s handlers',
    )
    .argument('<delivery-id>', 'the X-Partner-Delivery-Id', deliveryIdArgument)
    .option(...BODY_OPTION, sha256Prefix)
    .option('--json', 'print the result as JSON')
    .action(async (deliveryId: string, options: { json?: boolean; bodySha256?: string }) => {
      const [
        { countBodiesOfDelivery, findDelivery },
        { reapplyDelivery, rerunsEventHandlers },
        { observationSettings },
        { stopOnSignals },
        { loggableDeliveryId },
        { invalidReason },
      ] = await Promise.all([
        import('../webhooks/delivery.repository.js'),
        import('../webhooks/parked-deliveries.js'),
        import('../orders/observations.js'),
        import('../stop-signals.js'),
        import('../webhooks/delivery-id.js'),
        import('../webhooks/invalid-reason.js'),
      ])
      // held from before the database opens until it is closed: no signal in between ends the process unannounced
      let signalled = false
      // a seller or buyer event's handlers running again: no transaction of ours, the handlers' own work
      let handlersRunning = false
      const off = runsInService()
        ? () => {}
        : stopOnSignals(
            () => {
              signalled = true
              if (handlersRunning) {
                writeError(
                  "stopping once the delivery's handlers return (a second Ctrl-C ends the process now, in the middle of a handler: " +
                    `what it did by then is its own to tell, and \`deliveries show ${quoteForShell(deliveryId)}\` shows whether the delivery was recorded applied)\n`,
                )
                return
              }
              // a second signal's end rolls the transaction back only until its COMMIT is sent (commit-in-flight.ts)
              writeError(
                'stopping after the delivery in flight, if any (a second Ctrl-C ends the process now: before its COMMIT is sent, ' +
                  'its transaction is rolled back, nothing written; once it is sent, whether the reapply was made is not known, ' +
                  `and \`deliveries show ${quoteForShell(deliveryId)}\` tells)\n`,
              )
            },
            () => {
              if (handlersRunning) {
                writeError(
                  `Stopped by a second signal while delivery ${printable(deliveryId)}'s handlers ran: what they did by then is their own to ` +
                    `tell; \`deliveries show ${quoteForShell(deliveryId)}\` shows whether the delivery was recorded applied [stopped]\n`,
                )
                process.exit(130)
              }
              // its COMMIT sent: the end of the process no longer rolls it back (commit-in-flight.ts)
              if (!commitInFlight()) return
              writeError(
                `${stoppedWhileCommitting({ change: `the reapply of ${printable(deliveryId)}`, see: `\`deliveries show ${quoteForShell(deliveryId)}\` shows its outcome` })}\n`,
              )
              process.exit(130)
            },
          )
      try {
        await withDatabase(async ({ db, config, reactions, eventHandlers, logger }) => {
          const delivery = await findDelivery(db, deliveryId, options.bodySha256)
          if (!delivery) throw deliveryNotFound(deliveryId, options.bodySha256)
          // an id reused with other bodies names several deliveries: re-running the first found, unsaid, may re-run
          // a body the operator did not mean (another status of another trade)
          const bodies = options.bodySha256 === undefined ? await countBodiesOfDelivery(db, deliveryId) : 1
          if (bodies > 1) {
            throw new UsageError(
              `Delivery ${printable(deliveryId)} was reused: ${bodies} bodies are stored under it; pick one with --body-sha256 ` +
                '(`deliveries list` shows each body hash); nothing was reapplied',
            )
          }
          if (signalled) {
            writeError(`stopped by a signal before ${printable(deliveryId)} was reapplied: nothing done\n`)
            setExitCode(130)
            return
          }
          // from here the transaction runs to its end whatever signal comes first
          logger.debug({ ...loggableDeliveryId(deliveryId), bodySha256: delivery.bodySha256 }, 'reapplying a delivery')
          handlersRunning = rerunsEventHandlers(delivery, eventHandlers)
          const result = await reapplyDelivery(
            db,
            delivery,
            observationSettings(config, reactions.handlersFor),
            new Date(),
            { handlers: eventHandlers, logger },
          )
          if (result.kind === 'reapplied' || result.kind === 'handlers_run') {
            await markTookEffect({ done: 'the delivery was reapplied', see: 'see its outcome with `deliveries show`' })
          }
          if (result.kind === 'invalid') {
            const why = delivery.rawBody === null ? ' (why is not known: its raw body was pruned)' : `: ${printable(invalidReason(delivery.rawBody))}`
            throw new CommandFailedError(
              'invalid_delivery',
              `Delivery ${printable(deliveryId)} (${printable(result.eventType)}) was stored as invalid${why}. Nothing of an invalid ` +
                "payload is applied, so there is no effect to re-run: the trade's status comes with the platform's next delivery, or its order's next poll",
            )
          }
          const shownType = printable(delivery.eventType)
          if (result.kind === 'not_a_trade_event') {
            throw new CommandFailedError(
              'not_a_trade_event',
              `Delivery ${printable(deliveryId)} is a ${shownType} event, and no event handler takes it (registerEventHandlers, ` +
                'src/webhooks/partner-event-handlers.ts): only trade events and the events a handler takes have an effect to re-run',
            )
          }
          if (result.kind === 'body_pruned') {
            throw new CommandFailedError(
              'body_pruned',
              `Delivery ${printable(deliveryId)} (${shownType}) has no body any more (pruned RETENTION_DAYS after its receipt): ` +
                'its event handlers have nothing to run on',
            )
          }
          if (result.kind === 'handler_failed') {
            throw new CommandFailedError(
              'event_handler_failed',
              `The handler for ${shownType} failed again on delivery ${printable(deliveryId)} (its error is logged with the delivery id): ` +
                `the delivery stays stored as ${delivery.outcome}; reapply it again once what failed is put right`,
            )
          }
          const handlersRan = result.kind === 'handlers_run'
          const { kind: _kind, ...shown } = result
          if (options.json) printJson({ deliveryId, ...shown })
          else {
            const detail = handlersRan
              ? ` (${shownType}: ${result.handlers === 1 ? 'its handler' : `its ${result.handlers} handlers`} ran again)`
              : result.toStatus
                ? ` (order status ${result.toStatus})`
                : ''
            write(`${printable(deliveryId)}: ${result.outcome}${detail}\n`)
          }
          if (signalled) {
            const done = handlersRan ? `${printable(deliveryId)}'s handlers ran again` : `${printable(deliveryId)} was reapplied`
            writeError(`stopped by a signal after the delivery in flight: ${done} (above)\n`)
            setExitCode(130)
          }
        })
      } finally {
        off()
      }
    })

  deliveries
    .command('dismiss')
    .description('set aside the deliveries parked for a reference that is not this backend’s: an order made later does not take them, and they leave the parked count and its alert')
    .argument('<external-reference>', 'the reference the parked deliveries carry (deliveries list --outcome unmatched)', orderReference)
    .option('--dry-run', 'count them, change nothing')
    .option('--json', 'print the result as JSON')
    .action(async (externalReference: string, options: { dryRun?: boolean; json?: boolean }) => {
      const { dismissParkedDeliveries } = await import('../webhooks/delivery.repository.js')
      await withDatabase(async ({ db, logger }) => {
        const dryRun = options.dryRun === true
        const result = await dismissParkedDeliveries(db, externalReference, { dryRun })
        const shown = printable(externalReference)
        if ('orderExists' in result) {
          throw new CommandFailedError(
            'order_exists',
            `An order has the reference ${shown}: its deliveries are applied, not dismissed (deliveries reapply re-runs one)`,
          )
        }
        if (result.dismissed === 0) throw new CommandFailedError('not_found', `No delivery is parked for ${shown}`)
        if (!dryRun) {
          logger.info({ externalReference, dismissed: result.dismissed }, 'parked deliveries dismissed by an operator')
          await markTookEffect({ done: 'the parked deliveries were dismissed', see: 'see them with `deliveries list --outcome dismissed`' })
        }
        if (options.json) printJson({ externalReference, dismissed: result.dismissed, dryRun })
        else write(`${dryRun ? 'would dismiss' : 'dismissed'} ${result.dismissed} parked ${result.dismissed === 1 ? 'delivery' : 'deliveries'} of ${shown}\n`)
      }, {
        committing: {
          change: 'the dismissal of the parked deliveries',
          see: `\`deliveries dismiss ${quoteForShell(externalReference)} --dry-run\` counts those still parked`,
        },
      })
    })
}
