// The operator console over HTTP (supertest against the operator app): who gets in, what a forged form
// gets, the headers every page carries, hostile delivery text shown as text, and each action's effect.
import net from 'node:net'
import express from 'express'
import { Kysely, PostgresDialect, sql } from 'kysely'
import pg from 'pg'
import type { Database } from '../src/db/database.js'
import request from 'supertest'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { type App, createApp } from '../src/http/app.js'
import { findOrderByExternalReference, orderHistory } from '../src/orders/order.repository.js'
import { createPoller, type RunSummary } from '../src/reconcile/poller.js'
import { startRun } from '../src/reconcile/reconcile-run.repository.js'
import { findDelivery, recordDelivery } from '../src/webhooks/delivery.repository.js'
import { actionFields as formFields } from './helpers/console-over-http.js'
import { testLogger } from './helpers/log-sink.js'
import { fakeTradeApi } from './helpers/partner-api-fake-client.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { PartnerTimeoutError } from '../src/partner-api/partner-api-error.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'
import { applyObservation, NO_REACTION_HANDLERS } from '../src/orders/apply-observation.js'
import { createOrder } from './helpers/orders.js'
import { createReactionRegistry } from '../src/reactions/reaction-registry.js'
import { writeJobRows } from './helpers/reaction-jobs.js'
import { DUE_COUNT_CAP } from '../src/orders/poll-schedule.repository.js'

const TOKEN = 'console-token-0123456789abcdef0123'
const HOSTILE_ID = '"><img/src=x/onerror=alert(1)><script>alert(2)</script>'
const HOSTILE_REFERENCE = '<script>window.pwned=1</script>'
// what reorders the text after it (RLO, LRI, PDI, RLM, ALM), shows nothing (zero-width space, BOM) or breaks a
// line where a viewer honours it (the line separator)
const INVISIBLE = /[\u061c\u200b-\u200f\u202a-\u202e\u2028\u2029\u2060\u2066-\u2069\ufeff]/

const GET_PAGES = [
  '/console/',
  '/console/deliveries',
  '/console/deliveries?reference=x',
  '/console/deliveries/reapply?from=2026-01-01T00:00Z',
  `/console/deliveries/d/${'0'.repeat(64)}`,
  `/console/deliveries/d/${'0'.repeat(64)}/reapply`,
  '/console/orders',
  '/console/orders/1',
  '/console/orders/requeue',
  '/console/deliveries/dismiss?reference=x',
  '/console/reconcile',
  '/console/reactions',
  '/console/reactions?state=failed',
  '/console/reactions/1',
  '/console/reactions/1/retry',
  '/console/reactions/1/skip',
  '/console/reactions/retry-failed',
  '/console/no-such-page',
]
const POST_ACTIONS = [
  '/console/deliveries/reapply',
  `/console/deliveries/d/${'0'.repeat(64)}/reapply`,
  '/console/orders/requeue',
  '/console/deliveries/dismiss',
  '/console/reconcile/run',
  '/console/reactions/1/retry',
  '/console/reactions/1/skip',
  '/console/reactions/retry-failed',
  '/console/logout',
]

const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`

describe('operator console', () => {
  let database: TestDatabase
  let app: App
  let admin: App
  // a trade id starting tr_unanswered- stands for a platform that does not answer in time
  const fetcher = fakeTradeApi({
    getTrade: async (tradeId) => {
      if (tradeId.startsWith('tr_unanswered-')) throw new PartnerTimeoutError('the platform did not answer within 10000 ms', 10_000)
      return tradeRecord({ trade_id: tradeId, status: 'created', external_reference: tradeId.replace(/^tr_/, '') })
    },
  })

  beforeAll(async () => {
    database = await createTestDatabase()
    const config = testConfig({ ADMIN_TOKEN: TOKEN })
    const logger = testLogger([TOKEN])
    app = createApp({ config, db: database.db, logger, clock: systemClock })
    admin = createAdminApp({
      config,
      db: database.db,
      logger,
      reconcileOnce: () =>
        createPoller({
          db: database.db,
          fetcher,
          clock: systemClock,
          logger,
          settings: { intervalS: 1, batchSize: 10, concurrency: 2, observation: { staleAfterS: 3600, handlersFor: NO_REACTION_HANDLERS }, leaseS: 60 },
          replica: 'console-test',
        }).runOnce(),
    })
  })
  afterAll(async () => {
    await database.close()
  })

  const bearer = (call: request.Test) => call.set('Authorization', `Bearer ${TOKEN}`)

  describe('access', () => {
    it('answers every page and every action with 401 and the login page without the token', async () => {
      for (const path of GET_PAGES) {
        const response = await request(admin).get(path)
        expect(response.status, path).toBe(401)
        expect(response.headers['www-authenticate'], path).toContain('Bearer')
        expect(response.text, path).toContain('name="token"')
      }
      for (const path of POST_ACTIONS) {
        const response = await request(admin).post(path).type('form').send({ csrf: 'x', action_id: '0'.repeat(32) })
        expect(response.status, path).toBe(401)
      }
    })

    it("answers another method on a console path 405 with the path's Allow (OPTIONS 204), and a path it has not 404", async () => {
      const reapply = `/console/deliveries/d/${'0'.repeat(64)}/reapply`
      const cases: ['put' | 'delete' | 'patch' | 'get', string, string][] = [
        ['put', '/console/orders', 'GET, HEAD'],
        ['delete', '/console/orders/1', 'GET, HEAD'],
        ['patch', '/console/reactions/1/retry', 'GET, HEAD, POST'],
        ['delete', reapply, 'GET, HEAD, POST'],
        ['put', '/console/logout', 'POST'],
        ['get', '/console/reconcile/run', 'POST'],
      ]
      for (const [method, path, allow] of cases) {
        const response = await bearer(request(admin)[method](path)).type('form').send('a=1')
        expect([response.status, response.headers.allow], `${method} ${path}`).toEqual([405, allow])
        expect(response.text, `${method} ${path}`).toContain('Method not allowed')
      }
      // a page posted to with a valid form token
      const fields = formFields((await bearer(request(admin).get('/console/reactions/retry-failed'))).text)
      const posted = await bearer(request(admin).post('/console/orders')).type('form').send(fields)
      expect([posted.status, posted.headers.allow]).toEqual([405, 'GET, HEAD'])
      // the login page's, before any token is asked for
      const login = await request(admin).put('/console/login')
      expect([login.status, login.headers.allow]).toEqual([405, 'GET, HEAD, POST'])
      const options = await bearer(request(admin).options('/console/reconcile/run'))
      expect([options.status, options.headers.allow]).toEqual([204, 'POST'])
      expect((await bearer(request(admin).patch('/console/no-such-page'))).status).toBe(404)
      expect((await request(admin).delete('/console/orders')).status).toBe(401)
    })

    it('refuses a wrong bearer token, a wrong basic password, and a forged session cookie', async () => {
      expect((await request(admin).get('/console/').set('Authorization', `Bearer ${TOKEN}x`)).status).toBe(401)
      expect((await request(admin).get('/console/').set('Authorization', basic('ops', 'nope'))).status).toBe(401)
      expect((await request(admin).get('/console/').set('Cookie', `console_session=${'a'.repeat(64)}`)).status).toBe(401)
    })

    it('lets in a bearer token, and basic auth with the token as password under any user name', async () => {
      expect((await bearer(request(admin).get('/console/'))).status).toBe(200)
      expect((await request(admin).get('/console/').set('Authorization', `bearer   ${TOKEN}  `)).status).toBe(200)
      // the rest of the header is the token: words after the right one made a wrong token that was let in
      expect((await request(admin).get('/console/').set('Authorization', `Bearer ${TOKEN} ${TOKEN}`)).status).toBe(401)
      // and a token of several words, which was never matched whole
      const phrase = 'correct horse battery staple 0123'
      const phrased = createAdminApp({ config: testConfig({ ADMIN_TOKEN: phrase }), db: database.db, logger: testLogger([phrase]) })
      expect((await request(phrased).get('/console/').set('Authorization', `Bearer ${phrase}`)).status).toBe(200)
      const response = await request(admin).get('/console/').set('Authorization', basic('alice', TOKEN))
      expect(response.status).toBe(200)
      expect(response.text).toContain('alice')
    })

    it('logs in through the login page with an HttpOnly, SameSite=Strict session cookie, and out again', async () => {
      const wrong = await request(admin).post('/console/login').type('form').send({ token: 'wrong', name: 'bob' })
      expect(wrong.status).toBe(401)
      expect(wrong.headers['set-cookie']).toBeUndefined()

      const login = await request(admin).post('/console/login').type('form').send({ token: TOKEN, name: 'bob' })
      expect(login.status).toBe(303)
      const cookie = String(login.headers['set-cookie'])
      expect(cookie).toMatch(/^console_session=[0-9a-f]{64}/)
      expect(cookie).toContain('HttpOnly')
      expect(cookie).toContain('SameSite=Strict')
      const session = cookie.split(';')[0]!
      const page = await request(admin).get('/console/').set('Cookie', session)
      expect(page.status).toBe(200)
      expect(page.text).toContain('bob')

      // a stale cookie of the same name (another path's, sent first) does not hide the live one
      const stale = `console_session=${'a'.repeat(64)}`
      expect((await request(admin).get('/console/').set('Cookie', `${stale}; console_session=x; ${session}`)).status).toBe(200)

      const csrf = /name="csrf" value="([0-9a-f]+)"/.exec(page.text)![1]
      const logout = await request(admin).post('/console/logout').set('Cookie', session).type('form').send({ csrf })
      expect(logout.status).toBe(303)
      expect((await request(admin).get('/console/').set('Cookie', session)).status).toBe(401)
      // reached over plain HTTP the cookie cannot be Secure, or the browser would drop it
      expect(cookie).not.toMatch(/;\s*Secure/i)
    })

    it('makes the session cookie Secure when a proxy that ends TLS says the browser came over HTTPS', async () => {
      for (const [name, value] of [
        ['X-Forwarded-Proto', 'https'],
        ['X-Forwarded-Proto', 'HTTPS, http'],
        ['Forwarded', 'for=192.0.2.60;proto=https;by=203.0.113.43'],
      ] as const) {
        const login = await request(admin).post('/console/login').set(name, value).type('form').send({ token: TOKEN, name: 'bob' })
        expect(login.status, `${name}: ${value}`).toBe(303)
        expect(String(login.headers['set-cookie']), `${name}: ${value}`).toMatch(/;\s*Secure/i)
      }
      // before, it never was: a browser sent it over plain HTTP to the same host name too
      for (const [name, value] of [['X-Forwarded-Proto', 'http'], ['Forwarded', 'proto=http']] as const) {
        const login = await request(admin).post('/console/login').set(name, value).type('form').send({ token: TOKEN, name: 'bob' })
        expect(String(login.headers['set-cookie']), `${name}: ${value}`).not.toMatch(/;\s*Secure/i)
      }
    })

    // Behind a reverse proxy that ends TLS and serves the console under a path of its own, taken off before the
    // request reaches us: the browser's Origin was the proxy's (every form refused 403, the login's included), and
    // every link, redirect and the cookie's path led to /console/…, which the proxy does not serve
    it('works behind a reverse proxy that ends TLS and serves it under a path of its own (X-Forwarded-Prefix)', async () => {
      const proxied = (call: request.Test) =>
        call.set('X-Forwarded-Prefix', '/tools/escrow').set('Origin', 'https://ops.example.com').set('Sec-Fetch-Site', 'same-origin')
      const loginPage = await proxied(request(admin).get('/console/login'))
      expect(loginPage.text).toContain('action="/tools/escrow/console/login"')
      const login = await proxied(request(admin).post('/console/login')).type('form').send({ token: TOKEN, name: 'carol' })
      expect(login.status).toBe(303)
      expect(login.headers.location).toBe('/tools/escrow/console/')
      expect(String(login.headers['set-cookie'])).toContain('Path=/tools/escrow/console')
      const session = String(login.headers['set-cookie']).split(';')[0]!
      const page = await proxied(request(admin).get('/console/')).set('Cookie', session)
      expect(page.status).toBe(200)
      const links = [...page.text.matchAll(/(?:href|action)="([^"]*)"/g)].map((match) => match[1]!)
      expect(links.length).toBeGreaterThan(5)
      expect(links.filter((link) => !link.startsWith('/tools/escrow/console/'))).toEqual([])
      expect((await proxied(request(admin).get('/')).set('Cookie', session)).headers.location).toBe('/tools/escrow/console/')
      const csrf = /name="csrf" value="([0-9a-f]+)"/.exec(page.text)![1]
      const logout = await proxied(request(admin).post('/console/logout')).set('Cookie', session).type('form').send({ csrf })
      expect([logout.status, logout.headers.location]).toEqual([303, '/tools/escrow/console/login'])

      // a prefix that is not a plain path is ignored, and an older browser (no Sec-Fetch-Site) from another host refused
      for (const prefix of ['/x"><script>', '/a/../b', 'tools', '//evil.example'])
        expect((await request(admin).get('/console/login').set('X-Forwarded-Prefix', prefix)).text).toContain('action="/console/login"')
      const elsewhere = await request(admin).post('/console/login').set('Origin', 'https://evil.example').type('form').send({ token: TOKEN, name: 'x' })
      expect(elsewhere.status).toBe(403)
    })

    it('is not served at all without an ADMIN_TOKEN (remote mode)', async () => {
      const off = createAdminApp({ config: testConfig(), db: database.db, logger: testLogger() })
      expect((await request(off).get('/console/')).status).toBe(404)
    })
  })

  it('sends the security headers and no-store on every page, the login page included', async () => {
    for (const response of [await request(admin).get('/console/login'), await bearer(request(admin).get('/console/'))]) {
      const csp = String(response.headers['content-security-policy'])
      expect(csp).toContain("default-src 'self'")
      expect(csp).toContain("script-src 'none'")
      expect(csp).toContain("frame-ancestors 'none'")
      expect(csp).not.toContain('unsafe-inline')
      expect(response.headers['x-frame-options']).toBe('DENY')
      expect(response.headers['x-content-type-options']).toBe('nosniff')
      expect(response.headers['referrer-policy']).toBe('same-origin')
      expect(response.headers['cache-control']).toBe('no-store')
    }
  })

  it('shows a delivery whose id, reference and body hold markup as text, on the search and the delivery page', async () => {
    const body = { ...tradePayload(HOSTILE_REFERENCE, 'funded'), note: '</pre><script>alert(3)</script>' }
    expect((await sendWebhook(app, { body, deliveryId: HOSTILE_ID })).status).toBe(200)
    const stored = await findDelivery(database.db, HOSTILE_ID)
    expect(stored?.outcome).toBe('unmatched')

    const search = await bearer(request(admin).get('/console/deliveries').query({ reference: HOSTILE_REFERENCE }))
    expect(search.status).toBe(200)
    const page = await bearer(request(admin).get(`/console/deliveries/${encodeURIComponent(HOSTILE_ID)}/${stored!.bodySha256}`))
    expect(page.status).toBe(200)
    for (const text of [search.text, page.text]) {
      expect(text).not.toContain('<script>')
      expect(text).not.toContain('<img')
      expect(text).toContain('&lt;script&gt;window.pwned=1&lt;/script&gt;')
    }
    expect(page.text).toContain('&lt;/pre&gt;&lt;script&gt;alert(3)&lt;/script&gt;')
    expect(page.text).toContain('&quot;&gt;&lt;img/src=x/onerror=alert(1)&gt;')
  })

  it('shows the environment of a linked order, and one of the other PARTNER_ENV as left alone', async () => {
    await database.db
      .insertInto('orders')
      .values([
        { externalReference: 'env-live', tradeId: 'tr_env-live', tradeStatus: 'created', partnerEnv: 'live' },
        { externalReference: 'env-sandbox', tradeId: 'tr_env-sandbox', tradeStatus: 'created', partnerEnv: 'sandbox' },
      ])
      .execute()
    const live = await findOrderByExternalReference(database.db, 'env-live')
    const sandbox = await findOrderByExternalReference(database.db, 'env-sandbox')
    // testConfig's PARTNER_ENV: sandbox
    expect((await bearer(request(admin).get(`/console/orders/${sandbox!.id}`))).text).toContain('<dt>Environment</dt><dd>sandbox</dd>')
    expect((await bearer(request(admin).get(`/console/orders/${live!.id}`))).text).toContain(
      '<dt>Environment</dt><dd><strong>live</strong> · not polled nor moved while this service runs with PARTNER_ENV=sandbox</dd>',
    )
    const list = await bearer(request(admin).get('/console/orders').query({ reference: 'env-live' }))
    expect(list.text).toContain('<td>tr_env-live</td><td>live</td>')
    await database.db.deleteFrom('orders').where('externalReference', 'in', ['env-live', 'env-sandbox']).execute()
  })

  it('shows bidirectional and invisible characters from outside as marked escapes: they cannot reorder or hide the page’s text', async () => {
    const reference = 'invoice\u202efdp.exe'
    const body = { ...tradePayload(reference, 'funded'), note: 'zero\u200bwidth\ufeff \u2066isolated\u2069 \u2028' }
    expect((await sendWebhook(app, { body, deliveryId: 'dlv-bidi' })).status).toBe(200)
    const stored = await findDelivery(database.db, 'dlv-bidi')
    await database.db.insertInto('orders').values({ externalReference: reference }).execute()
    const order = await findOrderByExternalReference(database.db, reference)

    const search = await bearer(request(admin).get('/console/deliveries').query({ reference }))
    const page = await bearer(request(admin).get('/console/delivery').query({ id: 'dlv-bidi', body: stored!.bodySha256 }))
    const orders = await bearer(request(admin).get('/console/orders').query({ reference }))
    const orderPage = await bearer(request(admin).get(`/console/orders/${order!.id}`))
    const marked = (escape: string) => `<span class="unprintable">${escape}</span>`
    for (const response of [search, page, orders, orderPage]) {
      expect(response.status).toBe(200)
      // what the page shows: its text, outside every tag
      expect(response.text.replace(/<[^>]*>/g, '')).not.toMatch(INVISIBLE)
      expect(response.text).toContain(`invoice${marked('\\u202e')}fdp.exe`)
    }
    expect(page.text).toContain(`zero${marked('\\u200b')}width${marked('\\ufeff')} ${marked('\\u2066')}isolated${marked('\\u2069')} ${marked('\\u2028')}`)
    // a search box keeps the value exact, for it is sent back
    expect(search.text).toContain(`name="reference" value="${reference}"`)
    await database.db.deleteFrom('orders').where('externalReference', '=', reference).execute()
  })

  it('shows a deeply nested body as sent rather than re-indented, so its page stays the size of the body', async () => {
    const nested = `${'['.repeat(3_000)}${']'.repeat(3_000)}`
    const raw = JSON.stringify(tradePayload('nested-body', 'funded')).replace(/}$/, `,"nested":${nested}}`)
    expect((await sendWebhook(app, { body: raw, deliveryId: 'dlv-nested-body' })).status).toBe(200)
    const stored = await findDelivery(database.db, 'dlv-nested-body')

    const page = await bearer(request(admin).get(`/console/deliveries/dlv-nested-body/${stored!.bodySha256}`))
    expect(page.status).toBe(200)
    // re-indented, every one of its 6,000 lines would be indented up to 6,000 spaces: 18 MB
    expect(page.text.length).toBeLessThan(raw.length + 20_000)
    expect(page.text).toContain(`&quot;nested&quot;:${nested}}`)

    const shallow = { ...tradePayload('shallow-body', 'funded'), nested: [[[{ a: 1 }]]] }
    expect((await sendWebhook(app, { body: shallow, deliveryId: 'dlv-shallow-body' })).status).toBe(200)
    const shallowStored = await findDelivery(database.db, 'dlv-shallow-body')
    const shallowPage = await bearer(request(admin).get(`/console/deliveries/dlv-shallow-body/${shallowStored!.bodySha256}`))
    expect(shallowPage.text).toContain('\n  &quot;trade_id&quot;: &quot;trd_shallow-body&quot;,\n')
  })

  it('re-indents a body without changing what it says: a repeated key, a number past a double, an escape stay as sent', async () => {
    // JSON.parse and stringify kept the last of two keys, rounded 12345678901234567890, made 1e400 null and 1.50 1.5
    const raw =
      '{"trade_id":"trd_faithful","status":"funded","status":"released","external_reference":"faithful-body",' +
      '"amount":12345678901234567890,"huge":1e400,"price":1.50,"name":"caf\\u00e9","empty":{},"list":[ ],"nested":{"a":[1,{"b":null}]}}'
    expect((await sendWebhook(app, { body: raw, deliveryId: 'dlv-faithful-body' })).status).toBe(200)
    const stored = await findDelivery(database.db, 'dlv-faithful-body')
    const page = await bearer(request(admin).get(`/console/deliveries/dlv-faithful-body/${stored!.bodySha256}`))
    expect(page.status).toBe(200)
    const shown = /<pre class="body">([\s\S]*?)<\/pre>/.exec(page.text)![1]!.replace(/&quot;/g, '"')
    expect(shown).toBe(
      [
        '{',
        '  "trade_id": "trd_faithful",',
        '  "status": "funded",',
        '  "status": "released",',
        '  "external_reference": "faithful-body",',
        '  "amount": 12345678901234567890,',
        '  "huge": 1e400,',
        '  "price": 1.50,',
        '  "name": "caf\\u00e9",',
        '  "empty": {},',
        '  "list": [],',
        '  "nested": {',
        '    "a": [',
        '      1,',
        '      {',
        '        "b": null',
        '      }',
        '    ]',
        '  }',
        '}',
      ].join('\n'),
    )
  })

  it('opens, and re-applies, a delivery whose id is a dot segment (`.`, `..`) through the links a browser follows', async () => {
    // a browser resolves the href against the page's URL as the WHATWG URL spec says (Node's URL does the same):
    // a dot segment in the path is removed, even percent-encoded
    const follow = (from: string, href: string) => {
      const url = new URL(href.replace(/&amp;/g, '&'), new URL(from, 'http://console.test'))
      return url.pathname + url.search
    }
    const hrefs = (page: string) => [...page.matchAll(/href="([^"]*)"/g)].map((match) => match[1]!)
    for (const [deliveryId, reference] of [['.', 'dot-one'], ['..', 'dot-two']] as const) {
      expect((await sendWebhook(app, { body: tradePayload(reference, 'funded'), deliveryId })).status).toBe(200)
      await database.db.insertInto('orders').values({ externalReference: reference }).execute()
      const stored = await findDelivery(database.db, deliveryId)

      const searchPath = `/console/deliveries?reference=${reference}`
      const search = await bearer(request(admin).get(searchPath))
      const link = hrefs(search.text).find((href) => href.includes(stored!.bodySha256))
      expect(link, 'a link to the delivery on the search').toBeDefined()
      const pagePath = follow(searchPath, link!)
      const page = await bearer(request(admin).get(pagePath))
      expect(page.status, pagePath).toBe(200)
      expect(page.text).toContain(`<code>${deliveryId}</code>`)
      expect(page.text).toContain(stored!.bodySha256)

      const reapplyLink = hrefs(page.text).find((href) => href.includes('reapply'))
      const confirmPath = follow(pagePath, reapplyLink!)
      const confirm = await bearer(request(admin).get(confirmPath))
      expect(confirm.status, confirmPath).toBe(200)
      const action = follow(confirmPath, /<form method="post" action="([^"]*)"/.exec(confirm.text.replace(/<header>[\s\S]*?<\/header>/, ''))![1]!)
      const done = await bearer(request(admin).post(action)).type('form').send(formFields(confirm.text))
      expect(done.status, action).toBe(200)
      expect(done.text).toContain('applied (order status funded)')
      expect((await findDelivery(database.db, deliveryId))?.outcome).toBe('applied')
      const back = hrefs(done.text).find((href) => href.includes(stored!.bodySha256))
      expect((await bearer(request(admin).get(follow(action, back!)))).status).toBe(200)
    }
  })

  // found from outside: the search offered lease_lost, a poll's outcome no stored delivery has, and found nothing
  it('offers every outcome a stored delivery can have, and not a poll’s lease_lost, as the CLI does', async () => {
    const page = await bearer(request(admin).get('/console/deliveries'))
    expect(page.status).toBe(200)
    expect(page.text).toContain('<option value="unmatched"')
    expect(page.text).toContain('<option value="dismissed"')
    expect(page.text).not.toContain('lease_lost')
    const refused = await bearer(request(admin).get('/console/deliveries?outcome=lease_lost'))
    expect(refused.status).toBe(400)
    expect(refused.text).toContain('outcome')
  })

  it('answers the query address of a delivery without its id or body, or with either twice, 400 naming it', async () => {
    const sha = '0'.repeat(64)
    for (const [query, field] of [[`body=${sha}`, 'id'], [`id=a&id=b&body=${sha}`, 'id'], ['id=a', 'body'], [`id=a&body=${sha}&body=${sha}`, 'body']]) {
      const answer = await bearer(request(admin).get(`/console/delivery?${query}`))
      expect(answer.status, query).toBe(400)
      expect(answer.text).toContain(`${field}:`)
    }
    expect((await bearer(request(admin).get(`/console/delivery?id=nothing&body=${sha}`))).status).toBe(404)
    expect((await bearer(request(admin).get(`/console/delivery/reapply?id=a%00b&body=${sha}`))).status).toBe(404)
  })

  // the run of a cycle whose process was killed keeps no end: it was shown `running`, 0 polled, until retention
  it('shows a run with no end long past its start unfinished, its counts unknown, and a recent one running', async () => {
    const dead = await startRun(database.db, { replica: 'killed:1', startedAt: new Date(Date.now() - 3_600_000) })
    const live = await startRun(database.db, { replica: 'polling:2', startedAt: new Date(Date.now() - 1_000) })
    try {
      const row = (page: string, id: number) => new RegExp(`<tr><td>${id}</td>.*?</tr>`).exec(page)?.[0]
      for (const path of ['/console/', '/console/reconcile']) {
        const page = (await bearer(request(admin).get(path))).text
        expect(row(page, dead), path).toMatch(
          /<td class="number"><span class="problem">unfinished<\/span><\/td><td class="number">-<\/td><td class="number">-<\/td><td class="number">-<\/td>/,
        )
        expect(row(page, live), path).toMatch(/<td class="number">running<\/td><td class="number">-<\/td><td class="number">-<\/td><td class="number">-<\/td>/)
        expect(page, path).toContain(
          'Unfinished: no end recorded 580 s after the start, past the longest a cycle runs: its process stopped (killed, its host lost) or lost the database.',
        )
      }
    } finally {
      await database.db.deleteFrom('reconcileRuns').where('id', 'in', [dead, live]).execute()
    }
  })

  // judged by the replica's own clock against the start another replica wrote, a console 10 minutes ahead called a
  // cycle under way unfinished ("its process stopped"), and one 10 minutes behind called a killed run running
  it.each([
    ['ahead', 600_000],
    ['behind', -600_000],
  ])("judges the runs by the database's time on a replica whose clock is 10 minutes %s", async (_side, offsetMs) => {
    const skewed = createAdminApp({
      config: testConfig({ ADMIN_TOKEN: TOKEN }),
      db: database.db,
      logger: testLogger([TOKEN]),
      clock: { now: () => Date.now() + offsetMs, monotonicNow: () => performance.now(), sleep: systemClock.sleep },
    })
    const dead = await startRun(database.db, { replica: 'killed:1', startedAt: new Date(Date.now() - 640_000) })
    const live = await startRun(database.db, { replica: 'polling:2', startedAt: new Date(Date.now() - 60_000) })
    try {
      const row = (page: string, id: number) => new RegExp(`<tr><td>${id}</td>.*?</tr>`).exec(page)?.[0]
      for (const path of ['/console/', '/console/reconcile']) {
        const page = (await bearer(request(skewed).get(path))).text
        expect(row(page, dead), path).toContain('<span class="problem">unfinished</span>')
        expect(row(page, live), path).toContain('<td class="number">running</td>')
      }
    } finally {
      await database.db.deleteFrom('reconcileRuns').where('id', 'in', [dead, live]).execute()
    }
  })

  describe('actions', () => {
    it('re-applies a parked delivery once its order exists, once however often the form is posted', async () => {
      expect((await sendWebhook(app, { body: tradePayload('late-1', 'funded'), deliveryId: 'dlv-late-1' })).status).toBe(200)
      // parked: the overview's advice names the way out for a reference that is not this backend's too ("create the
      // orders" would adopt another system's trade)
      const parked = (await bearer(request(admin).get('/console/'))).text
      expect(parked).toMatch(/\d+ parked deliveries/)
      expect(parked).toContain('Dismiss on a parked delivery')
      expect(parked).toContain('<code>deliveries dismiss REFERENCE</code>')
      // the order appears without the parked pass (a fork's own system created it)
      await database.db.insertInto('orders').values({ externalReference: 'late-1' }).execute()
      const delivery = await findDelivery(database.db, 'dlv-late-1')
      const path = `/console/deliveries/dlv-late-1/${delivery!.bodySha256}/reapply`

      const confirm = await bearer(request(admin).get(path))
      expect(confirm.status).toBe(200)
      const fields = formFields(confirm.text)
      const first = await bearer(request(admin).post(path)).type('form').send(fields)
      expect(first.status).toBe(200)
      expect(first.text).toContain('applied (order status funded)')
      const again = await bearer(request(admin).post(path)).type('form').send(fields)
      expect(again.text).toContain('already carried out')
      // the same form's id posted to another delivery's re-apply is that one's action, carried out
      expect((await sendWebhook(app, { body: tradePayload('late-1b', 'funded'), deliveryId: 'dlv-late-1b' })).status).toBe(200)
      await database.db.insertInto('orders').values({ externalReference: 'late-1b' }).execute()
      const other = await findDelivery(database.db, 'dlv-late-1b')
      const elsewhere = await bearer(request(admin).post(`/console/deliveries/dlv-late-1b/${other!.bodySha256}/reapply`)).type('form').send(fields)
      expect(elsewhere.text).not.toContain('already carried out')
      expect(elsewhere.text).toContain('applied (order status funded)')
      expect((await findDelivery(database.db, 'dlv-late-1b'))?.outcome).toBe('applied')

      const order = await findOrderByExternalReference(database.db, 'late-1')
      expect(order?.tradeStatus).toBe('funded')
      expect(await orderHistory(database.db, order!.id)).toHaveLength(1)
      expect((await findDelivery(database.db, 'dlv-late-1'))?.outcome).toBe('applied')
      // the action is on the overview, with who did it
      expect((await bearer(request(admin).get('/console/'))).text).toContain('re-apply delivery dlv-late-1')
    })

    // the overview's advice for a reference that is not this backend's named the CLI alone: the console could not clear them
    it('dismisses the parked deliveries of a reference from a parked delivery’s page, once however often the form is posted', async () => {
      const reference = `${HOSTILE_REFERENCE}-dismiss`
      for (const [n, status] of [[1, 'created'], [2, 'funded']] as const) {
        expect((await sendWebhook(app, { body: tradePayload(reference, status), deliveryId: `dlv-dismiss-${n}` })).status).toBe(200)
      }
      const delivery = (await findDelivery(database.db, 'dlv-dismiss-1'))!
      const page = (await bearer(request(admin).get(`/console/deliveries/dlv-dismiss-1/${delivery.bodySha256}`))).text
      const link = /href="([^"]*\/deliveries\/dismiss\?[^"]*)"/.exec(page)?.[1]?.replace(/&amp;/g, '&')
      expect(link).toBe(`/console/deliveries/dismiss?${new URLSearchParams([['reference', reference]]).toString()}`)
      const confirm = await bearer(request(admin).get(link!))
      expect(confirm.status).toBe(200)
      expect(confirm.text).toContain('<strong>2</strong> parked deliveries')
      expect(confirm.text).not.toContain(HOSTILE_REFERENCE)
      const fields = formFields(confirm.text)
      expect(fields.reference).toBe(reference)
      const first = await bearer(request(admin).post('/console/deliveries/dismiss')).type('form').send(fields)
      expect(first.status).toBe(200)
      expect(first.text).toContain('2 dismissed')
      expect(first.text).not.toContain(HOSTILE_REFERENCE)
      for (const id of ['dlv-dismiss-1', 'dlv-dismiss-2']) expect((await findDelivery(database.db, id))?.outcome, id).toBe('dismissed')
      expect((await bearer(request(admin).post('/console/deliveries/dismiss')).type('form').send(fields)).text).toContain('already carried out')
      // nothing parked any more: the confirm page says so, and the delivery's page offers no dismiss
      expect((await bearer(request(admin).get(link!))).status).toBe(404)
      expect((await bearer(request(admin).get(`/console/deliveries/dlv-dismiss-1/${delivery.bodySha256}`))).text).not.toContain('/deliveries/dismiss?')

      // a reference an order has: its deliveries are applied, not dismissed (refused on the confirm page and on the
      // post, an order created between the two)
      expect((await sendWebhook(app, { body: tradePayload('dismiss-ordered', 'funded'), deliveryId: 'dlv-dismiss-3' })).status).toBe(200)
      const ordered = formFields((await bearer(request(admin).get('/console/deliveries/dismiss?reference=dismiss-ordered'))).text)
      await database.db.insertInto('orders').values({ externalReference: 'dismiss-ordered' }).execute()
      const refused = await bearer(request(admin).post('/console/deliveries/dismiss')).type('form').send(ordered)
      expect(refused.status).toBe(409)
      expect(refused.text).toContain('its deliveries are applied, not dismissed')
      expect((await findDelivery(database.db, 'dlv-dismiss-3'))?.outcome).toBe('unmatched')
      expect((await bearer(request(admin).get('/console/deliveries/dismiss?reference=dismiss-ordered'))).status).toBe(409)
      // no reference: 400 naming the field
      const bare = await bearer(request(admin).get('/console/deliveries/dismiss'))
      expect(bare.status).toBe(400)
      expect(bare.text).toContain('reference: give the external reference')
      await database.db.deleteFrom('orders').where('externalReference', '=', 'dismiss-ordered').execute()
    })

    it('says why a delivery stored as invalid was, on its page and when re-applied, and applies nothing', async () => {
      // a trade event that contradicts itself, its event holding markup: text from outside, shown escaped
      const body = '{"event":"trade.released<b>x</b>","trade_id":"trd_console-inv","status":"funded","external_reference":"console-inv"}'
      expect((await sendWebhook(app, { body, deliveryId: 'dlv-console-invalid' })).status).toBe(200)
      await database.db.insertInto('orders').values({ externalReference: 'console-inv' }).execute()
      const delivery = await findDelivery(database.db, 'dlv-console-invalid')
      expect(delivery?.outcome).toBe('invalid')
      const reason = 'its event trade.released&lt;b&gt;x&lt;/b&gt; is not trade.{status} of its status'
      const page = await bearer(request(admin).get(`/console/deliveries/dlv-console-invalid/${delivery!.bodySha256}`))
      expect(page.text).toContain(`<dt>Why invalid</dt><dd>${reason}</dd>`)
      expect(page.text).not.toContain('<b>x</b>')
      const path = `/console/deliveries/dlv-console-invalid/${delivery!.bodySha256}/reapply`
      const ran = await bearer(request(admin).post(path)).type('form').send(formFields((await bearer(request(admin).get(path))).text))
      expect(ran.status).toBe(200)
      expect(ran.text).toContain(`nothing to re-apply: it was stored as invalid (${reason}), and nothing of an invalid payload is applied`)
      expect((await findDelivery(database.db, 'dlv-console-invalid'))?.outcome).toBe('invalid')
      expect((await findOrderByExternalReference(database.db, 'console-inv'))?.tradeStatus).toBeNull()
      await database.db.deleteFrom('orders').where('externalReference', '=', 'console-inv').execute()
    })

    it('refuses an action without the CSRF token, with another one, or from another origin, and changes nothing', async () => {
      expect((await sendWebhook(app, { body: tradePayload('late-2', 'funded'), deliveryId: 'dlv-late-2' })).status).toBe(200)
      await database.db.insertInto('orders').values({ externalReference: 'late-2' }).execute()
      const delivery = await findDelivery(database.db, 'dlv-late-2')
      const path = `/console/deliveries/dlv-late-2/${delivery!.bodySha256}/reapply`
      const fields = formFields((await bearer(request(admin).get(path))).text)
      const { csrf, ...withoutCsrf } = fields

      const refusals = [
        bearer(request(admin).post(path)).type('form').send(withoutCsrf),
        bearer(request(admin).post(path)).type('form').send({ ...withoutCsrf, csrf: 'f'.repeat(csrf!.length) }),
        // as many characters as the token, twice its bytes: this was a RangeError in the comparison, a 500
        bearer(request(admin).post(path)).type('form').send({ ...withoutCsrf, csrf: 'é'.repeat(csrf!.length) }),
        bearer(request(admin).post(path)).set('Origin', 'http://evil.example').type('form').send(fields),
        bearer(request(admin).post(path)).set('Sec-Fetch-Site', 'cross-site').type('form').send(fields),
        // basic auth is sent by browsers on their own: its forms need the token as much
        request(admin).post(path).set('Authorization', basic('ops', TOKEN)).type('form').send(withoutCsrf),
      ]
      for (const refusal of refusals) expect((await refusal).status).toBe(403)
      // a form in a charset the console does not read
      const utf7 = await bearer(request(admin).post(path)).set('Content-Type', 'application/x-www-form-urlencoded; charset=utf-7').send('a=1')
      expect([utf7.status, utf7.body.error?.code]).toEqual([415, 'unsupported_media_type'])
      expect((await findDelivery(database.db, 'dlv-late-2'))?.outcome).toBe('unmatched')
    })

    it('offers the run after a bulk re-apply of the oldest 1,000 that starts where it stopped, until none is left', async () => {
      // 1,002 ignored deliveries, then a parked one whose order now exists, in one range: each run the oldest 1,000
      // again (the earlier version) never reached the parked one
      // the range holds this test's deliveries alone: the file's earlier tests stored theirs before `from`
      const from = new Date()
      const rows = Array.from({ length: 1_002 }, (_, i) => ({
        deliveryId: `bulk-next-${String(i).padStart(4, '0')}`,
        bodySha256: i.toString(16).padStart(64, 'a'),
        receivedAt: from,
        eventType: 'seller.verified',
        rawBody: '{}',
        outcome: 'ignored' as const,
      }))
      await database.db.insertInto('webhookDeliveries').values(rows).execute()
      expect((await sendWebhook(app, { body: tradePayload('bulk-next-order', 'funded'), deliveryId: 'bulk-next-parked' })).status).toBe(200)
      await database.db.insertInto('orders').values({ externalReference: 'bulk-next-order' }).execute()
      const range = { from: from.toISOString(), to: new Date(Date.now() + 60_000).toISOString() }
      try {
        const first = await bearer(request(admin).get('/console/deliveries/reapply').query(range))
        expect(first.text).toContain('1003 deliveries match')
        const ran = await bearer(request(admin).post('/console/deliveries/reapply')).type('form').send(formFields(first.text))
expect(ran.text).toContain('1000 deliveries re-applied: not a trade event 1000')
        const next = /<a href="([^"]+)">Re-apply the next ones/.exec(ran.text)?.[1]?.replace(/&amp;/g, '&')
        expect(next).toBeDefined()

        const second = await bearer(request(admin).get(next!))
        expect(second.text).toContain('3 deliveries match, received after the last one the previous run re-applied')
        const rest = await bearer(request(admin).post('/console/deliveries/reapply')).type('form').send(formFields(second.text))
        expect(rest.text).toContain('3 deliveries re-applied: not a trade event 2, applied 1')
        expect(rest.text).toContain('That was every matching delivery.')
        expect((await findDelivery(database.db, 'bulk-next-parked'))?.outcome).toBe('applied')
        expect((await findOrderByExternalReference(database.db, 'bulk-next-order'))?.tradeStatus).toBe('funded')
      } finally {
        await database.db.deleteFrom('webhookDeliveries').where('deliveryId', 'like', 'bulk-next-%').execute()
      }
    })

    it('bulk re-applies by filter and time range after a dry run that counts what would change', async () => {
      const from = new Date()
      for (const reference of ['bulk-1', 'bulk-2', 'bulk-3']) {
        expect((await sendWebhook(app, { body: tradePayload(reference, 'funded') })).status).toBe(200)
      }
      await database.db.insertInto('orders').values([{ externalReference: 'bulk-1' }, { externalReference: 'bulk-2' }]).execute()

      const noRange = await bearer(request(admin).get('/console/deliveries/reapply').query({ outcome: 'unmatched' }))
      expect(noRange.status).toBe(400)
      // the list offers the bulk re-apply only where it has a range to take, not a link to that 400
      const listed = await bearer(request(admin).get('/console/deliveries').query({ outcome: 'unmatched' }))
      expect(listed.text).not.toContain('/deliveries/reapply?')
      expect(listed.text).toContain('Bulk re-apply: give a time range (from, to or both) first.')
      const ranged = await bearer(request(admin).get('/console/deliveries').query({ outcome: 'unmatched', from: from.toISOString() }))
      expect(ranged.text).toContain('/deliveries/reapply?')

      const query = { outcome: 'unmatched', from: from.toISOString() }
      const dryRun = await bearer(request(admin).get('/console/deliveries/reapply').query(query))
      expect(dryRun.status).toBe(200)
      expect(dryRun.text).toContain('3 deliveries match')
      expect(dryRun.text).toContain('2 can now be applied to their order; 1 stay parked')
      // a dry run changes nothing
      expect((await findOrderByExternalReference(database.db, 'bulk-1'))?.tradeStatus).toBeNull()

      const run = await bearer(request(admin).post('/console/deliveries/reapply')).type('form').send(formFields(dryRun.text))
      expect(run.status).toBe(200)
      expect(run.text).toContain('3 deliveries re-applied: applied 2, unmatched 1')
      expect((await findOrderByExternalReference(database.db, 'bulk-2'))?.tradeStatus).toBe('funded')
    })

    // found from outside: the key was the path alone, so one id posted to the query address of two deliveries, or to
    // requeue two references, was answered "already carried out" for the second, which was never acted on
    it('takes one action id posted to another delivery’s query address, or to requeue another reference, as that action', async () => {
      const shas: string[] = []
      for (const reference of ['late-q1', 'late-q2']) {
        expect((await sendWebhook(app, { body: tradePayload(reference, 'funded'), deliveryId: `dlv-${reference}` })).status).toBe(200)
        await database.db.insertInto('orders').values({ externalReference: reference }).execute()
        shas.push((await findDelivery(database.db, `dlv-${reference}`))!.bodySha256)
      }
      const address = (n: number) => `/console/delivery/reapply?id=dlv-late-q${n + 1}&body=${shas[n]}`
      const fields = formFields((await bearer(request(admin).get(address(0)))).text)
      const first = await bearer(request(admin).post(address(0))).type('form').send(fields)
      expect(first.text).toContain('applied (order status funded)')
      expect((await bearer(request(admin).post(address(0))).type('form').send(fields)).text).toContain('already carried out')
      const second = await bearer(request(admin).post(address(1))).type('form').send(fields)
      expect(second.text).not.toContain('already carried out')
      expect(second.text).toContain('applied (order status funded)')
      expect((await findDelivery(database.db, 'dlv-late-q2'))?.outcome).toBe('applied')

      await database.db
        .insertInto('orders')
        .values(['flag-q1', 'flag-q2'].map((reference) => ({ externalReference: reference, tradeId: `trd_${reference}`, attention: 'trade_not_found' })))
        .execute()
      const requeue = formFields((await bearer(request(admin).get('/console/orders/requeue?reference=flag-q1'))).text)
      expect((await bearer(request(admin).post('/console/orders/requeue')).type('form').send(requeue)).text).toContain('1 due now')
      const other = await bearer(request(admin).post('/console/orders/requeue')).type('form').send({ ...requeue, reference: 'flag-q2' })
      expect(other.text).not.toContain('already carried out')
      expect(other.text).toContain('1 due now')
      for (const reference of ['flag-q1', 'flag-q2']) expect((await findOrderByExternalReference(database.db, reference))?.attention, reference).toBeNull()
      await database.db.deleteFrom('orders').where('externalReference', 'in', ['flag-q1', 'flag-q2']).execute()
    })

    it('requeues the flagged orders, trade_not_found and trade_mismatch alike', async () => {
      await database.db
        .insertInto('orders')
        .values([
          { externalReference: 'flagged-1', tradeId: 'trd_flagged-1', attention: 'trade_not_found' },
          { externalReference: 'flagged-2', tradeId: 'trd_flagged-2', attention: 'trade_mismatch' },
        ])
        .execute()
      const overview = await bearer(request(admin).get('/console/'))
      expect(overview.text).toContain('2 order(s) flagged')
      expect(overview.text).toContain('trade_mismatch: 1, trade_not_found: 1')
      const flagged = await bearer(request(admin).get('/console/orders?attention=1'))
      expect(flagged.text).toContain('flagged-2')
      const confirm = await bearer(request(admin).get('/console/orders/requeue'))
      expect(confirm.text).toContain('<strong>2</strong> now')
      const done = await bearer(request(admin).post('/console/orders/requeue')).type('form').send(formFields(confirm.text))
      expect(done.text).toContain('2 due now')
      for (const reference of ['flagged-1', 'flagged-2']) {
        const order = await findOrderByExternalReference(database.db, reference)
        expect(order?.attention, reference).toBeNull()
        expect(order?.nextPollAt, reference).not.toBeNull()
      }
      // the next test's cycle polls flagged-1 alone
      await database.db.deleteFrom('orders').where('externalReference', '=', 'flagged-2').execute()
    })

    // Through an outage of the platform every open order is held or backing off: the count stops at DUE_COUNT_CAP, and
    // the overview says so rather than a number that reads as exact
    it(`shows the orders due to poll past ${DUE_COUNT_CAP.toLocaleString('en')} as ${DUE_COUNT_CAP.toLocaleString('en')}+`, async () => {
      await sql`insert into orders (external_reference, trade_id, trade_status, status_rank, next_poll_at, trade_create_state)
        select 'due-cap-' || n, 'tr_due_cap_' || n, 'funded', 20, now() - interval '1 hour', 'created'
        from generate_series(1, ${DUE_COUNT_CAP + 1}::integer) as n`.execute(database.db)
      try {
        const overview = (await bearer(request(admin).get('/console/'))).text
        expect(overview).toContain(`<span class="figure">${DUE_COUNT_CAP.toLocaleString('en')}+</span> orders due to poll`)
      } finally {
        await database.db.deleteFrom('orders').where('externalReference', 'like', 'due-cap-%').execute()
      }
    })

    it('runs one reconcile cycle now and lists it among the runs', async () => {
      const page = await bearer(request(admin).get('/console/reconcile'))
      const run = await bearer(request(admin).post('/console/reconcile/run')).type('form').send(formFields(page.text))
      expect(run.status).toBe(200)
      expect(run.text).toMatch(/run \d+: claimed 1, polled 1/)
      expect(fetcher.calls.some((call) => call.method === 'getTrade' && call.args[0] === 'trd_flagged-1')).toBe(true)
      expect((await bearer(request(admin).get('/console/reconcile'))).text).toContain('console-test')
    })

    it("says, as reconcile --once does, how many due orders another poller's lease holds and until when", async () => {
      // due, and claimed by a cycle whose process stopped: its lease has a minute and a half to run
      const leaseEnd = new Date(Math.floor(Date.now() / 1000) * 1000 + 90_000)
      const references = ['held-elsewhere-1', 'held-elsewhere-2']
      await database.db
        .insertInto('orders')
        .values(
          references.map((reference) => ({
            externalReference: reference,
            tradeId: `tr_${reference}`,
            nextPollAt: leaseEnd,
            pollLeaseToken: 'another-poller',
            pollLeaseExpiresAt: leaseEnd,
          })),
        )
        .execute()
      try {
        const page = await bearer(request(admin).get('/console/reconcile'))
        const fields = formFields(page.text)
        const run = await bearer(request(admin).post('/console/reconcile/run')).type('form').send(fields)
        expect(run.status).toBe(200)
        const line =
          `left 2 due order(s) leased by another poller&#39;s cycle, due again by ${leaseEnd.toISOString()} as its lease ends ` +
          '(a cycle under way, or one whose process stopped: the Reconcile page&#39;s last runs)'
        expect(run.text).toMatch(new RegExp(`<p class="result">run \\d+: claimed 0, polled 0, changed 0, errors 0; ${line.replace(/[()]/g, '\\$&')}</p>`))
        // the same form again: the result remembered, the line with it
        const again = await bearer(request(admin).post('/console/reconcile/run')).type('form').send(fields)
        expect(again.text).toContain('This action was already carried out; nothing was done again.')
        expect(again.text).toContain(line)
        expect(fetcher.calls.some((call) => call.method === 'getTrade' && references.includes(String(call.args[0]).replace(/^tr_/, '')))).toBe(false)
      } finally {
        await database.db.deleteFrom('orders').where('externalReference', 'in', references).execute()
      }
      // none held: no line
      const page = await bearer(request(admin).get('/console/reconcile'))
      const run = await bearer(request(admin).post('/console/reconcile/run')).type('form').send(formFields(page.text))
      expect(run.text).toMatch(/run \d+: claimed 0/)
      expect(run.text).not.toContain('leased by another poller')
    })

    it('says why the cycle it ran failed to poll an order, the order named as text', async () => {
      const reference = 'unanswered-<b>1</b>'
      await database.db
        .insertInto('orders')
        .values({ externalReference: reference, tradeId: `tr_${reference}`, nextPollAt: new Date(Date.now() - 1_000) })
        .execute()
      try {
        const page = await bearer(request(admin).get('/console/reconcile'))
        const run = await bearer(request(admin).post('/console/reconcile/run')).type('form').send(formFields(page.text))
        expect(run.status).toBe(200)
        expect(run.text).toMatch(/run \d+: claimed 1, polled 1, changed 0, errors 1/)
        expect(run.text).toContain(
          'first error, order unanswered-&lt;b&gt;1&lt;/b&gt;: the platform: the platform did not answer within 10000 ms',
        )
        expect(run.text).not.toContain('<b>1</b>')
      } finally {
        await database.db.deleteFrom('orders').where('externalReference', '=', reference).execute()
      }
    })

    it('runs a form posted twice at once (a double click) once, the second post waiting for the first', async () => {
      let cycles = 0
      const finishCycles: (() => void)[] = []
      let cycleStarted!: () => void
      const started = new Promise<void>((resolve) => (cycleStarted = resolve))
      const held = express()
      let secondReceived: Promise<void> | undefined
      held.use((req, _res, next) => {
        // the second post's body is read by the time its 'end' comes; the console's checks follow within a turn
        if (cycles > 0) secondReceived = new Promise((resolve) => req.on('end', () => setImmediate(() => setImmediate(resolve))))
        next()
      })
      held.use(
        createAdminApp({
          config: testConfig({ ADMIN_TOKEN: TOKEN }),
          db: database.db,
          logger: testLogger([TOKEN]),
          reconcileOnce: async () => {
            cycles++
            cycleStarted()
            await new Promise<void>((resolve) => finishCycles.push(resolve))
            const at = new Date()
            return { runId: cycles, replica: 'held', startedAt: at, finishedAt: at, claimed: 0, polled: 0, changed: 0, errors: 0, released: 0, results: {} as RunSummary['results'], stoppedReason: null, throttledUntil: null, clockOffsetS: null, firstFailure: null, flaggedCreates: [] }
          },
        }),
      )
      const fields = formFields((await bearer(request(held).get('/console/reconcile'))).text)
      const post = () => bearer(request(held).post('/console/reconcile/run')).type('form').send(fields).then((response) => response)
      const first = post()
      await started
      const second = post()
      while (!secondReceived) await new Promise((resolve) => setImmediate(resolve))
      await secondReceived
      for (const finish of finishCycles) finish()
      const answers = await Promise.all([first, second])
      expect(cycles).toBe(1)
      expect(answers.map((answer) => answer.status)).toEqual([200, 200])
      expect(answers[1]!.text).toContain('This action was already carried out; nothing was done again.')
      expect(answers[1]!.text).toContain('run 1: claimed 0')
    })
  })

  it('pages through deliveries received in the same microsecond without skipping or repeating one', async () => {
    const receivedAt = new Date('2026-01-02T03:04:05.678Z')
    for (let index = 0; index < 120; index++) {
      await recordDelivery(database.db, {
        deliveryId: `page-${String(index).padStart(3, '0')}`,
        bodySha256: index.toString(16).padStart(64, '0'),
        eventType: 'seller.updated',
        rawBody: '{}',
        outcome: 'ignored',
        receivedAt,
      })
    }
    const seen: string[] = []
    let next: string | undefined = '/console/deliveries?event=seller.updated'
    while (next) {
      const response = await bearer(request(admin).get(next))
      expect(response.status).toBe(200)
      seen.push(...[...response.text.matchAll(/>(page-\d{3})<\/a>/g)].map((match) => match[1]!))
      next = /<a rel="next" href="([^"]+)"/.exec(response.text)?.[1]?.replace(/&amp;/g, '&')
    }
    expect(seen).toHaveLength(120)
    expect(new Set(seen).size).toBe(120)
  })

  it('answers a bad filter with 400 and says which field', async () => {
    const response = await bearer(request(admin).get('/console/deliveries').query({ from: 'yesterday' }))
    expect(response.status).toBe(400)
    expect(response.text).toContain('is not a time')
    const cursor = await bearer(request(admin).get('/console/deliveries').query({ after: 'garbage' }))
    expect(cursor.status).toBe(400)
    // a day its month does not have was read as one of the next month's (Feb 31 as March 3), a bulk re-apply's range too
    for (const [path, query] of [
      ['/console/deliveries', { from: '2026-02-31T00:00' }],
      ['/console/deliveries', { to: '2026-04-31' }],
      ['/console/deliveries/reapply', { from: '2026-02-29T00:00Z' }],
    ] as const) {
      const refused = await bearer(request(admin).get(path).query(query))
      expect(refused.status, JSON.stringify(query)).toBe(400)
      expect(refused.text, JSON.stringify(query)).toContain('names a day its month does not have')
    }
    expect((await bearer(request(admin).get('/console/deliveries').query({ from: '2028-02-29T00:00', to: '2026-12-31' }))).status).toBe(200)
  })

  it('answers a time no column can hold (year 0, past 9999, before year 1) with 400 naming the field, without the database', async () => {
    for (const [path, query, field] of [
      ['/console/deliveries', { from: '0000-01-01T00:00' }, 'from: '],
      ['/console/deliveries', { from: '+275760-09-13T00:00:00.000Z' }, 'from: '],
      ['/console/deliveries', { to: '+010000-01-01T00:00:00Z' }, 'to: '],
      ['/console/deliveries', { to: '-000001-01-01T00:00:00Z' }, 'to: '],
      ['/console/deliveries/reapply', { from: '0000-06-01T00:00' }, 'from: '],
    ] as const) {
      const response = await bearer(request(admin).get(path).query(query))
      expect(response.status, JSON.stringify(query)).toBe(400)
      expect(response.type, JSON.stringify(query)).toBe('text/html')
      expect(response.text, JSON.stringify(query)).toContain(field)
      expect(response.text, JSON.stringify(query)).toContain('years 1 to 9999')
    }
    // the bounds themselves are times
    expect((await bearer(request(admin).get('/console/deliveries').query({ from: '0001-01-01T00:00', to: '9999-12-31T23:59' }))).status).toBe(200)
  })

  it('answers an id no row can have with 404, and a page cursor or search text no row can match with 400 naming the field', async () => {
    // orders.id is an integer and reaction_jobs.id a bigint; Postgres text holds no NUL
    for (const path of ['/console/orders/2147483648', '/console/reactions/9223372036854775808', '/console/reactions/9999999999999999999/retry', `/console/deliveries/a%00b/${'0'.repeat(64)}`]) {
      const response = await bearer(request(admin).get(path))
      expect(response.status, path).toBe(404)
      expect(response.text, path).toContain('<p class="problem">No such')
    }
    const cases: [string, Record<string, string>, string][] = [
      ['/console/orders', { before: '2147483648' }, 'before: '],
      ['/console/reactions', { before: '9223372036854775808' }, 'before: not a page cursor from this console'],
      ['/console/deliveries', { reference: 'a\u0000b' }, 'reference: must not hold a NUL character'],
      ['/console/orders', { status: '\u0000' }, 'status: must not hold a NUL character'],
      ['/console/reactions', { handler: 'x\u0000' }, 'handler: must not hold a NUL character'],
      ['/console/reactions/first-attempts', { handler: 'x\u0000' }, 'handler: must not hold a NUL character'],
      // a batch id past bigint: the database's refusal before, JSON naming no field
      ['/console/reactions/first-attempts', { before: '9223372036854775808.1' }, 'before: not a page cursor from this console'],
      ['/console/orders/requeue', { reference: '\u0000' }, 'reference: must not hold a NUL character'],
      // hand-made delivery page cursors: a NUL in the id, a day that does not exist, a time the console never writes
      ...[
        ['2026-11-27T08:00:00.000000Z', 'a\u0000b', 'f'.repeat(64)],
        ['2026-02-31T08:00:00.000000Z', 'dlv-1', 'f'.repeat(64)],
        ['Fri, 27 Nov 2026 08:00:00 GMT', 'dlv-1', 'f'.repeat(64)],
        ['2026-11-27T08:00:00.000000Z', 'dlv-1', 'not a digest'],
        // a year Date takes and the database has not
        ['0000-01-01T00:00:00.000000Z', 'dlv-1', 'f'.repeat(64)],
      ].map((cursor): [string, Record<string, string>, string] => [
        '/console/deliveries',
        { after: Buffer.from(JSON.stringify(cursor)).toString('base64url') },
        'after: not a page cursor from this console',
      ]),
    ]
    for (const [path, query, problem] of cases) {
      const response = await bearer(request(admin).get(path).query(query))
      expect(response.status, path).toBe(400)
      expect(response.type, path).toBe('text/html')
      expect(response.text, path).toContain(problem)
    }
  })

  it("answers an address whose percent-encoding is malformed with the console's 400 page, the value escaped, not JSON", async () => {
    const paths = [
      ['/console/orders/%E0%A4%A', '%E0%A4%A'],
      ['/console/reactions/%ZZ/retry', '%ZZ'],
      [`/console/deliveries/dlv-1%/${'0'.repeat(64)}`, 'dlv-1%'],
      [`/console/deliveries/%3Cb%3E%/${'0'.repeat(64)}/reapply`, '%3Cb%3E%'],
    ]
    for (const [path, value] of paths) {
      const response = await bearer(request(admin).get(path!))
      expect(response.status, path).toBe(400)
      expect(response.type, path).toBe('text/html')
      expect(response.text, path).toContain('<title>Bad request')
      expect(response.text, path).toContain(`<p class="problem">Not a valid percent-encoding in the address: ${value}</p>`)
    }
    // what the path holds unencoded is shown as text
    const raw = await bearer(request(admin).get("/console/orders/a&b'%E0"))
    expect(raw.status).toBe(400)
    expect(raw.text).toContain('in the address: a&amp;b&#39;%E0</p>')
    // without the token it is the login, as for any console page
    const anonymous = await request(admin).get('/console/orders/%E0%A4%A')
    expect(anonymous.status).toBe(401)
    expect(anonymous.text).toContain('name="token"')
  })

  // the JSON error shape (a 500 before a refused connection was read as one) is no page for someone on call
  it('answers every page 503 with a readable page saying to try again while the database cannot be reached', async () => {
    const closed = net.createServer()
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve))
    const { port } = closed.address() as net.AddressInfo
    await new Promise((resolve) => closed.close(resolve))
    const unreachable = new Kysely<Database>({ dialect: new PostgresDialect({ pool: new pg.Pool({ host: '127.0.0.1', port, user: 'x', database: 'x' }) }) })
    try {
      const gone = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: unreachable, logger: testLogger([TOKEN]) })
      for (const path of ['/console/', '/console/deliveries', '/console/orders/1', '/console/reactions', '/console/reconcile']) {
        const response = await bearer(request(gone).get(path))
        expect([response.status, response.type], path).toEqual([503, 'text/html'])
        expect(response.headers['retry-after'], path).toBe('5')
        expect(response.headers['cache-control'], path).toBe('no-store')
        expect(response.text, path).toContain('<title>Try again shortly')
        expect(response.text, path).toContain('The database is unavailable; retry later (database_unavailable).')
      }
    } finally {
      await unreachable.destroy()
    }
  })

  it('says to restart the service, not to try again, when the embedded database has stopped for good', async () => {
    const stopped = new Error("PGlite is closed: the embedded database's thread exited with code 7")
    const pool = { connect: () => Promise.reject(stopped), end: () => Promise.resolve() }
    const gone = new Kysely<Database>({ dialect: new PostgresDialect({ pool: pool as unknown as pg.Pool }) })
    const admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: gone, logger: testLogger([TOKEN]) })
    const response = await bearer(request(admin).get('/console/'))
    expect([response.status, response.type, response.headers['retry-after']]).toEqual([503, 'text/html', undefined])
    expect(response.text).toContain('The embedded database stopped (its thread exited with code 7); restart the service (database_unavailable).')
  })

  it('shows an order with its timeline and the channel of each change', async () => {
    const order = await findOrderByExternalReference(database.db, 'late-1')
    const page = await bearer(request(admin).get(`/console/orders/${order!.id}`))
    expect(page.status).toBe(200)
    expect(page.text).toMatch(/<td>—<\/td><td>funded<\/td><td>webhook<\/td><td>dlv-late-1<\/td>/)
  })
})

describe('operator console: reactions', () => {
  let database: TestDatabase
  let admin: App
  const jobs: Record<string, string> = {}
  const HOSTILE_ERROR = 'Error: CRM said <script>window.pwned=5</script>\n    at "><img src=x onerror=alert(6)>'
  const bearer = (call: request.Test) => call.set('Authorization', `Bearer ${TOKEN}`)
  const stateOf = async (id: string) =>
    (await database.db.selectFrom('reactionJobs').select(['state', 'attempts']).where('id', '=', id).executeTakeFirstOrThrow())
  /** What a dispatcher leaves after the last attempt threw (written directly: the claim is the dispatcher's). */
  const fail = async (id: string, error: string) => {
    await database.db
      .updateTable('reactionJobs')
      .set({ state: 'failed', attempts: 5, lastError: error, finishedAt: new Date() })
      .where('id', '=', id)
      .execute()
  }

  beforeAll(async () => {
    database = await createTestDatabase()
    admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: database.db, logger: testLogger([TOKEN]) })
    const reactions = createReactionRegistry().on('trade.*', 'ledger', async () => {}).on('trade.funded', 'crm-sync', async () => {})
    for (const reference of ['react-1', 'react-2', 'react-3']) {
      const { order } = await createOrder(database.db, { externalReference: reference })
      for (const status of ['created', 'funded']) {
        await applyObservation(
          database.db,
          { target: { orderId: order.id }, tradeId: `trd_${reference}`, status, source: 'webhook', observedAt: new Date() },
          { staleAfterS: 3_600, handlersFor: reactions.handlersFor },
        )
      }
    }
    await writeJobRows(database.db, reactions)
    const rows = await database.db
      .selectFrom('reactionJobs as job')
      .innerJoin('orderStatusHistory as event', 'event.eventId', 'job.eventId')
      .select(['job.id', 'job.handler', 'job.sequence', 'event.externalReference'])
      .execute()
    for (const row of rows) jobs[`${row.externalReference}/${row.handler}/${row.sequence}`] = String(row.id)
    expect(Object.keys(jobs)).toHaveLength(9)
    await database.db.updateTable('reactionJobs').set({ state: 'done', attempts: 1, finishedAt: new Date() }).where('handler', '=', 'ledger').execute()
    await fail(jobs['react-1/crm-sync/2']!, HOSTILE_ERROR)
    await fail(jobs['react-2/crm-sync/2']!, 'Error: CRM unavailable (503)')
  })
  afterAll(async () => {
    await database.close()
  })

  it('puts failed reactions at the top of the overview, with the ones still to run and the oldest age', async () => {
    const page = await bearer(request(admin).get('/console/'))
    expect(page.status).toBe(200)
    const attention = /<section class="attention">([\s\S]*?)<\/section>/.exec(page.text)?.[1]
    expect(attention).toContain('2 failed reaction(s)</a>')
    expect(attention).toContain('crm-sync: 2')
    expect(page.text).toMatch(/<span class="figure">1<\/span> <a href="\/console\/reactions\?state=pending">reactions to run<\/a><br>oldest \d+ s/)
  })

  it('lists reactions by state and by handler, newest first, the last error shown as text', async () => {
    const failed = await bearer(request(admin).get('/console/reactions').query({ state: 'failed' }))
    expect(failed.status).toBe(200)
    const listed = [...failed.text.matchAll(/<a href="\/console\/reactions\/(\d+)">/g)].map((match) => match[1])
    expect(listed).toEqual([jobs['react-2/crm-sync/2'], jobs['react-1/crm-sync/2']])
    expect(failed.text).not.toContain('<script>window.pwned')
    expect(failed.text).toContain('Error: CRM said &lt;script&gt;window.pwned=5&lt;/script&gt;')
    expect(failed.text).toContain('Retry every failed reaction (2)')

    const ledger = await bearer(request(admin).get('/console/reactions').query({ handler: 'ledger', state: 'done' }))
    expect([...ledger.text.matchAll(/<td>ledger<\/td>/g)]).toHaveLength(6)
    expect(ledger.text).not.toContain('<td>crm-sync</td>')

    expect((await bearer(request(admin).get('/console/reactions').query({ state: 'lost' }))).status).toBe(400)
    expect((await bearer(request(admin).get('/console/reactions').query({ before: '1 or 1=1' }))).status).toBe(400)
  })

  it('pages through every job without skipping or repeating one', async () => {
    const seen: string[] = []
    let next: string | undefined = '/console/reactions'
    let pages = 0
    while (next) {
      const response = await bearer(request(admin).get(next))
      expect(response.status).toBe(200)
      pages++
      seen.push(...[...response.text.matchAll(/<td><a href="\/console\/reactions\/(\d+)">/g)].map((match) => match[1]!))
      next = /<a rel="next" href="([^"]+)"/.exec(response.text)?.[1]?.replace(/&amp;/g, '&')
    }
    expect(pages).toBe(1)
    expect(seen).toEqual(Object.values(jobs).sort((a, b) => Number(b) - Number(a)))
  })

  it('shows a job: its event, handler, attempts, state and the whole last error escaped', async () => {
    const page = await bearer(request(admin).get(`/console/reactions/${jobs['react-1/crm-sync/2']}`))
    expect(page.status).toBe(200)
    expect(page.text).toContain('<strong>crm-sync</strong>')
    expect(page.text).toContain('<strong>trade.funded</strong>')
    expect(page.text).toContain('after 5 attempt(s)')
    expect(page.text).toContain('react-1</a>, sequence 2')
    expect(page.text).not.toContain('<img')
    expect(page.text).toContain('&quot;&gt;&lt;img src=x onerror=alert(6)&gt;')
    expect(page.text).toContain('/retry">Retry now…</a>')
    expect((await bearer(request(admin).get('/console/reactions/999999'))).status).toBe(404)
    expect((await bearer(request(admin).get('/console/reactions/abc'))).status).toBe(404)
  })

  // the CLI's `reactions list` and `show` said it; the console showed such a job as pending, due in the past
  it('says, on the list and on its page, which earlier failed job of its order a pending job waits for, with a link', async () => {
    const failed = jobs['react-3/ledger/1']!
    const held = jobs['react-3/ledger/2']!
    try {
      await database.db.updateTable('reactionJobs').set({ state: 'failed', finishedAt: new Date() }).where('id', '=', failed).execute()
      await database.db.updateTable('reactionJobs').set({ state: 'pending', attempts: 0, finishedAt: null, runAt: new Date(0) }).where('id', '=', held).execute()
      const link = `<a href="/console/reactions/${failed}">job ${failed}</a>`
      const list = await bearer(request(admin).get('/console/reactions').query({ state: 'pending' }))
      const row = new RegExp(`<tr>\\s*<td><a href="/console/reactions/${held}">[\\s\\S]*?</tr>`).exec(list.text)?.[0]
      expect(row).toContain(`<td>waits for ${link} (failed), an earlier event of its order</td>`)
      // the pending job that waits for nothing but its time says its time
      expect(list.text).not.toContain(`waits for <a href="/console/reactions/${jobs['react-3/crm-sync/2']}">`)
      const page = await bearer(request(admin).get(`/console/reactions/${held}`))
      expect(page.text).toContain(`<dt>Runs</dt><dd>once ${link} (sequence 1, failed) is done or skipped`)
      expect(page.text).not.toContain('next at')
      const free = await bearer(request(admin).get(`/console/reactions/${jobs['react-3/crm-sync/2']}`))
      expect(free.text).toContain('<dt>Runs</dt><dd>next at')
    } finally {
      await database.db.updateTable('reactionJobs').set({ state: 'done', attempts: 1, finishedAt: new Date() }).where('id', 'in', [failed, held]).execute()
    }
  })

  it("shows on an order's timeline the reactions each status change caused", async () => {
    const order = await findOrderByExternalReference(database.db, 'react-1')
    const page = await bearer(request(admin).get(`/console/orders/${order!.id}`))
    const rows = [...page.text.matchAll(/<tr><td>[^<]*<\/td><td>[^<]*<\/td><td>(created|funded)<\/td>[\s\S]*?<\/tr>/g)].map((match) => match[0])
    expect(rows).toHaveLength(2)
    expect(rows[0]).toContain(`<a href="/console/reactions/${jobs['react-1/ledger/1']}">ledger</a> <span class="outcome done">done</span>`)
    expect(rows[0]).not.toContain('crm-sync')
    expect(rows[1]).toContain('ledger</a> <span class="outcome done">done</span>')
    expect(rows[1]).toContain(`<a href="/console/reactions/${jobs['react-1/crm-sync/2']}">crm-sync</a> <span class="outcome failed">failed</span>`)
  })

  it('retries a failed reaction once however often the form is posted, and refuses one that is done', async () => {
    const id = jobs['react-1/crm-sync/2']!
    const confirm = await bearer(request(admin).get(`/console/reactions/${id}/retry`))
    expect(confirm.status).toBe(200)
    expect(confirm.text).toContain('now failed after 5 attempt(s)')
    const fields = formFields(confirm.text)
    const first = await bearer(request(admin).post(`/console/reactions/${id}/retry`)).type('form').send(fields)
    expect(first.status).toBe(200)
    expect(first.text).toContain(`job ${id} runs again now`)
    expect(await stateOf(id)).toEqual({ state: 'pending', attempts: 0 })
    // the dispatcher ran it meanwhile; the same form again does nothing
    await database.db.updateTable('reactionJobs').set({ state: 'done', attempts: 1 }).where('id', '=', id).execute()
    const again = await bearer(request(admin).post(`/console/reactions/${id}/retry`)).type('form').send(fields)
    expect(again.text).toContain('already carried out')
    expect(await stateOf(id)).toEqual({ state: 'done', attempts: 1 })
    // a new form on a done job: refused by the CLI's own rule
    const late = await bearer(request(admin).post(`/console/reactions/${id}/retry`)).type('form').send({ ...fields, action_id: 'a'.repeat(32) })
    expect(late.status).toBe(409)
    expect(late.text).toContain(`job ${id} is done: only a failed or pending job can be retried`)
    expect(await stateOf(id)).toEqual({ state: 'done', attempts: 1 })
    // the same refused form again is refused again, and no refusal is listed among the actions done
    const lateAgain = await bearer(request(admin).post(`/console/reactions/${id}/retry`)).type('form').send({ ...fields, action_id: 'a'.repeat(32) })
    expect([lateAgain.status, lateAgain.text.includes('already carried out')]).toEqual([409, false])
    const missing = { ...fields, action_id: 'b'.repeat(32) }
    for (let i = 0; i < 2; i++) expect((await bearer(request(admin).post('/console/reactions/999999/retry')).type('form').send(missing)).status).toBe(404)
    const overview = (await bearer(request(admin).get('/console/'))).text
    expect(overview).not.toContain('no reaction job 999999')
    expect(overview).not.toContain(`job ${id} is done: only`)
    // and its confirm page says so rather than offering the button
    const refused = await bearer(request(admin).get(`/console/reactions/${id}/skip`))
    expect(refused.status).toBe(409)
    expect(refused.text).toContain(`Job ${id} is done: only a failed or pending job can be skipped.`)
    expect(refused.text).not.toContain('name="action_id"')
  })

  it('refuses a retry or a skip without the CSRF token and changes nothing', async () => {
    const id = jobs['react-2/crm-sync/2']!
    for (const verb of ['retry', 'skip']) {
      const { csrf: _csrf, ...fields } = formFields((await bearer(request(admin).get(`/console/reactions/${id}/${verb}`))).text)
      const refused = await request(admin).post(`/console/reactions/${id}/${verb}`).set('Authorization', basic('ops', TOKEN)).type('form').send(fields)
      expect(refused.status).toBe(403)
    }
    expect((await stateOf(id)).state).toBe('failed')
  })

  it('skips a failed reaction, and lists both actions on the overview with who did them', async () => {
    const id = jobs['react-2/crm-sync/2']!
    const confirm = await request(admin).get(`/console/reactions/${id}/skip`).set('Authorization', basic('erin', TOKEN))
    const done = await request(admin).post(`/console/reactions/${id}/skip`).set('Authorization', basic('erin', TOKEN)).type('form').send(formFields(confirm.text))
    expect(done.status).toBe(200)
    expect(done.text).toContain(`job ${id} skipped`)
    expect((await stateOf(id)).state).toBe('skipped')
    // its last error is kept; on a skipped job it may also be why the dispatcher skipped it (a narrowed AMQP_EVENTS)
    const page = (await bearer(request(admin).get(`/console/reactions/${id}`))).text
    expect(page).toContain('<h2>Last error, or why it was skipped</h2>\n<pre class="body error">Error: CRM unavailable (503)</pre>')
    const overview = (await bearer(request(admin).get('/console/'))).text
    expect(overview).toMatch(new RegExp(`<td>erin</td><td>skip reaction ${id}</td><td>job ${id} skipped</td>`))
    expect(overview).toContain(`<td>retry reaction ${jobs['react-1/crm-sync/2']}</td>`)
    expect(overview).not.toContain('failed reaction(s)')
  })

  it('retries every failed reaction after a confirm page that counts them', async () => {
    await fail(jobs['react-3/crm-sync/2']!, 'Error: timeout')
    const confirm = await bearer(request(admin).get('/console/reactions/retry-failed'))
    expect(confirm.text).toContain('<strong>1</strong> now')
    const fields = formFields(confirm.text)
    const run = await bearer(request(admin).post('/console/reactions/retry-failed')).type('form').send(fields)
    expect(run.text).toContain(`1 job(s) run again now: ${jobs['react-3/crm-sync/2']}`)
    expect((await stateOf(jobs['react-3/crm-sync/2']!)).state).toBe('pending')
    expect((await bearer(request(admin).post('/console/reactions/retry-failed')).type('form').send(fields)).text).toContain('already carried out')
  })
})

describe('ADMIN_TOKEN', () => {
  it('is generated once in local mode, kept with the local secrets, and checked for length when given', async () => {
    const { mkdtempSync, readFileSync, rmSync } = await import('node:fs')
    const { tmpdir } = await import('node:os')
    const { join } = await import('node:path')
    const { parseConfig, configSecrets } = await import('../src/config.js')
    const dataDir = mkdtempSync(join(tmpdir(), 'console-config-'))
    try {
      const first = parseConfig({ DATA_DIR: dataDir })
      expect(first.adminToken).toMatch(/^[0-9a-f]{64}$/)
      expect(parseConfig({ DATA_DIR: dataDir }).adminToken).toBe(first.adminToken)
      expect(JSON.parse(readFileSync(join(dataDir, 'local-secrets.json'), 'utf8')).adminToken).toBe(first.adminToken)
      expect(configSecrets(first)).toContain(first.adminToken)
      expect(() => parseConfig({ DATA_DIR: dataDir, ADMIN_TOKEN: 'short' })).toThrow(/ADMIN_TOKEN: is shorter than 24/)
      expect(testConfig().adminToken).toBeUndefined()
    } finally {
      rmSync(dataDir, { recursive: true, force: true })
    }
  })
})
