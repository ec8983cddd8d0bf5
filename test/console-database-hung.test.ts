// The console while the database hangs: the path to it takes connections and answers nothing (a TCP proxy this test
// owns stops forwarding; the shared Postgres is never stopped). Each page is answered with the console's 503 page
// and its code, within one statement's bound: the overview's statements run at once, each on its own connection, so
// the first of them to fail answers the page (the statements are not waited for in turn).
import request from 'supertest'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { type DatabaseHandle, openDatabase } from '../src/db/open-database.js'
import { STATEMENT_ANSWER_GRACE_MS } from '../src/db/statement-timeout.js'
import { createAdminApp } from '../src/http/admin-app.js'
import type { App } from '../src/http/app.js'
import { testLogger } from './helpers/log-sink.js'
import { startTcpProxy, type TcpProxy } from './helpers/tcp-proxy.js'
import { testConfig } from './helpers/test-config.js'
import { describePostgres, postgresUrl, useTestDatabase } from './helpers/test-database.js'

const TOKEN = 'console-token-0123456789abcdef0123'
const STATEMENT_TIMEOUT_MS = 2_000
// the overview runs 7 statements; waited for in turn, a hung database would cost 7 answer waits
const OVERVIEW_STATEMENTS = 7

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
})
