// The sandbox's state file: what one sandbox saved, the next one created over the same file carries on
// with: its trades, the reference counter, a refund still owed, and webhooks not yet delivered.
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import type { Clock } from '../src/clock.js'
import { systemClock } from '../src/clock.js'
import type { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import { readSandboxState, sandboxJournalFile, SandboxStateError, sandboxStateFile } from '../src/sandbox/sandbox-state.js'
import { FakeClock } from './helpers/fake-clock.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { sandboxClient } from './helpers/sandbox-client.js'
import { startRecordingReceiver } from './helpers/sandbox-receiver.js'

const keyId = 'pk_sandbox_state'
const apiSecret = 'sandbox-state-api-secret-0123456789ab'
const webhookSecret = 'sandbox-state-webhook-secret-012345'
rememberSecret(apiSecret, webhookSecret)

function clientFor(base: string, clock: Clock): PartnerApiClient {
  return sandboxClient(base, { keyId, secret: apiSecret, clock })
}

const trade = (external_reference: string) => ({
  title: 'Bike',
  amount: '120.00',
  currency: 'EUR',
  seller_id: 's-1',
  external_reference,
})

function stateFileIn(prefix: string): string {
  return path.join(mkdtempSync(path.join(tmpdir(), prefix)), 'nested', 'sandbox-state.json')
}

describe('sandbox state across a restart', () => {
  it('keeps trades, milestones, disputes, proposals, the reference counter, an owed refund and undelivered webhooks', async () => {
    const stateFile = stateFileIn('sandbox-state-')
    // first run: no receiver, and a clock that never moves, so every webhook and the refund stay pending
    const frozen = new FakeClock(Date.now())
    const first = createSandbox({ keyId, apiSecret, webhookSecret, stateFile, clock: frozen, logger: testLogger() })
    const firstClient = clientFor(await first.listen(0), frozen)
    const plain = await firstClient.createTrade(trade('state-1'))
    await firstClient.fundTrade(plain.trade_id)
    await firstClient.deliverTrade(plain.trade_id)
    const staged = await firstClient.createTrade({
      ...trade('state-2'),
      milestones: [
        { title: 'Frame', amount: '70.00' },
        { title: 'Wheels', amount: '50.00' },
      ],
    })
    await firstClient.fundTrade(staged.trade_id)
    await firstClient.deliverMilestone(staged.trade_id, staged.milestones![0]!.milestone_id)
    const disputed = await firstClient.createTrade(trade('state-3'))
    await firstClient.fundTrade(disputed.trade_id)
    await firstClient.openDispute(disputed.trade_id, { reason: 'The frame arrived bent and scratched', party: 'buyer' })
    const proposal = await firstClient.createProposal(disputed.trade_id, {
      outcome: 'split',
      split_buyer_pct: '99.99',
      party: 'seller',
    })
    const cancelled = await firstClient.createTrade(trade('state-4'))
    await firstClient.fundTrade(cancelled.trade_id)
    await firstClient.cancelTrade(cancelled.trade_id)
    const before = first.trades()
    await first.close()

    expect(statSync(stateFile).mode & 0o777).toBe(0o600)
    expect(statSync(sandboxJournalFile(stateFile)).mode & 0o777).toBe(0o600)
    expect(readdirSync(path.dirname(stateFile)).toSorted()).toEqual(['sandbox-state.json', 'sandbox-state.json.journal'])
    const saved = readSandboxState(stateFile)!
    expect(saved.sequence).toBe(4)
    expect(saved.trades).toEqual(before)
    // 3 + 2 + 3 + 3 status changes, none delivered
    expect(saved.pendingWebhooks).toHaveLength(11)

    // second run over the same file, with a receiver
    const receiver = await startRecordingReceiver(webhookSecret)
    const second = createSandbox({
      keyId,
      apiSecret,
      webhookSecret,
      stateFile,
      webhookUrl: receiver.url,
      refundDelayMs: 5,
      logger: testLogger(),
    })
    try {
      const secondClient = clientFor(await second.listen(0), systemClock)
      expect(await secondClient.getTrade(plain.trade_id)).toEqual(before.find((t) => t.trade_id === plain.trade_id))
      // the counter carries on: no second TRD-000001
      expect((await secondClient.createTrade(trade('state-5'))).reference).toBe('TRD-000005')
      // the milestone trade goes on from where it stopped
      await secondClient.releaseMilestone(staged.trade_id, staged.milestones![0]!.milestone_id)
      const answered = await secondClient.respondToProposal(disputed.trade_id, proposal.proposal_id, {
        accept: true,
        party: 'buyer',
      })
      expect(answered.trade.resolution).toMatchObject({ outcome: 'split', buyer_pct: '99.99', seller_pct: '0.01' })
      await second.idle()
      // the refund the first run owed was made
      expect(second.trade(cancelled.trade_id).status).toBe('refunded')
      // the webhooks the first run could not deliver arrived, signed, each once
      const received = receiver.received.map((webhook) => `${webhook.body.external_reference}:${webhook.body.status}`)
      for (const event of saved.pendingWebhooks) {
        const body = JSON.parse(event.body) as { external_reference: string; status: string }
        expect(received.filter((entry) => entry === `${body.external_reference}:${body.status}`)).toHaveLength(1)
      }
      expect(received).toEqual(expect.arrayContaining(['state-4:refunded', 'state-3:resolved', 'state-5:created']))
      expect(receiver.received.every((webhook) => webhook.signatureValid)).toBe(true)
    } finally {
      await second.close()
      await receiver.close()
    }
    // once delivered, nothing is pending any more
    const after = readSandboxState(stateFile)!
    expect(after.pendingWebhooks).toEqual([])
    expect(after.sequence).toBe(5)
    expect(after.trades.find((t) => t.trade_id === cancelled.trade_id)?.status).toBe('refunded')
  })

  it('starts empty without a state file, and creates one on the first change', async () => {
    const stateFile = stateFileIn('sandbox-state-new-')
    const sandbox = createSandbox({ keyId, apiSecret, webhookSecret, stateFile, logger: testLogger() })
    try {
      expect(sandbox.trades()).toEqual([])
      expect(readSandboxState(stateFile)).toBeUndefined()
      const created = await clientFor(await sandbox.listen(0), systemClock).createTrade(trade('new-1'))
      expect(created.reference).toBe('TRD-000001')
      expect(readSandboxState(stateFile)?.trades.map((t) => t.trade_id)).toEqual([created.trade_id])
    } finally {
      await sandbox.close()
    }
  })

  it('refuses to start over a state file it cannot read, naming it and keeping it as it was', () => {
    const stateFile = stateFileIn('sandbox-state-bad-')
    mkdirSync(path.dirname(stateFile))
    const start = () => createSandbox({ keyId, apiSecret, webhookSecret, stateFile, logger: testLogger() })
    for (const contents of ['{"version":1,"sequence":', '{"version":1,"sequence":-1,"trades":[],"funded":[],"pendingWebhooks":[]}']) {
      writeFileSync(stateFile, contents)
      expect(start).toThrow(SandboxStateError)
      expect(start).toThrow(stateFile)
      expect(start).toThrow(/move it away .* \[sandbox_state_invalid\]$/)
      expect(readFileSync(stateFile, 'utf8')).toBe(contents)
    }
  })

  it('sends nothing and writes nothing when it cannot listen, e.g. beside a sandbox running over the same file', async () => {
    const stateFile = stateFileIn('sandbox-state-taken-')
    const frozen = new FakeClock(Date.now())
    const first = createSandbox({ keyId, apiSecret, webhookSecret, stateFile, clock: frozen, logger: testLogger() })
    const base = await first.listen(0)
    const firstClient = clientFor(base, frozen)
    const { trade_id: tradeId } = await firstClient.createTrade(trade('taken-1'))
    await firstClient.fundTrade(tradeId)
    await firstClient.cancelTrade(tradeId)
    const contents = [readFileSync(stateFile, 'utf8'), readFileSync(sandboxJournalFile(stateFile), 'utf8')]
    expect(readSandboxState(stateFile)!.pendingWebhooks).toHaveLength(3)

    const receiver = await startRecordingReceiver(webhookSecret)
    const second = createSandbox({
      keyId,
      apiSecret,
      webhookSecret,
      stateFile,
      webhookUrl: receiver.url,
      refundDelayMs: 1,
      logger: testLogger(),
    })
    try {
      await expect(second.listen(Number(new URL(base).port))).rejects.toThrow(/EADDRINUSE/)
      // idle() waits for the restored refund timer too: it found the sandbox closed and did nothing
      await second.idle()
      expect(second.trade(tradeId).status).toBe('cancelled')
      expect(second.deliveryLog).toEqual([])
      expect(receiver.received).toEqual([])
      expect([readFileSync(stateFile, 'utf8'), readFileSync(sandboxJournalFile(stateFile), 'utf8')]).toEqual(contents)
    } finally {
      await first.close()
      await receiver.close()
    }
  })

  it('undoes a call whose state it cannot save: 503 state_not_saved, nothing changed or sent, and the retry does it once', async () => {
    const stateFile = stateFileIn('sandbox-state-unsaved-')
    const receiver = await startRecordingReceiver(webhookSecret)
    const sandbox = createSandbox({ keyId, apiSecret, webhookSecret, stateFile, webhookUrl: receiver.url, refundDelayMs: 1, logger: testLogger() })
    try {
      const client = clientFor(await sandbox.listen(0), systemClock)
      const funded = await client.createTrade(trade('unsaved-1'))
      await client.fundTrade(funded.trade_id)
      await sandbox.idle()
      const statuses = () => receiver.received.map((webhook) => `${String(webhook.body.external_reference)} ${String(webhook.body.status)}`)
      expect(statuses()).toEqual(['unsaved-1 created', 'unsaved-1 funded'])
      const saved = readFileSync(stateFile, 'utf8')

      // a directory in the journal's place and in the snapshot's: the append to the one and the rename over the other
      // fail, as writes to a full or read-only DATA_DIR do (the first call fails on the journal, the second, which
      // writes a new snapshot after a failed append, on the snapshot)
      for (const file of [stateFile, sandboxJournalFile(stateFile)]) {
        rmSync(file)
        mkdirSync(path.join(file, 'in-the-way'), { recursive: true })
      }
      await expect(client.createTrade(trade('unsaved-2'))).rejects.toMatchObject({ status: 503, code: 'state_not_saved' })
      // a cancel of a funded trade owes a refund as well: none is scheduled
      await expect(client.cancelTrade(funded.trade_id)).rejects.toMatchObject({ status: 503, code: 'state_not_saved' })
      await sandbox.idle()
      expect(sandbox.trades().map((t) => [t.external_reference, t.status])).toEqual([['unsaved-1', 'funded']])
      expect(statuses()).toEqual(['unsaved-1 created', 'unsaved-1 funded'])

      // saved again: each retry takes effect once, the reference counter where it was
      for (const file of [stateFile, sandboxJournalFile(stateFile)]) rmSync(file, { recursive: true })
      expect((await client.createTrade(trade('unsaved-2'))).reference).toBe('TRD-000002')
      await client.cancelTrade(funded.trade_id)
      await sandbox.idle()
      expect(sandbox.trades().map((t) => [t.external_reference, t.status])).toEqual([
        ['unsaved-1', 'refunded'],
        ['unsaved-2', 'created'],
      ])
      expect(statuses().toSorted()).toEqual(
        ['unsaved-1 created', 'unsaved-1 funded', 'unsaved-1 cancelled', 'unsaved-1 refunded', 'unsaved-2 created'].toSorted(),
      )
      expect(readSandboxState(stateFile)!.trades.map((t) => t.status)).toEqual(['refunded', 'created'])
      expect(saved).not.toBe(readFileSync(stateFile, 'utf8'))
    } finally {
      await sandbox.close()
      await receiver.close()
    }
  })

  it('keeps no webhook the faults dropped among those owed', async () => {
    const stateFile = stateFileIn('sandbox-state-dropped-')
    const frozen = new FakeClock(Date.now())
    const sandbox = createSandbox({ keyId, apiSecret, webhookSecret, stateFile, clock: frozen, faults: { dropRate: 1 }, logger: testLogger() })
    try {
      const created = await clientFor(await sandbox.listen(0), frozen).createTrade(trade('dropped-1'))
      expect(sandbox.deliveryLog.map((attempt) => attempt.result)).toEqual(['dropped'])
      expect(readSandboxState(stateFile)).toMatchObject({ trades: [{ trade_id: created.trade_id }], pendingWebhooks: [] })
    } finally {
      await sandbox.close()
    }
  })

  it('keeps nothing for an in-memory DATA_DIR, and a file in DATA_DIR otherwise', () => {
    expect(sandboxStateFile('memory://')).toBeUndefined()
    expect(sandboxStateFile('/srv/escrow/data')).toBe('/srv/escrow/data/sandbox-state.json')
  })
})

describe('a sandbox without a state file', () => {
  it('forgets its trades when it is created again (tests, the demo, `cli sandbox`)', async () => {
    const make = (): Sandbox => createSandbox({ keyId, apiSecret, webhookSecret, logger: testLogger() })
    const first = make()
    await clientFor(await first.listen(0), systemClock).createTrade(trade('memory-1'))
    expect(first.trades()).toHaveLength(1)
    await first.close()
    expect(make().trades()).toEqual([])
  })
})
