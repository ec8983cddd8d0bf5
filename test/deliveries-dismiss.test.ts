// `deliveries dismiss REF`: the deliveries parked for a reference that is not this backend's are set aside. Before,
// the only advice was to silence the parked-delivery alert "for it", which one series per job cannot do: a foreign
// reference kept the alert firing for good, and its rows were never pruned. Over the real database (PGlite, and
// Postgres when TEST_DATABASE_URL is set).
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createApp } from '../src/http/app.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { runPrunePass } from '../src/retention/prune.js'
import { countParkedDeliveries } from '../src/webhooks/delivery.repository.js'
import { runCommand } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const DAY = 86_400_000

describe('deliveries dismiss', () => {
  const database = useTestDatabase()
  const config = testConfig()
  const run = (...args: string[]) => runCommand(['deliveries', ...args], database.db, config)

  const park = async (reference: string, statuses: string[]) => {
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
    for (const [i, status] of statuses.entries()) {
      const response = await sendWebhook(app, { body: tradePayload(reference, status), deliveryId: `${reference}-${i}` })
      expect(response.status).toBe(200)
    }
  }
  const outcomes = async (reference: string) =>
    (await database.db.selectFrom('webhookDeliveries').select('outcome').where('externalReference', '=', reference).execute()).map((row) => row.outcome)

  it('sets aside one reference’s parked deliveries: out of the parked count, not taken by an order made later, pruned by age', async () => {
    await park('foreign-1', ['created', 'funded', 'delivered'])
    await park('mine-later', ['created'])
    expect((await countParkedDeliveries(database.db, new Date())).parked).toBe(4)

    const dry = await run('dismiss', 'foreign-1', '--dry-run', '--json')
    expect([dry.code, JSON.parse(dry.stdout)]).toEqual([0, { externalReference: 'foreign-1', dismissed: 3, dryRun: true }])
    expect(await outcomes('foreign-1')).toEqual(['unmatched', 'unmatched', 'unmatched'])

    const done = await run('dismiss', 'foreign-1')
    expect([done.code, done.stdout, done.stderr]).toEqual([0, 'dismissed 3 parked deliveries of foreign-1\n', ''])
    expect(await outcomes('foreign-1')).toEqual(['dismissed', 'dismissed', 'dismissed'])
    // the other reference's parked delivery stays parked, and is all the alert's gauge counts
    expect((await countParkedDeliveries(database.db, new Date())).parked).toBe(1)
    // a re-apply that finds no order leaves a dismissed delivery dismissed (it parked it again: the alert came back)
    const reapplied = await run('reapply', 'foreign-1-0', '--json')
    expect([reapplied.code, JSON.parse(reapplied.stdout).outcome]).toEqual([0, 'dismissed'])
    expect(await outcomes('foreign-1')).toEqual(['dismissed', 'dismissed', 'dismissed'])
    expect((await countParkedDeliveries(database.db, new Date())).parked).toBe(1)
    expect((await run('list', '--outcome', 'dismissed', '--json')).code).toBe(0)

    // an order made later for the reference does not take them
    expect((await runCommand(['orders', 'create', '--external-reference', 'foreign-1'], database.db, config)).code).toBe(0)
    expect((await findOrderByExternalReference(database.db, 'foreign-1'))?.tradeStatus).toBeNull()
    // while the other reference's order takes its own at once
    expect((await runCommand(['orders', 'create', '--external-reference', 'mine-later'], database.db, config)).code).toBe(0)
    expect((await findOrderByExternalReference(database.db, 'mine-later'))?.tradeStatus).toBe('created')

    // retention deletes dismissed rows by age, as any other; parked ones never by age (a pass counts ages by the
    // database's clock when this machine's is ahead: the rows are made old instead)
    await park('still-parked', ['created'])
    await database.db
      .updateTable('webhookDeliveries')
      .set({ receivedAt: new Date(Date.now() - 91 * DAY) })
      .where('externalReference', 'in', ['foreign-1', 'still-parked'])
      .execute()
    await runPrunePass({ db: database.db, holdLock: database.holdLock, clock: systemClock }, { bodyDays: 30, deliveryDays: 90, batchSize: 100, pauseMs: 0 })
    expect(await outcomes('foreign-1')).toEqual([])
    expect(await outcomes('still-parked')).toEqual(['unmatched'])
  })

  it('refuses a reference an order has, and one with nothing parked, changing nothing', async () => {
    await park('has-order', ['created'])
    expect((await runCommand(['orders', 'create', '--external-reference', 'has-order'], database.db, config)).code).toBe(0)
    const refused = await run('dismiss', 'has-order')
    expect(refused.code).toBe(1)
    expect(refused.stderr).toBe(
      'An order has the reference has-order: its deliveries are applied, not dismissed (deliveries reapply re-runs one) [order_exists]\n',
    )
    expect(await outcomes('has-order')).toEqual(['applied'])

    const none = await run('dismiss', 'nothing-here\u001b[2J')
    expect([none.code, none.stderr]).toEqual([1, 'No delivery is parked for nothing-here\\u001b[2J [not_found]\n'])
  })
})
