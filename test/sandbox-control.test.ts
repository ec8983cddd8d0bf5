// The sandbox's /sandbox/* control endpoints change what the simulated platform does (faults, a receiver
// that is down, seller events): they need the control token, and answer only under a loopback Host name,
// so a web page cannot drive them through DNS rebinding. `cli sandbox` never runs under PARTNER_ENV=live.
import http from 'node:http'
import { mkdtempSync, readFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { parseConfig } from '../src/config.js'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import { runCli } from './helpers/cli-process.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'

const keyId = 'pk_sandbox_control'
const apiSecret = 'sandbox-control-api-secret-0123456789'
const webhookSecret = 'sandbox-control-webhook-secret-012345'
const controlToken = 'sandbox-control-token-0123456789abcdef'
rememberSecret(apiSecret, webhookSecret, controlToken)

function control(
  base: string,
  method: string,
  pathname: string,
  { token, host, body, authorization }: { token?: string; host?: string; body?: unknown; authorization?: string } = {},
): Promise<{ status: number; body: { error?: { code: string; fields?: { field: string }[] } } & Record<string, unknown> }> {
  const url = new URL(pathname, base)
  const payload = body === undefined ? '' : JSON.stringify(body)
  return new Promise((resolve, reject) => {
    const request = http.request(
      url,
      {
        method,
        headers: {
          host: host ?? url.host,
          'content-type': 'application/json',
          'content-length': Buffer.byteLength(payload),
          ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
          ...(authorization === undefined ? {} : { authorization }),
        },
      },
      (response) => {
        let text = ''
        response.on('data', (chunk) => (text += chunk))
        response.on('end', () => resolve({ status: response.statusCode!, body: JSON.parse(text) }))
      },
    )
    request.on('error', reject)
    request.end(payload)
  })
}

describe('sandbox control endpoints', () => {
  let sandbox: Sandbox
  let base: string
  let unguarded: Sandbox
  let unguardedBase: string

  beforeAll(async () => {
    const logger = testLogger([apiSecret, webhookSecret, controlToken])
    sandbox = createSandbox({ keyId, apiSecret, webhookSecret, controlToken, logger })
    base = await sandbox.listen(0)
    unguarded = createSandbox({ keyId, apiSecret, webhookSecret, logger })
    unguardedBase = await unguarded.listen(0)
  })
  afterAll(async () => {
    await sandbox.close()
    await unguarded.close()
  })

  it('refuses every call without the control token, or with another one, and changes nothing', async () => {
    for (const token of [undefined, 'not-the-token', `${controlToken}x`, '']) {
      const faults = await control(base, 'POST', '/sandbox/faults', { token, body: { dropRate: 1 } })
      expect(faults.status).toBe(401)
      expect(faults.body.error?.code).toBe('invalid_control_token')
      expect((await control(base, 'GET', '/sandbox/deliveries', { token })).status).toBe(401)
    }
    const current = await control(base, 'POST', '/sandbox/faults', { token: controlToken, body: {} })
    expect(current.status).toBe(200)
    expect(current.body.dropRate).toBe(0)
  })

  it('reads the scheme in any case (RFC 9110), and only the Bearer scheme, the token whole', async () => {
    // before, only `Bearer ` with one space was taken off: `bearer <token>` was refused, the bare token let in
    for (const authorization of [`bearer ${controlToken}`, `BEARER  ${controlToken}`]) {
      expect((await control(base, 'GET', '/sandbox/deliveries', { authorization })).status).toBe(200)
    }
    for (const authorization of [controlToken, `Basic ${controlToken}`, `Bearer ${controlToken} more`]) {
      expect((await control(base, 'GET', '/sandbox/deliveries', { authorization })).status).toBe(401)
    }
  })

  it('runs a call with the token under a loopback Host name', async () => {
    const port = new URL(base).port
    for (const host of [`127.0.0.1:${port}`, `localhost:${port}`, `[::1]:${port}`, 'localhost']) {
      const response = await control(base, 'GET', '/sandbox/trades', { token: controlToken, host })
      expect(response.status, host).toBe(200)
    }
    const faults = await control(base, 'POST', '/sandbox/faults', { token: controlToken, body: { dropRate: 0.5 } })
    expect(faults.status).toBe(200)
    expect(faults.body.dropRate).toBe(0.5)
  })

  it('refuses another Host name even with the token (DNS rebinding)', async () => {
    const port = new URL(base).port
    for (const host of [`attacker.example:${port}`, `127.0.0.1.attacker.example:${port}`, 'localhost.attacker.example', `10.0.0.1:${port}`]) {
      const response = await control(base, 'POST', '/sandbox/receiver-down', { token: controlToken, host, body: { down: true } })
      expect(response.status, host).toBe(403)
      expect(response.body.error?.code).toBe('forbidden_host')
    }
  })

  it('answers a body it cannot use with a 4xx naming the problem, and changes nothing', async () => {
    const raw = (pathname: string, payload: string, contentType = 'application/json') =>
      fetch(new URL(pathname, base), {
        method: 'POST',
        headers: { 'content-type': contentType, authorization: `Bearer ${controlToken}` },
        body: payload,
      }).then(async (response) => ({ status: response.status, body: (await response.json()) as { error: { code: string; fields?: { field: string }[] } } }))
    const before = await control(base, 'POST', '/sandbox/faults', { token: controlToken, body: {} })
    for (const [pathname, payload] of [['/sandbox/faults', '{'], ['/sandbox/receiver-down', 'null'], ['/sandbox/sellers/s-1/status', '"verified"']]) {
      const answer = await raw(pathname!, payload!)
      expect([answer.status, answer.body.error.code], `${pathname} ${payload}`).toEqual([400, 'invalid_json'])
    }
    expect((await raw('/sandbox/faults', '{}', 'application/json; charset=latin-9')).body.error.code).toBe('invalid_body')
    expect(await raw('/sandbox/sellers/%ZZ/status', '{"status":"verified"}')).toMatchObject({
      status: 400,
      body: { error: { code: 'invalid_request' } },
    })
    // a share outside 0..1, a string, a typo'd name: each named, none applied
    const faults = await control(base, 'POST', '/sandbox/faults', {
      token: controlToken,
      body: { dropRate: 7, duplicateRate: '0.5', drop_rate: 0.1, seed: 1.5, reorderRate: 0.2 },
    })
    expect(faults.status).toBe(422)
    expect(faults.body.error?.code).toBe('validation_failed')
    expect(faults.body.error?.fields?.map((field) => field.field)).toEqual(['dropRate', 'duplicateRate', 'drop_rate', 'seed'])
    // a wait past the timers' limit (2³¹−1 ms) used to be taken, and each delayed webhook went after 1 ms
    const tooLong = await control(base, 'POST', '/sandbox/faults', { token: controlToken, body: { delayRate: 1, delayMs: 2 ** 31 } })
    expect([tooLong.status, tooLong.body.error?.fields?.map((field) => field.field)]).toEqual([422, ['delayMs']])
    expect((await control(base, 'POST', '/sandbox/faults', { token: controlToken, body: {} })).body).toEqual(before.body)

    const down = await control(base, 'POST', '/sandbox/receiver-down', { token: controlToken, body: { down: 'yes' } })
    expect([down.status, down.body.error?.code]).toEqual([422, 'validation_failed'])
    // an onboarding event's status is a word and its id has no control codes, for sellers as for buyers
    const sent = sandbox.deliveryLog.length
    for (const [pathname, status] of [
      ['/sandbox/sellers/s-1/status', 'verified\u001b]0;owned\u0007'],
      ['/sandbox/sellers/s-1/status', 42],
      [`/sandbox/sellers/${encodeURIComponent('s\u001b[2J')}/status`, 'verified'],
      [`/sandbox/buyers/${encodeURIComponent('b\n1')}/status`, 'verified'],
    ] as const) {
      const refused = await control(base, 'POST', pathname, { token: controlToken, body: { status } })
      expect([refused.status, refused.body.error?.code], pathname).toEqual([422, 'validation_failed'])
    }
    await sandbox.idle()
    expect(sandbox.deliveryLog.length).toBe(sent)
    const fine = await control(base, 'POST', '/sandbox/sellers/s-1/status', { token: controlToken, body: { status: 'verified' } })
    expect(fine.status).toBe(202)
  })

  it('reads a body as JSON whatever its Content-Type: `curl -d` sends a form\'s, and its settings were ignored with a 200', async () => {
    const post = (pathname: string, payload: string, contentType?: string) =>
      fetch(new URL(pathname, base), {
        method: 'POST',
        headers: { ...(contentType ? { 'content-type': contentType } : {}), authorization: `Bearer ${controlToken}` },
        body: payload,
      }).then(async (response) => ({ status: response.status, body: (await response.json()) as Record<string, unknown> & { error?: { code: string } } }))
    const before = (await control(base, 'POST', '/sandbox/faults', { token: controlToken, body: {} })).body
    for (const contentType of ['application/x-www-form-urlencoded', 'text/plain', undefined]) {
      const applied = await post('/sandbox/faults', `{"delayMs":${before.delayMs as number + 25}}`, contentType)
      expect([applied.status, applied.body.delayMs], String(contentType)).toEqual([200, (before.delayMs as number) + 25])
      await post('/sandbox/faults', `{"delayMs":${before.delayMs as number}}`, contentType)
      const unreadable = await post('/sandbox/faults', 'dropRate=1', contentType)
      expect([unreadable.status, unreadable.body.error?.code], String(contentType)).toEqual([400, 'invalid_json'])
    }
    expect((await control(base, 'POST', '/sandbox/faults', { token: controlToken, body: {} })).body).toEqual(before)
    const down = await post('/sandbox/receiver-down', '{"down":false}', 'application/x-www-form-urlencoded')
    expect([down.status, down.body.down]).toEqual([200, false])
  })

  it('refuses every call when no control token is configured', async () => {
    const response = await control(unguardedBase, 'GET', '/sandbox/trades', { token: 'anything' })
    expect(response.status).toBe(401)
  })
})

describe('the sandbox control token in local mode', () => {
  it('is generated once into local-secrets.json beside the other local secrets, and kept', () => {
    const dataDir = mkdtempSync(path.join(tmpdir(), 'sandbox-token-'))
    const first = parseConfig({ DATA_DIR: dataDir })
    const second = parseConfig({ DATA_DIR: dataDir })
    expect(first.sandbox.controlToken).toMatch(/^[0-9a-f]{64}$/)
    expect(second.sandbox.controlToken).toBe(first.sandbox.controlToken)
    const stored = JSON.parse(readFileSync(path.join(dataDir, 'local-secrets.json'), 'utf8'))
    expect(stored.sandboxControlToken).toBe(first.sandbox.controlToken)
    expect(parseConfig({ DATA_DIR: dataDir, SANDBOX_CONTROL_TOKEN: controlToken }).sandbox.controlToken).toBe(controlToken)
  })
})

describe('`cli sandbox` under PARTNER_ENV=live', () => {
  it('refuses to start, saying why, with exit code 2', async () => {
    const result = await runCli(['sandbox', '--port', '0'], {
      PARTNER_ENV: 'live',
      PARTNER_LIVE_API_BASE_URL: 'https://platform.example/',
      PARTNER_LIVE_API_KEY_ID: 'pk_live_1',
      PARTNER_LIVE_API_SECRET: apiSecret,
      WEBHOOK_SECRETS: webhookSecret,
      DATA_DIR: 'memory://',
    })
    expect(result.code).toBe(2)
    expect(result.stderr).toContain('PARTNER_ENV=live')
    expect(result.stdout).not.toContain('listening')
    expect(`${result.stdout}${result.stderr}`).not.toContain(webhookSecret)
  })
})
