// The webhook URL over TLS, as README's "Deploying" has it: TLS ends in a proxy in front of the public
// listener (here HAProxy, with the frontend README shows), which passes the body's bytes through untouched, so
// the signature over them still holds. The compiled `serve` on PGlite, the proxy's certificate from the test CA
// (test/fixtures/tls), the client trusting that CA alone.
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import https from 'node:https'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { freePort, killLeftovers, receiverEnv, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const HAPROXY = '/usr/sbin/haproxy'
const tls = path.resolve(import.meta.dirname, 'fixtures/tls')
const installed = existsSync(HAPROXY)
if (!installed && !process.env.CI) {
  console.warn(`${HAPROXY} is not installed: the webhook-over-TLS test is SKIPPED; CI runs it (apt-get install haproxy).`)
}
const describeTls = installed || process.env.CI ? describe : describe.skip

/** README's frontend, with a port of the test's own. */
const haproxyConfig = (bind: string, pem: string, receiver: string) => `
global
  log stdout format raw local0
defaults
  mode http
  log global
  option httplog
  timeout connect 2s
  timeout client 30s
  timeout http-request 10s
  timeout server 35s
frontend webhooks
  bind ${bind} ssl crt ${pem}
  default_backend receiver
backend receiver
  server receiver ${receiver}
`

interface Answer {
  status: number
  body: Record<string, unknown>
}

describeTls('the webhook URL over TLS, ended in a proxy in front of the public listener (HAProxy)', () => {
  const children: ChildProcess[] = []
  let workDir: string
  let webhookUrl: URL
  const ca = readFileSync(path.join(tls, 'ca.crt'))

  beforeAll(async () => {
    if (!installed) throw new Error(`${HAPROXY} is required in CI: .ci/run installs Debian's haproxy package`)
    workDir = mkdtempSync(path.join(tmpdir(), 'webhook-tls-'))
    const serve = spawnCli(['serve'], receiverEnv(migratedDataDir('webhook-tls-data-')))
    children.push(serve)
    const { url } = await waitForLogLine(serve, 'service listening')
    const receiver = new URL(String(url)).host

    // HAProxy takes the certificate and its key in one file
    const pem = path.join(workDir, 'webhook.pem')
    writeFileSync(pem, Buffer.concat([readFileSync(path.join(tls, 'server.crt')), readFileSync(path.join(tls, 'server.key'))]), { mode: 0o600 })
    const port = await freePort()
    const config = path.join(workDir, 'haproxy.cfg')
    writeFileSync(config, haproxyConfig(`127.0.0.1:${port}`, pem, receiver))
    const haproxy = spawn(HAPROXY, ['-db', '-f', config], { stdio: ['ignore', 'pipe', 'pipe'] })
    children.push(haproxy)
    let output = ''
    haproxy.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()))
    haproxy.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()))
    webhookUrl = new URL(`https://localhost:${port}/webhooks/partner`)
    // ready once it answers over TLS (a 404 for a path the service does not serve)
    for (let tries = 0; ; tries++) {
      const ready = await get(new URL('/healthz', webhookUrl)).catch(() => undefined)
      if (ready?.status === 200) break
      if (tries > 100 || haproxy.exitCode !== null) throw new Error(`HAProxy did not serve over TLS:\n${output}`)
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
  })

  afterAll(async () => {
    killLeftovers(children)
    await Promise.all(children.filter((child) => child.exitCode === null && child.signalCode === null).map((child) => once(child, 'exit')))
    if (workDir) rmSync(workDir, { recursive: true, force: true })
  })

  function post(body: string, headers: Record<string, string>): Promise<Answer> {
    return answerOf(https.request(webhookUrl, { method: 'POST', ca, headers: { 'content-type': 'application/json', ...headers } }), body)
  }

  function get(url: URL): Promise<Answer> {
    return answerOf(https.request(url, { ca }), undefined)
  }

  it('takes a signed delivery through the proxy, and answers its resend as a duplicate', async () => {
    // bytes a re-serialising proxy would change: spacing, key order, an escaped character
    const body = `{ "external_reference":"tls-${randomUUID()}", "trade_id":"trd_tls", "reference":"REF-TLS", "status":"funded", "note":"caf\\u00e9" }`
    const headers = { 'x-partner-signature': signBody(body), 'x-partner-delivery-id': `tls-${randomUUID()}` }
    expect(await post(body, headers)).toEqual({ status: 200, body: { received: true } })
    expect(await post(body, headers)).toEqual({ status: 200, body: { received: true, duplicate: true } })
  })

  it('refuses a delivery whose bytes are not the ones signed, through the proxy too', async () => {
    const body = JSON.stringify(tradePayload(`tls-${randomUUID()}`, 'funded'))
    const answer = await post(`${body} `, { 'x-partner-signature': signBody(body), 'x-partner-delivery-id': `tls-${randomUUID()}` })
    expect(answer).toMatchObject({ status: 401, body: { error: { code: 'invalid_signature' } } })
  })
})

function answerOf(request: ReturnType<typeof https.request>, body: string | undefined): Promise<Answer> {
  return new Promise((resolve, reject) => {
    request.on('error', reject)
    request.on('response', (response) => {
      const chunks: Buffer[] = []
      response.on('data', (chunk: Buffer) => chunks.push(chunk))
      response.on('end', () => {
        const text = Buffer.concat(chunks).toString()
        resolve({ status: response.statusCode!, body: text ? (JSON.parse(text) as Record<string, unknown>) : {} })
      })
    })
    request.end(body)
  })
}
