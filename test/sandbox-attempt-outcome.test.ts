// What decides a webhook attempt's outcome in the sandbox, and what the delivery log says of it. A 2xx within the
// attempt timeout is delivered whatever its body does: one whose body did not end in time counted as a timeout and
// the event was sent again. An attempt that got no HTTP status (connection refused, no such host, a URL fetch will
// not send) records why, in a word and never with the URL's password, and says so in a log line: it recorded
// nothing and said nothing.
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterEach, describe, expect, it } from 'vitest'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import type { DeliveryAttempt } from '../src/sandbox/webhook-dispatcher.js'
import { logEntries, rememberSecret, testLogger } from './helpers/log-sink.js'

const keyId = 'pk_sandbox_outcome'
const apiSecret = 'sandbox-outcome-api-secret-0123456789'
const webhookSecret = 'sandbox-outcome-webhook-secret-012345'
const controlToken = 'sandbox-outcome-control-token-01234567'
const password = 'hook-password-never-shown'
rememberSecret(apiSecret, webhookSecret, controlToken)

describe('a sandbox webhook attempt’s outcome', () => {
  const cleanUps: (() => Promise<void> | void)[] = []
  afterEach(async () => {
    for (const cleanUp of cleanUps.splice(0).reverse()) await cleanUp()
  })

  async function sandboxTo(webhookUrl: string, options: { attemptTimeoutMs?: number; retryBaseDelayMs?: number } = {}) {
    const logger = testLogger()
    const sandbox: Sandbox = createSandbox({ keyId, apiSecret, webhookSecret, controlToken, webhookUrl, logger, ...options })
    const base = await sandbox.listen(0)
    cleanUps.push(() => sandbox.close())
    const deliveries = async () => {
      const response = await fetch(`${base}/sandbox/deliveries`, { headers: { authorization: `Bearer ${controlToken}` } })
      return (await response.json()) as DeliveryAttempt[]
    }
    return { sandbox, deliveries, logger }
  }

  it('counts a 2xx as delivered when its body does not end within the attempt timeout, and sends it once', async () => {
    let requests = 0
    const server = http.createServer((request, response) => {
      requests++
      request.resume()
      // the status and a first byte at once, then nothing more: the body never ends
      request.on('end', () => {
        response.writeHead(200, { 'content-type': 'text/plain' })
        response.write('o')
      })
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    cleanUps.push(() => {
      server.closeAllConnections()
      server.close()
    })
    // the timeout is what the body outlasts, and the status must come within it: a short one (300 ms) was outrun by
    // the status itself on a loaded machine, a timeout that is sent again. The body never ends, so this test takes
    // the whole timeout
    const { sandbox, deliveries } = await sandboxTo(`http://127.0.0.1:${(server.address() as AddressInfo).port}/hook`, {
      attemptTimeoutMs: 10_000,
      retryBaseDelayMs: 50,
    })
    sandbox.sellerStatus('s-1', 'verified')
    await sandbox.idle()
    expect((await deliveries()).map(({ attempt, result, httpStatus }) => ({ attempt, result, httpStatus }))).toEqual([
      { attempt: 1, result: 'delivered', httpStatus: 200 },
    ])
    expect(requests).toBe(1)
  })

  it('records why an attempt got no answer: a refused connection', async () => {
    // a port that was just given back: nothing listens there
    const closed = http.createServer()
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve))
    const { port } = closed.address() as AddressInfo
    await new Promise<void>((resolve) => closed.close(() => resolve()))
    const { sandbox, deliveries } = await sandboxTo(`http://127.0.0.1:${port}/hook`, { retryBaseDelayMs: 1 })
    sandbox.sellerStatus('s-1', 'verified')
    await sandbox.idle()
    const log = await deliveries()
    expect(log.map(({ attempt, result, reason }) => ({ attempt, result, reason }))).toEqual(
      [1, 2, 3, 4, 5, 6].map((attempt) => ({ attempt, result: 'failed', reason: 'ECONNREFUSED' })),
    )
    // said once in a log line, not six times (this event's lines: the file's tests share one log)
    const said = logEntries().filter(
      (entry) => String(entry.msg).startsWith('sandbox webhook attempt got no answer') && entry.eventId === log[0]!.eventId,
    )
    expect(said.map(({ reason, attempt }) => ({ reason, attempt }))).toEqual([{ reason: 'ECONNREFUSED', attempt: 1 }])
  })

  it('records a URL with a user and password, which fetch will not send, without the password', async () => {
    const { sandbox, deliveries } = await sandboxTo(`http://partner:${password}@127.0.0.1:9/hook`, { retryBaseDelayMs: 1 })
    sandbox.sellerStatus('s-1', 'verified')
    await sandbox.idle()
    const log = await deliveries()
    expect(log).toHaveLength(6)
    expect(new Set(log.map((entry) => `${entry.result} ${entry.reason}`))).toEqual(new Set(['failed url_has_credentials']))
    expect(JSON.stringify(log)).not.toContain(password)
    expect(JSON.stringify(logEntries())).not.toContain(password)
  })

  it('records the sandbox’s own failures: a receiver set down', async () => {
    const { sandbox, deliveries } = await sandboxTo('http://127.0.0.1:9/hook', { retryBaseDelayMs: 1 })
    sandbox.setReceiverDown(true)
    sandbox.sellerStatus('s-1', 'verified')
    await sandbox.idle()
    expect(new Set((await deliveries()).map((entry) => entry.reason))).toEqual(new Set(['receiver_down']))
  })
})
