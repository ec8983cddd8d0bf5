// A snapshot whose journal is missing: a sandbox killed in a compaction after the old journal was removed and before
// the new one was created. Nothing was written to that journal, so the snapshot is the whole state. The first change
// after the start failed (its append opens the journal without creating it): 503 state_not_saved, an error line
// with a stack. Now it writes a new snapshot and journal, and the trade is there after a restart.
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { createSandbox } from '../src/sandbox/create-sandbox.js'
import { rememberSecret, taggedLogger, testLogger } from './helpers/log-sink.js'
import { sandboxClient } from './helpers/sandbox-client.js'

const keyId = 'pk_sandbox_missing_journal'
const apiSecret = 'sandbox-missing-journal-api-secret-0123'
const webhookSecret = 'sandbox-missing-journal-webhook-secret'
rememberSecret(apiSecret, webhookSecret)

// a snapshot naming journal 0011223344556677, with one trade in it
const TRADE = {
  trade_id: 'tr_before',
  reference: 'TRD-000001',
  status: 'created',
  external_reference: 'before-1',
  title: 'Before',
  amount: '10.00',
  currency: 'EUR',
  seller_id: 's-1',
  buyer_name: null,
  buyer_phone: null,
  milestones: null,
  dispute: null,
  resolution: null,
  created_at: '2026-12-01T00:00:00.000Z',
  updated_at: '2026-12-01T00:00:00.000Z',
}
const SNAPSHOT = `${JSON.stringify({ version: 1, journal: '0011223344556677', sequence: 1, trades: [TRADE], funded: [], pendingWebhooks: [] })}\n`

describe('a sandbox state whose journal is missing', () => {
  it('takes the first change (a new snapshot and journal) and keeps it across a restart', async () => {
    const directory = mkdtempSync(path.join(tmpdir(), 'sandbox-missing-journal-'))
    const stateFile = path.join(directory, 'state', 'sandbox-state.json')
    mkdirSync(path.dirname(stateFile))
    writeFileSync(stateFile, SNAPSHOT, { mode: 0o600 })

    // the sandbox's own lines: another file's in the same worker are not its (log-sink.ts, taggedLogger)
    const own = taggedLogger()
    const first = createSandbox({ keyId, apiSecret, webhookSecret, stateFile, logger: own.logger })
    try {
      const client = sandboxClient(await first.listen(0), { keyId, secret: apiSecret })
      expect((await client.getTrade('tr_before')).reference).toBe('TRD-000001')
      const created = await client.createTrade({ title: 'After', amount: '5.00', currency: 'EUR', seller_id: 's-1', external_reference: 'after-1' })
      expect(created.reference).toBe('TRD-000002')
    } finally {
      await first.close()
    }
    expect(own.entries().filter((entry) => entry.level === 50 || entry.level === 'error')).toEqual([])
    expect(readdirSync(path.dirname(stateFile)).toSorted()).toEqual(['sandbox-state.json', 'sandbox-state.json.journal'])

    const second = createSandbox({ keyId, apiSecret, webhookSecret, stateFile, logger: testLogger() })
    try {
      await second.listen(0)
      expect(second.trades().map((trade) => [trade.external_reference, trade.reference])).toEqual([
        ['before-1', 'TRD-000001'],
        ['after-1', 'TRD-000002'],
      ])
    } finally {
      await second.close()
      rmSync(directory, { recursive: true, force: true })
    }
  })
})
