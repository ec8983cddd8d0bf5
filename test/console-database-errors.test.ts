// Every console page that reads the database, when the database refuses its statements for a reason an operator
// fixes (the service's tables missing: a restore under way, a database replaced): each is answered with the console's
// 503 page, its code and a Retry-After, never a 500, and neither the page nor the log holds the statement's SQL, a
// table's name or the database's own words; once the tables are back each page is answered again. (A database that
// hangs: console-database-hung.test.ts.)
import { randomBytes } from 'node:crypto'
import { sql } from 'kysely'
import request from 'supertest'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { SERVICE_TABLES } from '../src/db/migrate.js'
import { createAdminApp } from '../src/http/admin-app.js'
import type { App } from '../src/http/app.js'
import { CONSOLE_DATABASE_PAGES, loggedPath } from './helpers/console-pages.js'
import { taggedLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { type DatabaseHandle, openDatabase } from '../src/db/open-database.js'
import { describePostgres, useTestDatabase, withPostgresClient } from './helpers/test-database.js'

const TOKEN = 'console-errors-token-0123456789abcdef'
// The 500 of a database error that is not the database's absence nor the data's (kind `failure`: our statement wrong,
// or the service's user lacking a privilege, 42501) is the service's rule, kept by the console: waiting does not help,
// and the log line names the fault in fixed words (database-errors.ts). Only its words are checked here.
// what the statements and the database's reports of them hold, none of which is for the page or the log
const SQL_WORDS = [/\bselect\b/i, /\bfrom\b\s+"?\w/i, /\bwhere\b/i, /relation "/i, /_aside/, ...SERVICE_TABLES.map((table) => new RegExp(`\\b${table}\\b`))]

/** The log entries as text, each without the console path it names (/orders names a table's word, and is no SQL). */
function withoutPaths(entries: Record<string, unknown>[]): string[] {
  return entries.map(({ path: _path, ...entry }) => JSON.stringify(entry))
}

describe('every console page while the service’s tables are missing', () => {
  const database = useTestDatabase()
  let admin: App
  // the console's own lines: another file's in the same worker are not its (log-sink.ts, taggedLogger)
  let own: ReturnType<typeof taggedLogger>

  beforeAll(() => {
    own = taggedLogger([TOKEN])
    admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: database.db, logger: own.logger })
  })
  afterAll(async () => {
    for (const table of SERVICE_TABLES) await sql`alter table if exists ${sql.id(`${table}_aside`)} rename to ${sql.id(table)}`.execute(database.db)
  })

  const get = (path: string) => request(admin).get(path).set('Authorization', `Bearer ${TOKEN}`)

  it('answers each page 503 schema_missing with a Retry-After and no SQL, and each again once the tables are back', async () => {
    for (const path of CONSOLE_DATABASE_PAGES) expect((await get(path)).status, path).toBeLessThan(500)
    const beforeEntries = own.entries().length
    const beforeLines = own.lines().length
    for (const table of SERVICE_TABLES) await sql`alter table ${sql.id(table)} rename to ${sql.id(`${table}_aside`)}`.execute(database.db)
    try {
      for (const path of CONSOLE_DATABASE_PAGES) {
        const response = await get(path)
        expect([response.status, response.type, response.headers['retry-after']], path).toEqual([503, 'text/html', '30'])
        expect(response.text, path).toContain('<title>Try again shortly')
        expect(response.text, path).toContain('(schema_missing).')
        // the page's own words and markup hold none of them: only what the console wrote
        const words = response.text.replace(/<[^>]*>/g, ' ')
        for (const word of SQL_WORDS) expect(words, `${path}: ${word}`).not.toMatch(word)
      }
    } finally {
      for (const table of SERVICE_TABLES) await sql`alter table ${sql.id(`${table}_aside`)} rename to ${sql.id(table)}`.execute(database.db)
    }
    const written = own.entries().slice(beforeEntries)
    // logged as the tables missing (one line a second at most), never as an unhandled error
    expect(written.filter((entry) => entry.msg === 'unhandled error')).toEqual([])
    expect(written.filter((entry) => entry.msg === "request refused: the service's tables are missing").map((entry) => entry.path)).toContain(
      loggedPath(CONSOLE_DATABASE_PAGES[0]),
    )
    expect(own.lines().length).toBeGreaterThan(beforeLines)
    for (const line of withoutPaths(written)) for (const word of SQL_WORDS) expect(line, String(word)).not.toMatch(word)
    for (const path of CONSOLE_DATABASE_PAGES) expect((await get(path)).status, path).toBeLessThan(500)
  })
})

describePostgres('every console page when the service’s user lacks the privilege to read its tables (Postgres)', () => {
  const database = useTestDatabase()
  const role = `t_reader_${randomBytes(6).toString('hex')}`
  let limited: DatabaseHandle
  let admin: App
  let own: ReturnType<typeof taggedLogger>

  beforeAll(async () => {
    const url = new URL(database.url!)
    const { rows } = await sql<{ schema: string }>`select current_schema() as schema`.execute(database.db)
    const schema = rows[0]!.schema
    await withPostgresClient(async (client) => {
      await client.query(`create role ${role} login`)
      // the schema, not its tables: each statement is refused 42501
      await client.query(`grant usage on schema ${schema} to ${role}`)
    })
    url.username = role
    limited = openDatabase({ databaseUrl: url.toString(), poolSize: 2 })
    own = taggedLogger([TOKEN])
    admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: limited.db, logger: own.logger })
  })
  afterAll(async () => {
    await limited?.close().catch(() => {})
    await withPostgresClient(async (client) => {
      await client.query(`drop owned by ${role}`)
      await client.query(`drop role if exists ${role}`)
    })
  })

  it('answers each page with the console’s 500 page, and neither it nor the log holds SQL or the database’s words', async () => {
    const beforeEntries = own.entries().length
    const beforeLines = own.lines().length
    for (const path of CONSOLE_DATABASE_PAGES) {
      const response = await request(admin).get(path).set('Authorization', `Bearer ${TOKEN}`)
      expect([response.status, response.type], path).toEqual([500, 'text/html'])
      expect(response.text, path).toContain('Internal error (internal_error).')
      const words = response.text.replace(/<[^>]*>/g, ' ')
      for (const word of [...SQL_WORDS, /permission denied/i]) expect(words, `${path}: ${word}`).not.toMatch(word)
    }
    const unhandled = own
      .entries()
      .slice(beforeEntries)
      .filter((entry) => entry.msg === 'unhandled error')
    expect(unhandled.map((entry) => entry.path)).toEqual(CONSOLE_DATABASE_PAGES.map(loggedPath))
    for (const entry of unhandled) expect((entry.err as { code?: unknown }).code).toBe('42501')
    expect(own.lines().length).toBeGreaterThan(beforeLines)
    for (const line of withoutPaths(own.entries().slice(beforeEntries))) for (const word of SQL_WORDS) expect(line, String(word)).not.toMatch(word)
  })
})
