// Behind a proxy that adds its own Authorization header to every request (nginx auth_basic passes the browser's
// Basic credentials on, oauth2-proxy's --set-authorization-header sends `Bearer <id token>`, a ForwardAuth copies
// one), an operator logged in by the login page sends the session cookie and the proxy's header together. The
// console took the header for a token tried, ignored the cookie and answered 401, counted as a wrong token: after
// ten page loads the throttle answered 429 to everyone's token logins for a minute (a review found it). A live
// session now settles it; without one, the header is a token tried as before.
import request from 'supertest'
import { describe, expect, it } from 'vitest'
import { createAdminApp } from '../src/http/admin-app.js'
import { createMetrics } from '../src/metrics/metrics.js'
import { FakeClock } from './helpers/fake-clock.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'

const TOKEN = 'console-proxy-token-0123456789abcdef'
const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`

describe("the console behind a proxy that sends its own Authorization header", () => {
  const database = useTestDatabase()

  const consoleApp = () => {
    const metrics = createMetrics({}, { defaultMetrics: false })
    const admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: database.db, logger: testLogger([TOKEN]), clock: new FakeClock(), metrics })
    const login = () => request(admin).post('/console/login').type('form').send({ token: TOKEN, name: 'carol' })
    const refusals = async () => {
      const scrape = (await request(admin).get('/metrics')).text
      return [...scrape.matchAll(/^console_auth_refused_total\{([^}]*)\} (\d+)$/gm)].filter(([, , value]) => value !== '0').map(([, labels, value]) => `${labels} ${value}`)
    }
    return { admin, login, refusals }
  }

  it("honours the session cookie beside the proxy's Basic or Bearer header, page after page and action after action, none counted", async () => {
    const { admin, login, refusals } = consoleApp()
    const loggedIn = await login()
    expect(loggedIn.status).toBe(303)
    const session = String(loggedIn.headers['set-cookie']).split(';')[0]!
    for (const proxyHeader of [basic('proxyuser', 'proxypass'), 'Bearer eyJhbGciOiJSUzI1NiJ9.an-id-token.sig', 'Negotiate abc']) {
      for (let i = 0; i < 11; i++) {
        const page = await request(admin).get('/console/').set('Cookie', session).set('Authorization', proxyHeader)
        expect([page.status, proxyHeader, i]).toEqual([200, proxyHeader, i])
        expect(page.text).toContain('carol')
      }
    }
    // an action too: its form carries the session's CSRF token
    const confirm = await request(admin).get('/console/reactions/retry-failed').set('Cookie', session).set('Authorization', basic('proxyuser', 'proxypass'))
    const csrf = /name="csrf" value="([0-9a-f]+)"/.exec(confirm.text.replace(/<header>[\s\S]*?<\/header>/, ''))![1]!
    const actionId = /name="action_id" value="([0-9a-f]+)"/.exec(confirm.text)![1]!
    const done = await request(admin)
      .post('/console/reactions/retry-failed')
      .set('Cookie', session)
      .set('Authorization', basic('proxyuser', 'proxypass'))
      .type('form')
      .send({ csrf, action_id: actionId })
    expect(done.status).toBe(200)
    expect(done.text).toContain('no failed reaction jobs')
    expect(await refusals()).toEqual([])
    // and token logins are not held up
    expect((await login()).status).toBe(303)
    expect((await request(admin).get('/console/').set('Authorization', `Bearer ${TOKEN}`)).status).toBe(200)
  })

  it('without a live session the header is a token tried: a wrong one is 401 and counted, as before', async () => {
    const { admin, refusals } = consoleApp()
    const stale = `console_session=${'b'.repeat(64)}`
    const page = await request(admin).get('/console/').set('Cookie', stale).set('Authorization', basic('proxyuser', 'proxypass'))
    expect(page.status).toBe(401)
    expect(await refusals()).toEqual(['via="authorization",reason="wrong_token" 1'])
    // the right token in the header, beside a stale cookie, gets in
    expect((await request(admin).get('/console/').set('Cookie', stale).set('Authorization', basic('alice', TOKEN))).status).toBe(200)
  })
})
