// What a restarted sandbox owes and leaves: a webhook carries on from the attempt after those a previous run
// made (6 in all, as the spec says, however often the sandbox restarts), and the temporary files of writers
// killed between write and rename are cleared away.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdirSync, mkdtempSync, readdirSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { createSandbox } from '../src/sandbox/create-sandbox.js'
import { readSandboxState } from '../src/sandbox/sandbox-state.js'
import { FakeClock } from './helpers/fake-clock.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { sandboxClient } from './helpers/sandbox-client.js'
import { startRecordingReceiver } from './helpers/sandbox-receiver.js'

const keyId = 'pk_sandbox_restart'
const apiSecret = 'sandbox-restart-api-secret-0123456789'
const webhookSecret = 'sandbox-restart-webhook-secret-01234'
rememberSecret(apiSecret, webhookSecret)

function stateFileIn(prefix: string): string {
  const directory = mkdtempSync(path.join(tmpdir(), prefix))
  return path.join(directory, 'sandbox-state.json')
}

async function waitFor(condition: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !condition(); i++) await new Promise((resolve) => setTimeout(resolve, 10))
  expect(condition()).toBe(true)
}

const sandboxOver = (stateFile: string, clock: FakeClock, webhookUrl: string) =>
  createSandbox({ keyId, apiSecret, webhookSecret, stateFile, webhookUrl, clock, retryBaseDelayMs: 10, logger: testLogger() })

describe('a webhook across a restart of the sandbox', () => {
  it('is attempted 6 times in all: 4 before the restart, then the 5th after the next gap, and the 6th', async () => {
    const stateFile = stateFileIn('sandbox-attempts-')
    const receiver = await startRecordingReceiver(webhookSecret, () => 503)
    try {
      const firstClock = new FakeClock()
      const first = sandboxOver(stateFile, firstClock, receiver.url)
      await first.listen(0)
      first.sellerStatus('s-restart', 'verified')
      for (let attempt = 1; attempt <= 4; attempt++) {
        await waitFor(() => receiver.received.length === attempt && firstClock.pendingSleepers === 1)
        // each attempt is on disk before it is sent: a kill at any moment cannot lose it
        expect(readSandboxState(stateFile)!.pendingWebhooks.map((event) => event.attempts)).toEqual([attempt])
        if (attempt < 4) await firstClock.advance(10 * 2 ** (attempt - 1))
      }
      await first.close()

      const secondClock = new FakeClock()
      const second = sandboxOver(stateFile, secondClock, receiver.url)
      await second.listen(0)
      try {
        // the gap after a 4th failed attempt (10, 20, 40, then 80 ms), not an attempt at once
        await waitFor(() => secondClock.pendingSleepers === 1)
        expect(receiver.received).toHaveLength(4)
        await secondClock.advance(80)
        await waitFor(() => receiver.received.length === 5 && secondClock.pendingSleepers === 1)
        await secondClock.advance(160)
        await second.idle()
        expect(secondClock.sleeps).toEqual([80, 160])
        expect(second.deliveryLog.map((attempt) => attempt.attempt)).toEqual([5, 6])
        expect(receiver.received).toHaveLength(6)
        expect(new Set(receiver.received.map((webhook) => webhook.deliveryId)).size).toBe(6)
        // given up: nothing left for a third run
        expect(readSandboxState(stateFile)!.pendingWebhooks).toEqual([])
      } finally {
        await second.close()
      }
    } finally {
      await receiver.close()
    }
  })

  it('has the first attempt of an API call’s webhook counted on disk as soon as it starts', async () => {
    const stateFile = stateFileIn('sandbox-first-attempt-')
    const receiver = await startRecordingReceiver(webhookSecret, () => 503)
    const clock = new FakeClock(Date.now())
    const sandbox = sandboxOver(stateFile, clock, receiver.url)
    try {
      const client = sandboxClient(await sandbox.listen(0), { keyId, secret: apiSecret, clock })
      await client.createTrade({ title: 'Bike', amount: '10', currency: 'EUR', seller_id: 's-1', external_reference: 'first-1' })
      await waitFor(() => receiver.received.length === 1 && clock.pendingSleepers === 1)
      expect(readSandboxState(stateFile)!.pendingWebhooks.map((event) => event.attempts)).toEqual([1])
    } finally {
      await sandbox.close()
      await receiver.close()
    }
  })

  it('is sent from its first attempt when the state file predates the attempt count', async () => {
    const stateFile = stateFileIn('sandbox-old-state-')
    const body = JSON.stringify({ event: 'seller.verified', seller_id: 's-old', status: 'verified' })
    const pending = { eventId: 'evt-old', event: 'seller.verified', tradeId: null, status: 'verified', body }
    writeFileSync(stateFile, JSON.stringify({ version: 1, sequence: 0, trades: [], funded: [], pendingWebhooks: [pending] }))
    expect(readSandboxState(stateFile)!.pendingWebhooks).toEqual([{ ...pending, attempts: 0 }])

    const receiver = await startRecordingReceiver(webhookSecret)
    const sandbox = sandboxOver(stateFile, new FakeClock(), receiver.url)
    try {
      await sandbox.listen(0)
      await sandbox.idle()
      expect(sandbox.deliveryLog).toMatchObject([{ eventId: 'evt-old', attempt: 1, result: 'delivered' }])
      expect(receiver.received.map((webhook) => webhook.rawBody)).toEqual([body])
    } finally {
      await sandbox.close()
      await receiver.close()
    }
  })
})

describe('temporary state files left by a killed sandbox', () => {
  it('are removed when a sandbox is created over the file, but not a live writer’s nor another file', async () => {
    const stateFile = stateFileIn('sandbox-stale-tmp-')
    mkdirSync(path.dirname(stateFile), { recursive: true })
    // a pid that was a process and is one no more: as a sandbox killed with -9 between write and rename
    const gone = spawn(process.execPath, ['-e', ''])
    await once(gone, 'exit')
    const live = spawn(process.execPath, ['-e', 'setTimeout(() => {}, 60_000)'])
    try {
      const names = [
        `sandbox-state.json.${gone.pid}.tmp`,
        `sandbox-state.json.${live.pid}.tmp`,
        `sandbox-state.json.${process.pid}.tmp`,
        'sandbox-state.json.backup',
        'other.json.1.tmp',
      ]
      for (const name of names) writeFileSync(path.join(path.dirname(stateFile), name), '{"half":')
      createSandbox({ keyId, apiSecret, webhookSecret, stateFile, logger: testLogger() })
      expect(readdirSync(path.dirname(stateFile)).toSorted()).toEqual(
        [`sandbox-state.json.${live.pid}.tmp`, 'sandbox-state.json.backup', 'other.json.1.tmp'].toSorted(),
      )
    } finally {
      live.kill()
    }
  })
})
