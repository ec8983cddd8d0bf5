// Outage or bad data (src/db/database-errors.ts): input the database refuses is the sender's fault (400,
// or stored as `invalid` when signed), never a 503; only real unavailability is a 503. On PGlite and on
// Postgres, with real errors from the database rather than made-up ones.
import request from 'supertest'
import { randomBytes } from 'node:crypto'
import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { describeDatabaseError, IngestOverloadedError } from '../src/db/database-errors.js'
import { openDatabase } from '../src/db/open-database.js'
import { createApp } from '../src/http/app.js'
import { findOrderByExternalReference } from '../src/orders/order.repository.js'
import { createOrder } from './helpers/orders.js'
import { freePort } from './helpers/cli-process.js'
import { logLines, taggedLogger, testLogger } from './helpers/log-sink.js'
import { startTcpProxy } from './helpers/tcp-proxy.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, describePostgres, type TestDatabase, useTestDatabase } from './helpers/test-database.js'
import { sendWebhook } from './helpers/webhook-delivery.js'

const config = testConfig({ LOG_LEVEL: 'warn' })
const FIELDS = ['trade_id', 'reference', 'status', 'external_reference', 'event'] as const

// Bodies are written as JSON text: JSON.stringify would keep a lone surrogate escaped the same way, but
// the escapes are spelled out here so the table shows exactly what the platform would send.
function body(externalReference: string, override: Partial<Record<(typeof FIELDS)[number] | 'note', string | undefined>> = {}): string {
  const fields: Record<string, string | undefined> = {
    event: '"trade.funded"',
    trade_id: `"trd_${externalReference}"`,
    reference: '"REF-1"',
    status: '"funded"',
    external_reference: `"${externalReference}"`,
    ...override,
  }
  return `{${Object.entries(fields)
    .filter(([, value]) => value !== undefined)
    .map(([name, value]) => `"${name}":${value}`)
    .join(',')}}`
}

interface Case {
  name: string
  /** The value for `field`, as JSON text. */
  value: string
  field: (typeof FIELDS)[number] | 'note'
  /** What the receiver answers: stored with this outcome (200) or refused (400). */
  expected: 'invalid' | 'applied' | 400
  /** Other fields of the body set (undefined: left out). */
  others?: Partial<Record<(typeof FIELDS)[number], string | undefined>>
}

const CASES: Case[] = [
  // the event keeps its trade. prefix, so the delivery is still read as a trade event
  ...FIELDS.flatMap((field): Case[] => {
    const text = (inner: string) => `"${field === 'event' ? 'trade.' : ''}${inner}"`
    return [
      { name: `a lone high surrogate in ${field}`, field, value: text('x\\ud800y'), expected: 'invalid' },
      { name: `a lone low surrogate in ${field}`, field, value: text('\\udfff'), expected: 'invalid' },
      { name: `a reversed surrogate pair in ${field}`, field, value: text('\\udc00\\ud800'), expected: 'invalid' },
      // Postgres's text holds no NUL: refused as a field (isTradeFact), or by the database as the kind
      { name: `an escaped NUL in ${field}`, field, value: text('a\\u0000b'), expected: 'invalid' },
    ]
  }),
  ...(['trade_id', 'status', 'external_reference'] as const).flatMap((field): Case[] => [
    { name: `a huge number as ${field}`, field, value: '1e400', expected: 'invalid' },
    { name: `a 40-digit integer as ${field}`, field, value: '1234567890123456789012345678901234567890', expected: 'invalid' },
  ]),
  { name: 'a lone surrogate in a field the receiver does not read', field: 'note', value: '"\\ud800"', expected: 'applied' },
  { name: 'a huge number in a field the receiver does not read', field: 'note', value: '-1e999999', expected: 'applied' },
  // six characters of text in the body stored: the event is taken (it was refused 400 at every attempt, and lost)
  { name: 'an escaped NUL in a field the receiver does not read', field: 'note', value: '"line1\\u0000"', expected: 'applied' },
  // an escaped backslash, then `u0000`: text, no NUL (it was refused 400 at every attempt)
  { name: 'an escaped backslash before u0000 in a field the receiver does not read', field: 'note', value: '"C:\\\\u0000"', expected: 'applied' },
  { name: 'an escaped backslash before u0000 in reference', field: 'reference', value: '"REF\\\\u0000"', expected: 'applied' },
  { name: 'an escaped backslash, then an escaped NUL, in a field the receiver does not read', field: 'note', value: '"\\\\\\u0000"', expected: 'applied' },
  // a kind past any index entry's size: the event type is clipped whichever field names it (a status this long was
  // refused 400 at every attempt: its kind, trade.{status}, could not be stored even as invalid)
  { name: 'a status of 8,000 characters with no event', field: 'status', value: `"${'s'.repeat(8_000)}"`, expected: 'invalid', others: { event: undefined } },
  { name: 'an event of 8,000 characters', field: 'event', value: `"trade.${'e'.repeat(8_000)}"`, expected: 'invalid' },
]

for (const kind of ['pglite', 'postgres'] as const) {
  const describeKind = kind === 'postgres' ? describePostgres : describe
  describeKind(`input the database refuses, on ${kind === 'postgres' ? 'Postgres (Postgres)' : 'PGlite'}`, () => {
    let database: TestDatabase
    let app: ReturnType<typeof createApp>
    // the app's own lines: another file's in the same worker are not its (log-sink.ts, taggedLogger)
    let own: ReturnType<typeof taggedLogger>
    beforeAll(async () => {
      database = await createTestDatabase({ kind })
      own = taggedLogger(config.webhook.secrets)
      app = createApp({ config, db: database.db, logger: own.logger, clock: systemClock })
    })
    afterAll(async () => {
      await database.close()
    })

    it.each(CASES)('$name: $expected, never 503, and the order does not move', async ({ field, value, expected, others }) => {
      const reference = `refused-${randomBytes(4).toString('hex')}`
      await createOrder(database.db, { externalReference: reference })
      const deliveryId = `dlv_${randomBytes(6).toString('hex')}`
      const response = await sendWebhook(app, { body: body(reference, { ...others, [field]: value }), deliveryId })
      const stored = await database.db
        .selectFrom('webhookDeliveries')
        .select(['outcome', 'rawBody', 'eventType'])
        .where('deliveryId', '=', deliveryId)
        .executeTakeFirst()
      const order = await findOrderByExternalReference(database.db, reference)
      if (expected === 400) {
        expect([response.status, response.body.error?.code]).toEqual([400, 'invalid_payload'])
        expect(stored).toBeUndefined()
        expect(order?.tradeStatus).toBeNull()
        return
      }
      expect(response.status).toBe(200)
      expect(stored?.outcome).toBe(expected)
      // `trade.` and a status's 200 characters at the most
      expect(stored!.eventType.length).toBeLessThanOrEqual(206)
      // the stored body is the body as received, escapes and all
      expect(stored?.rawBody).toBe(body(reference, { ...others, [field]: value }))
      expect(order?.tradeStatus).toBe(expected === 'applied' ? 'funded' : null)
      // a retry of it is a duplicate, not a second attempt at the refused write
      const retry = await sendWebhook(app, { body: body(reference, { ...others, [field]: value }), deliveryId })
      expect([retry.status, retry.body.duplicate]).toEqual([200, true])
    })

    it('stores the good deliveries that arrive together with a refused one', async () => {
      const references = Array.from({ length: 12 }, (_, i) => `together-${i}-${randomBytes(3).toString('hex')}`)
      for (const reference of references) await createOrder(database.db, { externalReference: reference })
      const responses = await Promise.all(
        references.map((reference, i) =>
          sendWebhook(app, { body: body(reference, i % 4 === 1 ? { status: '"\\ud800"' } : {}), deliveryId: `together-${reference}` }),
        ),
      )
      expect(responses.map((response) => response.status)).toEqual(references.map(() => 200))
      for (const [i, reference] of references.entries()) {
        const stored = await database.db.selectFrom('webhookDeliveries').select('outcome').where('deliveryId', '=', `together-${reference}`).executeTakeFirst()
        const order = await findOrderByExternalReference(database.db, reference)
        expect([stored?.outcome, order?.tradeStatus]).toEqual(i % 4 === 1 ? ['invalid', null] : ['applied', 'funded'])
      }
    })

    it('logs a long kind clipped: a 180,000-character status or event is not in any log line whole', async () => {
      const reference = `long-${randomBytes(4).toString('hex')}`
      await createOrder(database.db, { externalReference: reference })
      const before = own.lines().length
      for (const override of [{ event: undefined, status: `"${'s'.repeat(180_000)}"` }, { event: `"trade.${'e'.repeat(180_000)}"` }]) {
        const response = await sendWebhook(app, { body: body(reference, override) })
        expect(response.status).toBe(200)
      }
      const lines = own.lines().slice(before)
      expect(lines.join('')).toContain('webhook payload invalid')
      expect(Math.max(...lines.map((line) => line.length))).toBeLessThan(2_000)
    })

    it('logs a refusal with its code and class only, never the database’s context holding the fields', async () => {
      const marker = `marker${randomBytes(4).toString('hex')}`
      const reference = `logged-${randomBytes(4).toString('hex')}`
      await createOrder(database.db, { externalReference: reference })
      const before = own.lines().length
      // a NUL in the event, which only the database refuses (the trade's fields are refused before it: isTradeFact),
      // and the marker in a field the database's context would quote
      const response = await sendWebhook(app, { body: body(reference, { trade_id: `"${marker}"`, event: '"trade.funded\\u0000"' }) })
      expect(response.status).toBe(200)
      const lines = own.lines().slice(before).join('')
      expect(lines, lines).toContain('"code":"22021"')
      expect(lines).toContain('"sqlstateClass":"22"')
      expect(lines).not.toContain(marker)
      expect(lines).not.toMatch(/JSON data|where|detail|internalQuery|params/)
    })

    it('classifies real errors from the database: refused data, a read-only database, missing tables, our own bugs, an overloaded queue', async () => {
      const failure = async (statement: Promise<unknown>) => {
        try {
          await statement
        } catch (error) {
          return describeDatabaseError(error)
        }
        throw new Error('the statement did not fail')
      }
      const dup = `dup-${randomBytes(4).toString('hex')}`
      const insert = () =>
        database.db.insertInto('webhookDeliveries').values({ deliveryId: dup, bodySha256: '0'.repeat(64), eventType: 'x', rawBody: '{}', outcome: 'ignored' }).execute()
      await insert()
      const table: [string, () => Promise<unknown>, string, string][] = [
        ['a lone surrogate read from JSON', () => sql`select * from json_to_recordset(${JSON.stringify([{ a: '\ud800' }])}::json) as i(a text)`.execute(database.db), 'refused_data', '22P02'],
        ['a NUL in a text parameter', () => sql`select ${'a\u0000b'}::text`.execute(database.db), 'refused_data', '22021'],
        ['a number out of range', () => sql`select ${'99999999999'}::int`.execute(database.db), 'refused_data', '22003'],
        ['a division by zero', () => sql`select 1 / ${0}::int`.execute(database.db), 'refused_data', '22012'],
        ['a duplicate key', insert, 'refused_data', '23505'],
        [
          'a write while the database is read-only (a standby, a failover)',
          () =>
            database.db.transaction().execute(async (trx) => {
              await sql`set transaction read only`.execute(trx)
              await sql`update orders set updated_at = now() where false`.execute(trx)
            }),
          'unavailable',
          '25006',
        ],
        // the service's own statements name only its tables: one missing is a database replaced or being restored
        ['a missing table (a restore under way)', () => sql`select * from no_such_table`.execute(database.db), 'schema_missing', '42P01'],
        ['a syntax error (our bug)', () => sql`select from from`.execute(database.db), 'failure', '42601'],
      ]
      for (const [name, statement, expectedKind, code] of table) {
        expect(await failure(statement()), name).toMatchObject({ kind: expectedKind, code })
      }
      // whatever logs a database's error report, the logger writes its classification only
      const secretValue = `secret${randomBytes(4).toString('hex')}`
      const report = await sql`select ${secretValue}::int`.execute(database.db).catch((error: unknown) => error)
      const before = logLines.length
      testLogger().error({ err: new Error('reading the orders failed', { cause: report }) }, 'a careless log call')
      const line = logLines.slice(before).join('')
      expect(line).toContain('"code":"22P02"')
      expect(line).toContain('reading the orders failed')
      expect(line).not.toContain(secretValue)
      expect(describeDatabaseError(new IngestOverloadedError('full'))).toMatchObject({ kind: 'overloaded' })
      expect(describeDatabaseError(new TypeError('x is undefined'))).toMatchObject({ kind: 'failure' })
    })
  })
}

describePostgres('only real unavailability answers 503 (Postgres)', () => {
  const database = useTestDatabase()

  it('classifies a refused connection, a terminated backend, a statement timeout and a cut connection as unavailable', async () => {
    const closed = openDatabase({ databaseUrl: `postgres://postgres@127.0.0.1:${await freePort()}/test`, poolSize: 1 })
    try {
      const refused = await sql`select 1`.execute(closed.db).catch((error: unknown) => error)
      expect(describeDatabaseError(refused)).toMatchObject({ kind: 'unavailable', code: 'ECONNREFUSED' })
    } finally {
      await closed.close()
    }
    const timedOut = await database.db
      .transaction()
      .execute(async (trx) => {
        await sql`set local statement_timeout = 50`.execute(trx)
        await sql`select pg_sleep(5)`.execute(trx)
      })
      .catch((error: unknown) => error)
    expect(describeDatabaseError(timedOut)).toMatchObject({ kind: 'unavailable', code: '57014' })

    // what a wrong DATABASE_URL gets: said in words that point at it, and never 503 (waiting will not fix it)
    const own = new URL(database.url!)
    for (const [change, code, message] of [
      [(url: URL) => (url.username = 'no_such_user'), '28000', /refused the login: check the user and password of DATABASE_URL/],
      [(url: URL) => (url.pathname = '/no_such_database'), '3D000', /the database named in DATABASE_URL does not exist: create it \(createdb NAME/],
    ] as const) {
      const wrong = new URL(own)
      change(wrong)
      const handle = openDatabase({ databaseUrl: wrong.toString(), poolSize: 1 })
      try {
        const refused = await sql`select 1`.execute(handle.db).catch((error: unknown) => error)
        expect(describeDatabaseError(refused)).toMatchObject({ kind: 'failure', code, message: expect.stringMatching(message) })
      } finally {
        await handle.close()
      }
    }

    const role = `escrow_nobody_${randomBytes(3).toString('hex')}`
    await sql.raw(`create role ${role}`).execute(database.db)
    try {
      const denied = await database.db
        .transaction()
        .execute(async (trx) => {
          const { rows } = await sql<{ schema: string }>`select current_schema() as schema`.execute(trx)
          await sql.raw(`set local role ${role}`).execute(trx)
          await sql.raw(`select 1 from ${rows[0]!.schema}.orders limit 1`).execute(trx)
        })
        .catch((error: unknown) => error)
      expect(describeDatabaseError(denied)).toMatchObject({ kind: 'failure', code: '42501', message: expect.stringMatching(/^permission denied: the user of DATABASE_URL/) })
    } finally {
      await sql.raw(`drop role ${role}`).execute(database.db)
    }

    // last: the terminated connection leaves the pool
    const terminated = await database.db
      .connection()
      .execute((connection) => sql`select pg_terminate_backend(pg_backend_pid())`.execute(connection))
      .catch((error: unknown) => error)
    expect(describeDatabaseError(terminated)).toMatchObject({ kind: 'unavailable', code: '57P01' })
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const viaProxy = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 1 })
    try {
      const running = sql`select pg_sleep(5)`.execute(viaProxy.db).catch((error: unknown) => error)
      await new Promise((resolve) => setTimeout(resolve, 200))
      proxy.cut({ reset: true })
      expect(describeDatabaseError(await running)).toMatchObject({ kind: 'unavailable' })
    } finally {
      await viaProxy.close()
      await proxy.close()
    }
  })

  it('answers 503 while a DBA has closed the database to connections, and a 55000 of a statement stays our bug', async () => {
    const name = `escrow_closed_${randomBytes(3).toString('hex')}`
    await sql.raw(`create database ${name} with allow_connections false`).execute(database.db)
    const closedUrl = new URL(database.url!)
    closedUrl.pathname = `/${name}`
    const handle = openDatabase({ databaseUrl: closedUrl.toString(), poolSize: 1 })
    try {
      const refused = await sql`select 1`.execute(handle.db).catch((error: unknown) => error)
      expect(describeDatabaseError(refused)).toMatchObject({ kind: 'unavailable', code: '55000', message: expect.stringMatching(/closed to new connections/) })
      const app = createApp({ config, db: handle.db, logger: testLogger(config.webhook.secrets), clock: systemClock })
      const answer = await sendWebhook(app, { body: body('closed-for-maintenance') })
      expect([answer.status, answer.body.error?.code]).toEqual([503, 'database_unavailable'])
    } finally {
      await handle.close()
      await sql.raw(`drop database ${name}`).execute(database.db)
    }
    const bug = await database.db
      .transaction()
      .execute(async (trx) => {
        await sql`create temporary sequence escrow_unused_sequence`.execute(trx)
        await sql`select currval('escrow_unused_sequence')`.execute(trx)
      })
      .catch((error: unknown) => error)
    expect(describeDatabaseError(bug)).toMatchObject({ kind: 'failure', code: '55000' })
  })

  it('answers 503 only while the database is away or without the service\'s tables, 400 or invalid for refused data', async () => {
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const handle = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 2 })
    const unmigrated = await createTestDatabase({ migrate: false })
    try {
      const logger = testLogger(config.webhook.secrets)
      const app = createApp({ config, db: handle.db, logger, clock: systemClock })
      await createOrder(database.db, { externalReference: 'only-503' })
      const good = () => sendWebhook(app, { body: body('only-503') })
      expect((await good()).status).toBe(200)
      expect((await sendWebhook(app, { body: body('only-503', { status: '"\\ud800"' }) })).status).toBe(200)
      proxy.cut()
      const away = await good()
      expect([away.status, away.body.error?.code]).toEqual([503, 'database_unavailable'])
      proxy.restore()
      expect((await good()).status).toBe(200)
      // a database without our tables is one being restored or replaced under the service: "try again later",
      // 503 `schema_missing` (it was a 500, and /readyz said ready); /readyz and the log say what to do
      const broken = createApp({ config, db: unmigrated.db, logger, clock: systemClock })
      const missing = await sendWebhook(broken, { body: body('only-503') })
      expect([missing.status, missing.body.error?.code]).toEqual([503, 'schema_missing'])
      expect((await request(broken).get('/readyz')).status).toBe(503)
    } finally {
      await handle.close()
      await proxy.close()
      await unmigrated.close()
    }
  })
})
