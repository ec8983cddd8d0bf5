// A DBA may cap how many sessions a role opens (ALTER ROLE … CONNECTION LIMIT n), or a database's other
// applications may hold most of max_connections. A pool allowed more than the server lets it open got 53300 for
// each connection past the cap, and the statement that waited for it was answered 503, though connections the
// pool held were given back a moment later.
import { randomBytes } from 'node:crypto'
import { sql } from 'kysely'
import pg from 'pg'
import { expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { createApp } from '../src/http/app.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { logEntries, testLogger } from './helpers/log-sink.js'
import { createOrder } from './helpers/orders.js'
import { testConfig } from './helpers/test-config.js'
import { describePostgres, postgresUrl } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

describePostgres('a role allowed fewer connections than the pool (Postgres)', () => {
  it('waits for a connection the pool holds rather than answering 503, and says once what it keeps', async () => {
    const role = `capped_${randomBytes(4).toString('hex')}`
    const admin = new pg.Client({ connectionString: postgresUrl })
    await admin.connect()
    await admin.query(`create role ${role} login connection limit 3`)
    await admin.query(`create schema ${role} authorization ${role}`)
    const url = new URL(postgresUrl!)
    url.username = role
    url.searchParams.set('options', `-c search_path=${role}`)
    const config = testConfig()
    const logger = testLogger(config.webhook.secrets)
    const database = openDatabase({ databaseUrl: url.toString(), poolSize: 10, logger })
    try {
      await migrateToLatest(database.db)
      const app = createApp({ config, db: database.db, logger, clock: systemClock })
      const references = Array.from({ length: 40 }, (_, n) => `capped-${n}`)
      for (const reference of references) await createOrder(database.db, { externalReference: reference })
      const before = logEntries().length
      // statements that hold connections a while (an operator's console, a prune pass) beside deliveries: more at
      // once than the role may open
      const [slow, answers] = await Promise.all([
        Promise.allSettled(Array.from({ length: 6 }, () => sql`select pg_sleep(0.2)`.execute(database.db))),
        Promise.all(references.map((reference) => sendWebhook(app, { body: tradePayload(reference, 'funded') }))),
      ])
      expect(slow.map((outcome) => outcome.status)).toEqual(slow.map(() => 'fulfilled'))
      expect(answers.map((answer) => answer.status)).toEqual(references.map(() => 200))
      for (const reference of references)
        expect(await findOrderByExternalReference(database.db, reference)).toMatchObject({ tradeStatus: 'funded' })
      const capped = logEntries()
        .slice(before)
        .filter((entry) => typeof entry.msg === 'string' && entry.msg.startsWith('the database refused a connection past'))
      expect(capped).toEqual([expect.objectContaining({ level: 40, poolSize: 10, code: '53300' })])
      expect(database.poolStats().total).toBeLessThanOrEqual(3)
    } finally {
      await database.close()
      await admin.query(`drop schema if exists ${role} cascade`)
      await admin.query(`drop role if exists ${role}`)
      await admin.end()
    }
  })
})
