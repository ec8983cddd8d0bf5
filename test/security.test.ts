// Secrets: the image runs unprivileged, and the real service's whole output, after good and bad
// deliveries, holds no configured secret and no signature. (Short or empty secrets are refused by the
// configuration: test/config.test.ts.)
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { freePort, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './helpers/test-config.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const root = path.resolve(import.meta.dirname, '..')

describe('secrets and privileges', () => {
  it('builds an image whose final stage runs as a non-root user, with a health check', () => {
    const dockerfile = readFileSync(path.join(root, 'Dockerfile'), 'utf8')
    const finalStage = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '))
    const user = /^USER\s+(\S+)/m.exec(finalStage)?.[1]
    expect(user).toBeDefined()
    expect(['root', '0']).not.toContain(user)
    expect(finalStage.indexOf('USER')).toBeLessThan(finalStage.indexOf('CMD'))
    expect(finalStage).toMatch(/HEALTHCHECK[\s\S]*\/healthz/)
    expect(finalStage).toContain('npm ci --omit=dev')
  })

  it('never writes a secret or a signature to its output, whatever it receives', async () => {
    const env = {
      PORT: '0',
      ADMIN_PORT: '0',
      POLL_ENABLED: 'true',
      POLL_INTERVAL_S: '1',
      LOG_LEVEL: 'debug',
      DATA_DIR: 'memory://',
      PARTNER_API_BASE_URL: 'http://127.0.0.1:9',
      PARTNER_API_KEY_ID: TEST_API_KEY_ID,
      PARTNER_API_SECRET: TEST_API_SECRET,
      WEBHOOK_SECRETS: TEST_WEBHOOK_SECRET,
      SANDBOX_PORT: String(await freePort()),
    }
    const child = spawnCli(['serve'], env)
    let output = ''
    child.stdout!.on('data', (chunk) => {
      output += chunk
    })
    child.stderr!.on('data', (chunk) => {
      output += chunk
    })
    const { url } = await waitForLogLine(child, 'service listening')
    const signatures: string[] = []
    const post = async (body: string, signature: string, deliveryId: string) => {
      signatures.push(signature)
      return fetch(`${url}/webhooks/partner`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-partner-signature': signature, 'x-partner-delivery-id': deliveryId },
        body,
      })
    }
    const body = JSON.stringify(tradePayload('sec-1', 'funded'))
    expect((await post(body, signBody(body), 'dlv-good')).status).toBe(200)
    expect((await post(body, signBody(`${body}x`), 'dlv-bad')).status).toBe(401)
    // a signature smuggled into the delivery id header is not logged either
    expect((await post(body, signBody('other'), signBody(body))).status).toBe(401)
    expect((await post('not json', signBody('not json'), 'dlv-invalid')).status).toBe(400)
    child.kill('SIGTERM')
    await once(child, 'exit')

    expect(output).toContain('webhook signature rejected')
    for (const secret of [TEST_WEBHOOK_SECRET, TEST_API_SECRET]) expect(output).not.toContain(secret)
    for (const signature of signatures) expect(output).not.toContain(signature.slice('sha256='.length))
    expect(output).not.toMatch(/sha256=[0-9a-f]{64}/i)
    expect(output).not.toContain(body)
  })
})
