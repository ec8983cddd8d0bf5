// Guessing the console's token: after ten wrong tokens in a minute, from any client, every token is answered 429
// unchecked until the minute has passed; the refusals are counted in console_auth_refused_total and logged once a
// second at most. Time is a FakeClock: the minute passes when the test says so.
import { hostname } from 'node:os'
import { once } from 'node:events'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import request from 'supertest'
import { describe, expect, it, vi } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { createApp } from '../src/http/app.js'
import { createMetrics } from '../src/metrics/metrics.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logLines, testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'

const TOKEN = 'console-throttle-token-0123456789ab'
const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`

describe('the operator console against a guesser', () => {
  const database = useTestDatabase()

  const consoleApp = () => {
    const clock = new FakeClock()
    const metrics = createMetrics({}, { defaultMetrics: false })
    const config = testConfig({ ADMIN_TOKEN: TOKEN })
    const admin = createAdminApp({ config, db: database.db, logger: testLogger([TOKEN]), clock, metrics })
    const login = (token: string) => request(admin).post('/console/login').type('form').send({ token, name: 'ops' })
    const bearer = (token: string) => request(admin).get('/console/').set('Authorization', `Bearer ${token}`)
    return { admin, clock, login, bearer }
  }

  it('answers every token 429 with Retry-After after 10 wrong ones in a minute, the right one too, and lets it in once the minute has passed', async () => {
    const { clock, login, bearer } = consoleApp()
    // the login page and the header share one count: a guesser gains nothing by taking turns
    for (let i = 0; i < 5; i++) {
      expect((await login(`x${i}`)).status).toBe(401)
      expect((await bearer(`x${i}`)).status).toBe(401)
      await clock.advance(1_000)
    }
    // the first wrong token came 5 s ago
    const refused = await login(TOKEN)
    expect([refused.status, refused.headers['retry-after']]).toEqual([429, '55'])
    expect(refused.headers['set-cookie']).toBeUndefined()
    expect(refused.headers['content-type']).toContain('text/html')
    expect(refused.text).toContain('too_many_attempts')
    // the login form again, to try once the wait is over
    expect(refused.text).toContain('name="token"')
    expect([(await bearer(TOKEN)).status, (await bearer(TOKEN)).headers['retry-after']]).toEqual([429, '55'])

    await clock.advance(54_000)
    expect([(await login(TOKEN)).status, (await login(TOKEN)).headers['retry-after']]).toEqual([429, '1'])
    await clock.advance(1_000)
    // the first wrong one is a minute old: the right token gets in by either way
    const admitted = await login(TOKEN)
    expect(admitted.status).toBe(303)
    expect(String(admitted.headers['set-cookie'])).toMatch(/^console_session=[0-9a-f]{64}/)
    expect((await bearer(TOKEN)).status).toBe(200)
  })

  it('takes ten wrong tokens in any minute: one every 7 s is never held up, ten at once are', async () => {
    const { clock, login } = consoleApp()
    // an operator mistyping now and then: fourteen times in ninety-one seconds, never ten in a minute
    for (let i = 0; i < 14; i++) {
      expect((await login(`slow${i}`)).status, `try ${i}`).toBe(401)
      await clock.advance(7_000)
    }
    await clock.advance(60_000)
    for (let i = 0; i < 10; i++) expect((await login(`fast${i}`)).status).toBe(401)
    expect((await login(TOKEN)).status).toBe(429)
  })

  it('keeps an open session working while it refuses tokens, and refuses a basic password unchecked', async () => {
    const { admin, login } = consoleApp()
    const session = String((await login(TOKEN)).headers['set-cookie']).split(';')[0]!
    for (let i = 0; i < 10; i++) expect((await login(`wrong${i}`)).status).toBe(401)
    expect((await request(admin).get('/console/orders').set('Cookie', session)).status).toBe(200)
    const basicAuth = await request(admin).get('/console/orders').set('Authorization', basic('alice', TOKEN))
    expect([basicAuth.status, basicAuth.headers['retry-after']]).toEqual([429, '60'])
    // a live session settles it whatever Authorization header comes beside it (a proxy's: see
    // test/console-proxy-authorization.test.ts), the header neither checked nor throttled
    expect((await request(admin).get('/console/orders').set('Cookie', session).set('Authorization', `Bearer ${TOKEN}`)).status).toBe(200)
  })

  it('checks 10 wrong tokens, not 40, when 40 logins send their headers first and their forms all together later', async () => {
    const { admin } = consoleApp()
    const server = http.createServer(admin).listen(0, '127.0.0.1')
    await once(server, 'listening')
    const { port } = server.address() as AddressInfo
    let arrived = 0
    server.on('request', () => arrived++)
    try {
      const forms = Array.from({ length: 40 }, (_, i) => `token=wrong${i}&name=ops`)
      const requests = forms.map((form) => {
        const req = http.request({
          host: '127.0.0.1',
          port,
          method: 'POST',
          path: '/console/login',
          agent: false,
          headers: { 'content-type': 'application/x-www-form-urlencoded', 'content-length': Buffer.byteLength(form) },
        })
        req.flushHeaders()
        const status = once(req, 'response').then(([res]) => {
          ;(res as http.IncomingMessage).resume()
          return (res as http.IncomingMessage).statusCode
        })
        return { req, form, status }
      })
      // every request's headers have been through the throttle's first look (each answered nothing yet)
      await vi.waitFor(() => expect(arrived).toBe(40))
      await new Promise((resolve) => setTimeout(resolve, 50))
      for (const { req, form } of requests) req.end(form)
      const statuses = await Promise.all(requests.map(({ status }) => status))
      expect(statuses.filter((status) => status === 401)).toHaveLength(10)
      expect(statuses.filter((status) => status === 429)).toHaveLength(30)
    } finally {
      server.closeAllConnections()
      server.close()
    }
  })

  it('answers a login form without a token 400 and does not count it, and a form of more than 50 fields 400, not 413', async () => {
    const { admin, login } = consoleApp()
    const post = (form: Record<string, string>) => request(admin).post('/console/login').type('form').send(form)
    const forms: Record<string, string>[] = [{}, { name: 'ops' }, { token: '', name: 'ops' }]
    for (const form of forms) {
      const refused = await post(form)
      expect([refused.status, refused.headers['set-cookie']], JSON.stringify(form)).toEqual([400, undefined])
      expect(refused.text).toContain('Type the token.')
      expect(refused.text).toContain('name="token"')
    }
    // twelve empty forms, past the ten wrong tokens a minute: none was a guess, so the token is still checked
    for (let i = 0; i < 9; i++) expect((await login('')).status).toBe(400)
    expect((await login(TOKEN)).status).toBe(303)

    const fields = Object.fromEntries(Array.from({ length: 51 }, (_, i) => [`field${i}`, 'x']))
    const tooMany = await post({ ...fields, token: TOKEN })
    expect([tooMany.status, tooMany.body]).toEqual([400, { error: { code: 'invalid_payload', message: 'The form has too many fields' } }])
    const scrape = (await request(admin).get('/metrics')).text
    expect(scrape).not.toMatch(/console_auth_refused_total\{[^}]*\} [1-9]/)
  })

  it('answers another method than GET on /metrics 405 naming GET, HEAD in Allow, and OPTIONS 204, as the console does', async () => {
    const { admin } = consoleApp()
    for (const method of ['put', 'post', 'delete'] as const) {
      const response = await request(admin)[method]('/metrics')
      expect([response.status, response.headers.allow, response.body.error?.code], method).toEqual([405, 'GET, HEAD', 'method_not_allowed'])
    }
    const options = await request(admin).options('/metrics')
    expect([options.status, options.headers.allow]).toEqual([204, 'GET, HEAD'])
    expect((await request(admin).get('/metrics')).status).toBe(200)
  })

  it('counts refused tokens in console_auth_refused_total by how they came and why', async () => {
    const { admin, login, bearer } = consoleApp()
    for (let i = 0; i < 3; i++) await login(`x${i}`)
    for (let i = 0; i < 7; i++) await bearer(`x${i}`)
    for (let i = 0; i < 2; i++) await login(TOKEN)
    await bearer(TOKEN)
    const scrape = (await request(admin).get('/metrics')).text
    expect(scrape).toContain('console_auth_refused_total{via="login_page",reason="wrong_token"} 3')
    expect(scrape).toContain('console_auth_refused_total{via="authorization",reason="wrong_token"} 7')
    expect(scrape).toContain('console_auth_refused_total{via="login_page",reason="throttled"} 2')
    expect(scrape).toContain('console_auth_refused_total{via="authorization",reason="throttled"} 1')
  })

  it('writes "console login refused" once a second at most, every refused token accounted for in `suppressed`', async () => {
    const { login, bearer } = consoleApp()
    // the lines the other tests' consoles still hold are written within a second: not counted here
    await new Promise((resolve) => setTimeout(resolve, 1_100))
    const before = logLines.length
    const started = Date.now()
    const statuses: number[] = []
    for (let i = 0; i < 300; i++) statuses.push((await login(`x${i}`)).status)
    for (let i = 0; i < 100; i++) statuses.push((await bearer(`x${i}`)).status)
    const elapsedS = (Date.now() - started) / 1_000
    expect(statuses.filter((status) => status === 401)).toHaveLength(10)
    expect(statuses.filter((status) => status === 429)).toHaveLength(390)
    // the last of them is written at the end of its second
    await new Promise((resolve) => setTimeout(resolve, 1_100))
    const lines = logLines
      .slice(before)
      .map((line) => JSON.parse(line) as { msg: string; suppressed?: number })
      .filter((line) => line.msg.startsWith('console login refused'))
    const accounted = (msg: string) =>
      lines.filter((line) => line.msg === msg).reduce((sum, line) => sum + 1 + (line.suppressed ?? 0), 0)
    expect(accounted('console login refused: wrong token')).toBe(10)
    expect(accounted('console login refused: too many wrong tokens')).toBe(390)
    expect(lines.length).toBeLessThanOrEqual(2 * (2 + Math.ceil(elapsedS)))
    expect(lines.join('\n')).not.toContain(TOKEN)
  })
})

describe('the overview against requests anyone can send to the webhook URL', () => {
  const database = useTestDatabase()

  it('asks a human about signatures matching no secret only, and shows unsigned and malformed requests apart', async () => {
    const metrics = createMetrics({}, { defaultMetrics: false })
    const config = testConfig({ ADMIN_TOKEN: TOKEN })
    const logger = testLogger([TOKEN])
    const app = createApp({ config, db: database.db, logger, clock: systemClock, metrics })
    const admin = createAdminApp({ config, db: database.db, logger, clock: systemClock, metrics })
    const overview = async () => (await request(admin).get('/console/').set('Authorization', `Bearer ${TOKEN}`)).text
    const webhook = (signature?: string) => {
      const call = request(app).post('/webhooks/partner').set('Content-Type', 'application/json').set('X-Partner-Delivery-Id', 'outsider-1')
      return (signature === undefined ? call : call.set('X-Partner-Signature', signature)).send('{"trade_id":"x"}')
    }

    expect((await webhook()).status).toBe(401)
    expect((await webhook('hello')).status).toBe(401)
    const calm = await overview()
    expect(calm).not.toContain('WEBHOOK_SECRETS')
    expect(calm).toContain('2 unsigned or malformed (anyone’s)')

    expect((await webhook(`sha256=${'ab'.repeat(32)}`)).status).toBe(401)
    const asking = await overview()
    // the count is this process's, in memory: the page names the replica as the reconcile runs do (host:pid), and
    // says where the service's total across replicas is, so that behind a load balancer it is not read as the total
    const replica = `${hostname()}:${process.pid}`
    expect(asking).toContain(`1 webhook signatures matching no secret on this replica (${replica}) since its start: check WEBHOOK_SECRETS.`)
    expect(asking).toMatch(/<span class="figure">1<\/span> signatures matching no secret on this replica since its start/)
    expect(asking).toContain(`replica ${replica}, counting since`)
    expect(asking).toContain('each replica counts its own: the service’s total is')
    expect(asking).toContain('<code>sum(increase(webhook_signature_failures_total{signature="mismatch"}[10m]))</code> across replicas')
    expect(asking).toContain('PartnerEscrowWebhookSignatureFailures')
  })
})
