// The operator listener's Host check: it answers a loopback Host, an IP address, or a name in ADMIN_ALLOWED_HOSTS,
// so a web page in the operator's browser whose name was rebound to the listener's address (DNS rebinding) reads
// neither /metrics nor the console. Bound to 0.0.0.0, as README's compose recipe has it (published on the host's
// loopback), it used to answer any Host (found from outside).
import { connect } from 'node:net'
import request from 'supertest'
import { describe, expect, it } from 'vitest'
import { createAdminApp } from '../src/http/admin-app.js'
import { listen } from '../src/http/server.js'
import { localCliRoutes } from '../src/local/local-cli.js'
import { LOCAL_CLI_PATH } from '../src/local/running-service.js'
import { createMetrics } from '../src/metrics/metrics.js'
import { taggedLogger, testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'

const TOKEN = 'admin-host-token-0123456789abcdef'
const COMMAND_TOKEN = 'c'.repeat(64)
const OUTSIDE_HOSTS = ['evil.example:3301', 'evil.example', '127.0.0.1.evil.example:3301', 'localhost.evil.example', 'metrics.internal:3001', '[evil.example]:3301', '0x7f.1:3301']
const LOOPBACK_HOSTS = ['127.0.0.1:3301', 'localhost:3301', 'LocalHost', '[::1]:3301', '127.8.9.10', 'localhost']
// no rebinding page has an address for its name: the address is the URL it was given
const ADDRESS_HOSTS = ['10.0.0.1:3301', '[::2]:3301', '192.168.1.20', '[fd00::5]']

describe('the operator listener and the Host header', () => {
  const database = useTestDatabase()

  const adminBoundTo = (adminHost: string, allowedHosts?: string, logger = testLogger([TOKEN, COMMAND_TOKEN])) => {
    const config = testConfig({ ADMIN_TOKEN: TOKEN, ADMIN_HOST: adminHost, ...(allowedHosts === undefined ? {} : { ADMIN_ALLOWED_HOSTS: allowedHosts }) })
    const routes = localCliRoutes({
      token: COMMAND_TOKEN,
      context: { config, db: database.db, logger },
      runCommand: async () => ({ code: 0, stdout: 'ran\n', stderr: '' }),
      whenReady: Promise.resolve(),
    })
    return createAdminApp({ config, db: database.db, logger, metrics: createMetrics({}, { defaultMetrics: false }), routes: [routes] })
  }
  const command = (call: request.Test) => call.set('Authorization', `Bearer ${COMMAND_TOKEN}`).send({ args: ['orders', 'list'] })

  it('refuses every path 403 forbidden_host under a Host name nobody listed, wherever it is bound (DNS rebinding)', async () => {
    for (const adminHost of ['127.0.0.1', '::1', 'localhost', '0.0.0.0', '10.1.2.3', '::']) {
      const admin = adminBoundTo(adminHost)
      for (const host of OUTSIDE_HOSTS) {
        const answers = {
          metrics: await request(admin).get('/metrics').set('Host', host),
          login: await request(admin).get('/console/login').set('Host', host),
          console: await request(admin).get('/console/').set('Host', host).set('Authorization', `Bearer ${TOKEN}`),
          command: await command(request(admin).post(LOCAL_CLI_PATH).set('Host', host)),
          unknown: await request(admin).get('/no-such-path').set('Host', host),
        }
        for (const [what, answer] of Object.entries(answers)) {
          expect([answer.status, answer.body.error?.code], `${adminHost} ${host} ${what}`).toEqual([403, 'forbidden_host'])
          expect(answer.text).not.toContain('webhook_deliveries_total')
        }
      }
    }
  })

  it('answers a loopback Host, by name or address, with any port or none, and refuses the same name rebound', async () => {
    const admin = adminBoundTo('127.0.0.1')
    for (const host of LOOPBACK_HOSTS) {
      // the name a rebinding page would have: the same port, a name of its own
      const rebound = await request(admin).get('/metrics').set('Host', host.replace(/^(localhost|127\.[\d.]+|\[::1\])/i, 'rebound.example'))
      expect(rebound.status, host).toBe(403)
      const metrics = await request(admin).get('/metrics').set('Host', host)
      expect(metrics.status, host).toBe(200)
      expect(metrics.text).toContain('webhook_deliveries_total')
      expect((await request(admin).get('/console/').set('Host', host).set('Authorization', `Bearer ${TOKEN}`)).status, host).toBe(200)
      // what a second terminal's command sends (src/local/running-service.ts: fetch of serve.json's adminUrl)
      const forwarded = await command(request(admin).post(LOCAL_CLI_PATH).set('Host', host))
      expect([forwarded.status, forwarded.body.stdout], host).toEqual([200, 'ran\n'])
    }
    // supertest's own Host, 127.0.0.1 and the port it listens on
    expect((await request(admin).get('/metrics')).status).toBe(200)
  })

  it('answers a loopback Host and any IP address wherever it is bound, as the compose recipe reaches it', async () => {
    for (const adminHost of ['127.0.0.1', '0.0.0.0', '::']) {
      const admin = adminBoundTo(adminHost)
      for (const host of [...LOOPBACK_HOSTS, ...ADDRESS_HOSTS]) {
        expect((await request(admin).get('/metrics').set('Host', host)).status, `${adminHost} ${host}`).toBe(200)
      }
    }
  })

  it('answers the names in ADMIN_ALLOWED_HOSTS, in any case, with any port or a final dot, and no other; * answers any', async () => {
    const admin = adminBoundTo('0.0.0.0', 'receiver, Metrics.Internal')
    for (const host of ['receiver:3001', 'RECEIVER', 'metrics.internal:3001', 'metrics.internal.']) {
      expect((await request(admin).get('/metrics').set('Host', host)).status, host).toBe(200)
    }
    for (const host of ['receiver.evil.example', 'evil.example', 'internal:3001']) {
      const refused = await request(admin).get('/metrics').set('Host', host)
      expect([refused.status, refused.body.error?.code], host).toEqual([403, 'forbidden_host'])
      expect(refused.body.error.message).toBe(
        'The operator listener (ADMIN_HOST=0.0.0.0) answers only a Host that is localhost, an IP address or a name in ' +
          'ADMIN_ALLOWED_HOSTS; to reach it by name, list the name in ADMIN_ALLOWED_HOSTS',
      )
    }
    const any = adminBoundTo('0.0.0.0', '*')
    for (const host of OUTSIDE_HOSTS) expect((await request(any).get('/metrics').set('Host', host)).status, host).toBe(200)
  })

  // found from outside: what no browser sends, but a request may
  it('reads an absolute-form target\'s authority as its host, refuses two Host headers, and takes localhost. as localhost', async () => {
    // on the listener the service runs (server.ts), whose headers are all read
    const running = await listen(adminBoundTo('127.0.0.1'), { port: 0, host: '127.0.0.1' })
    const port = Number(new URL(running.url).port)
    const raw = async (head: string) => {
      const socket = connect(port, '127.0.0.1')
      socket.end(`${head}\r\nConnection: close\r\n\r\n`)
      let answer = ''
      for await (const chunk of socket) answer += String(chunk)
      return answer.split('\r\n')[0]
    }
    try {
      expect(await raw('GET http://evil.example/metrics HTTP/1.1\r\nHost: 127.0.0.1')).toBe('HTTP/1.1 403 Forbidden')
      expect(await raw(`GET http://127.0.0.1:${port}/metrics HTTP/1.1\r\nHost: evil.example`)).toBe('HTTP/1.1 200 OK')
      // (by the listener, on both: test/request-framing.test.ts)
      expect(await raw('GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example')).toBe('HTTP/1.1 400 Bad Request')
      // found from outside: past Node's default of 2,000 headers the rest were dropped, the second Host with them
      expect(await raw(`GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n${'X: 1\r\n'.repeat(2_000)}Host: evil.example`)).toBe('HTTP/1.1 400 Bad Request')
      expect(await raw('GET /metrics HTTP/1.1\r\nHost: localhost.')).toBe('HTTP/1.1 200 OK')
      expect(await raw('GET /metrics HTTP/1.1\r\nHost: 127.0.0.1')).toBe('HTTP/1.1 200 OK')
    } finally {
      await running.stop(0)
    }
  })

  // found from outside: a form whose client went away mid-body was logged as a database outage
  it('a form its client abandons mid-body is no database outage in the log', async () => {
    // the listener's own lines: another file's in the same worker are not its (log-sink.ts, taggedLogger)
    const own = taggedLogger([TOKEN, COMMAND_TOKEN])
    const running = await listen(adminBoundTo('127.0.0.1', undefined, own.logger), { port: 0, host: '127.0.0.1' })
    const before = own.entries().length
    try {
      const socket = connect(Number(new URL(running.url).port), '127.0.0.1')
      socket.on('error', () => {})
      await new Promise((resolve) => socket.once('connect', resolve))
      socket.write('POST /console/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 70\r\n\r\ntoken=a')
      await new Promise((resolve) => setTimeout(resolve, 100))
      socket.destroy()
      await new Promise((resolve) => setTimeout(resolve, 300))
      expect(own.entries().slice(before).filter((entry) => entry.msg === 'database unavailable')).toEqual([])
    } finally {
      await running.stop(0)
    }
  })
})
