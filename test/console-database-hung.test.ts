// The console while the database hangs: the path to it takes connections and answers nothing (a TCP proxy this test
// owns stops forwarding; the shared Postgres is never stopped). Each page is answered with the console's 503 page
// and its code, within one statement's bound: the overview's statements run at once, each on its own connection, so
// the first of them to fail answers the page (the statements are not waited for in turn). A page whose statement gets
// a connection the pool held from before the hang is answered by the console's own bound on each answer (5 s), not
// after the pool's wait of the statement timeout and its grace (15 s by default), which the ingest and poller keep.
import request from 'supertest'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { type DatabaseHandle, openDatabase } from '../src/db/open-database.js'
import { STATEMENT_ANSWER_GRACE_MS } from '../src/db/statement-timeout.js'
import { CONNECT_TIMEOUT_MS } from '../src/db/database-errors.js'
import { DEFAULT_STATEMENT_TIMEOUT_MS } from '../src/db/statement-timeout.js'
import { createAdminApp } from '../src/http/admin-app.js'
import type { App } from '../src/http/app.js'
import { CONSOLE_DATABASE_PAGES, loggedPath } from './helpers/console-pages.js'
import { taggedLogger, testLogger } from './helpers/log-sink.js'
import { wakeLatePast } from './helpers/late-loop.js'
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js'
import { testConfig } from './helpers/test-config.js'
import { describePostgres, postgresUrl, useTestDatabase } from './helpers/test-database.js'

const TOKEN = 'console-token-0123456789abcdef0123'
const STATEMENT_TIMEOUT_MS = 2_000
// the overview runs 7 statements; waited for in turn, a hung database would cost 7 answer waits
const OVERVIEW_STATEMENTS = 7
// the console's bound on a statement's answer: the connect timeout's, so a page is answered as soon either way
const CONSOLE_BOUND_MS = CONNECT_TIMEOUT_MS

describePostgres('the console while the database hangs (Postgres)', () => {
  const database = useTestDatabase()
  let proxy: TcpProxy
  let handle: DatabaseHandle
  let admin: App

  beforeAll(async () => {
    const server = new URL(postgresUrl!)
    proxy = await startTcpProxy({ host: server.hostname, port: Number(server.port || 5432) })
    handle = openDatabase({ databaseUrl: proxy.rewrite(database.url!), statementTimeoutMs: STATEMENT_TIMEOUT_MS })
    admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: handle.db, logger: testLogger([TOKEN]) })
  })
  afterAll(async () => {
    proxy.restore()
    await handle.close().catch(() => {})
    await proxy.close()
  })

  const get = (path: string) => request(admin).get(path).set('Authorization', `Bearer ${TOKEN}`)

  it('answers the overview and the other pages 503 with the page saying to try again, and its code', async () => {
    // the pool holds the overview's connections, idle, when the database stops answering on them and on new ones
    expect((await get('/console/')).status).toBe(200)
    proxy.silence()
    for (const path of ['/console/', '/console/deliveries', '/console/reactions', '/console/']) {
      const started = Date.now()
      const response = await get(path)
      const tookMs = Date.now() - started
      expect([response.status, response.type, response.headers['retry-after']], path).toEqual([503, 'text/html', '5'])
      expect(response.text, path).toContain('<title>Try again shortly')
      expect(response.text, path).toContain('The database is unavailable; retry later (database_unavailable).')
      // a generous bound: far over one statement's wait (or the 5-s connect timeout), under the overview's
      // statements waited for one after another
      expect(tookMs, path).toBeLessThan(OVERVIEW_STATEMENTS * (STATEMENT_TIMEOUT_MS + STATEMENT_ANSWER_GRACE_MS) + 5_000)
    }
    proxy.restore()
    expect((await get('/console/')).status).toBe(200)
  })

  // The pool's own wait for an answer is the statement timeout and its grace (14 + 1 s by default): a page whose
  // statement went on a connection the pool held from before the hang waited it out, where one that opened a new
  // connection was answered after the 5-s connect timeout. Which wait answered is told by the error the page's 503 is
  // logged with, not by the time it took.
  it('answers a page 503 by the console’s own bound on a connection the pool held from before the hang, at the default statement timeout', async () => {
    // one connection, the default statement timeout: the page's one statement gets the connection the pool holds
    const pooled = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 1 })
    try {
      expect(CONSOLE_BOUND_MS).toBeLessThan(DEFAULT_STATEMENT_TIMEOUT_MS)
      // the console's own lines: another file's in the same worker are not its (log-sink.ts, taggedLogger)
      const own = taggedLogger([TOKEN])
      const app = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: pooled.db, logger: own.logger })
      const getOn = (path: string) => request(app).get(path).set('Authorization', `Bearer ${TOKEN}`)
      expect((await getOn('/console/deliveries')).status).toBe(200)
      expect(pooled.poolStats()).toEqual({ total: 1, idle: 1, waiting: 0 })
      const before = own.entries().length
      proxy.silence()
      const response = await getOn('/console/deliveries')
      expect([response.status, response.type, response.headers['retry-after']]).toEqual([503, 'text/html', '5'])
      expect(response.text).toContain('<title>Try again shortly')
      expect(response.text).toContain('The database is unavailable; retry later (database_unavailable).')
      // the console's bound ended the wait, not the pool's (which logs `the database connection was lost or timed out`)
      const unavailable = own
        .entries()
        .slice(before)
        .filter((entry) => entry.msg === 'database unavailable')
        .map((entry) => ({ path: entry.path, message: (entry.err as { message?: unknown }).message }))
      expect(unavailable).toEqual([{ path: '/deliveries', message: `the database did not answer within the ${CONSOLE_BOUND_MS} ms asked for` }])
      proxy.restore()
      // the connection left unanswered is closed, not handed out again: the next page is answered on a new one
      expect((await getOn('/console/deliveries')).status).toBe(200)
    } finally {
      proxy.restore()
      await pooled.close().catch(() => {})
    }
  })
})

// Every console page that reads the database, as an operator reaches it: each is answered 503 by the console's own
// bound when the database hangs (the connection the pool held from before the hang, a pool of one), never a 500
// and never a hang, and the page after the hang ends is answered 200. The rows the pages name need not exist: the
// page's first statement is sent all the same, and it is that statement's answer that never comes. That the bound,
// not the pool's 15-s wait, ended the page is told by the log line, not by the time it took.
//
// The overview and the reactions page send statements at once: on a pool of one, the first waits for its answer and
// the others for the one connection. The page's bound is one deadline over both waits (answer-bound.ts); when each
// wait had its own 5 s, the pool's wait for a connection (the connect timeout, 5 s) and the console's bound on the
// answer ended together, and the log line named the pool's wait or the console's bound as timers fell (the pool's,
// on every run here). One deadline did not settle it alone: a loop that woke late still ran the pool's timer first,
// and the page's words are now the deadline's whichever runs first (the test after these, and answer-bound.ts). Those
// two pages are checked at the console's own bound, where the two waits would race; the
// others, one statement at a time, at a deadline of 1 s, shorter than any of the pool's waits (each page waits its
// deadline out: 5 s each would make this file 100 s long).
const RACING_PAGES: readonly string[] = ['/console/', '/console/reactions']
const SHORT_BOUND_MS = 1_000

describePostgres('every console page while the database hangs (Postgres, a pool of one)', () => {
  const database = useTestDatabase()
  let proxy: TcpProxy
  let pooled: DatabaseHandle
  let app: App
  let shortBoundApp: App
  let own: ReturnType<typeof taggedLogger>

  beforeAll(async () => {
    const server = new URL(postgresUrl!)
    proxy = await startTcpProxy({ host: server.hostname, port: Number(server.port || 5432) })
    // the default statement timeout: the pool's own wait for an answer is 15 s, the console's 5
    pooled = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 1 })
    // the consoles' own lines: another file's in the same worker are not theirs (log-sink.ts, taggedLogger)
    own = taggedLogger([TOKEN])
    const deps = { config: testConfig({ ADMIN_TOKEN: TOKEN }), db: pooled.db, logger: own.logger }
    app = createAdminApp(deps)
    shortBoundApp = createAdminApp({ ...deps, consolePageAnswerMs: SHORT_BOUND_MS })
  })
  afterAll(async () => {
    proxy.restore()
    await pooled.close().catch(() => {})
    await proxy.close()
  })

  it.each(CONSOLE_DATABASE_PAGES)('%s: 503 by the console’s bound, then 200 once the database answers', async (path) => {
    const racing = RACING_PAGES.includes(path)
    const getOn = (page: string) => request(racing ? app : shortBoundApp).get(page).set('Authorization', `Bearer ${TOKEN}`)
    // the pool's one connection, idle, from before the hang
    expect((await getOn(path)).status, path).toBeLessThan(500)
    expect(pooled.poolStats()).toEqual({ total: 1, idle: 1, waiting: 0 })
    const before = own.entries().length
    proxy.silence()
    try {
      const response = await getOn(path)
      expectAnsweredByTheBound(path, response, own.entries().slice(before), racing ? CONSOLE_BOUND_MS : SHORT_BOUND_MS)
    } finally {
      proxy.restore()
    }
    // the connection left unanswered is closed, not handed out again: the next page is answered on a new one
    expect((await getOn(path)).status, path).toBeLessThan(500)
  }, 30_000)

  // What a loaded machine did by chance (CI, load 20): the loop woke late, past the page's deadline and the pool's
  // wait for a connection alike, and ran the pool's timer first (helpers/late-loop.ts). The page's line named the
  // pool's words then; the two waits are the same length, and the deadline's words are said whichever timer runs first.
  it.each(RACING_PAGES)('%s: 503 by the console’s bound when the loop wakes late, past the pool’s wait for a connection too', async (path) => {
    const getOn = (page: string) => request(app).get(page).set('Authorization', `Bearer ${TOKEN}`)
    expect((await getOn(path)).status, path).toBeLessThan(500)
    expect(pooled.poolStats()).toEqual({ total: 1, idle: 1, waiting: 0 })
    const before = own.entries().length
    proxy.silence()
    try {
      await wakeLatePast(CONNECT_TIMEOUT_MS)
      const response = await getOn(path)
      expectAnsweredByTheBound(path, response, own.entries().slice(before), CONSOLE_BOUND_MS)
    } finally {
      proxy.restore()
    }
    expect((await getOn(path)).status, path).toBeLessThan(500)
  }, 30_000)
})

/**
 * The page's 503 under the hang, and its one log line naming the console's bound: not the pool's wait for a connection
 * (the racing pages' statements wait for the one connection while the first of them waits for its answer), which
 * logs `the database connection was lost or timed out`, nor its wait for an answer (15 s), which logs the same.
 */
function expectAnsweredByTheBound(path: string, response: request.Response, written: Record<string, unknown>[], boundMs: number) {
  expect([response.status, response.type, response.headers['retry-after']], path).toEqual([503, 'text/html', '5'])
  expect(response.text, path).toContain('<title>Try again shortly')
  expect(response.text, path).toContain('The database is unavailable; retry later (database_unavailable).')
  const unavailable = written
    .filter((entry) => entry.msg === 'database unavailable')
    .map((entry) => ({ path: entry.path, message: (entry.err as { message?: unknown }).message }))
  expect(unavailable, path).toEqual([{ path: loggedPath(path), message: `the database did not answer within the ${boundMs} ms asked for` }])
  expect(written.filter((entry) => entry.level === 'error' || entry.level === 50), path).toEqual([])
}
