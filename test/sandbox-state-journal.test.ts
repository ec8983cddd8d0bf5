// The sandbox's state as a snapshot and a journal of changes (src/sandbox/sandbox-state.ts): a change among many
// trades writes that change, not the whole state; a restart after many changes, through several snapshots, has every
// trade; a journal line cut short by a crash is dropped with a warning, and any other unreadable line stops the start.
import { appendFileSync, mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createSandbox } from '../src/sandbox/create-sandbox.js'
import { readSandboxState, sandboxJournalFile, SandboxStateError } from '../src/sandbox/sandbox-state.js'
import { FakeClock } from './helpers/fake-clock.js'
import { logEntries, rememberSecret, testLogger } from './helpers/log-sink.js'
import { sandboxClient } from './helpers/sandbox-client.js'

const keyId = 'pk_sandbox_journal'
const apiSecret = 'sandbox-journal-api-secret-0123456789'
const webhookSecret = 'sandbox-journal-webhook-secret-01234'
rememberSecret(apiSecret, webhookSecret)

const stateFileIn = (prefix: string) => path.join(mkdtempSync(path.join(tmpdir(), prefix)), 'sandbox-state.json')
const sandboxOver = (stateFile: string, options: { clock?: FakeClock } = {}) =>
  createSandbox({ keyId, apiSecret, webhookSecret, stateFile, logger: testLogger(), ...options })
const trade = (external_reference: string) => ({ title: 'Bike', amount: '120.00', currency: 'EUR', seller_id: 's-1', external_reference })
const snapshotOf = (stateFile: string) => JSON.parse(readFileSync(stateFile, 'utf8')) as { trades: unknown[] }

describe('the sandbox state journal', () => {
  it('keeps every trade, its status and the webhooks owed across a restart after many changes, through several snapshots', async () => {
    const stateFile = stateFileIn('sandbox-journal-many-')
    // no receiver and a clock that never moves: every webhook stays owed, each with its first attempt counted
    const frozen = new FakeClock(Date.now())
    const first = sandboxOver(stateFile, { clock: frozen })
    const client = sandboxClient(await first.listen(0), { keyId, secret: apiSecret, clock: frozen })
    const ids: string[] = []
    for (let i = 0; i < 150; i++) ids.push((await client.createTrade(trade(`many-${i}`))).trade_id)
    for (const id of ids) await client.fundTrade(id)
    for (const id of ids.slice(0, 100)) await client.deliverTrade(id)
    for (const id of ids.slice(0, 50)) await client.releaseTrade(id)
    for (const id of ids.slice(140)) await client.cancelTrade(id)
    const before = first.trades()
    await first.close()

    // the snapshot was rewritten along the way (the first one held one trade), and the journal holds what came after it
    expect(snapshotOf(stateFile).trades.length).toBeGreaterThan(1)
    expect(statSync(sandboxJournalFile(stateFile)).size).toBeGreaterThan(0)
    const saved = readSandboxState(stateFile)!
    expect(saved.trades).toEqual(before)
    expect(saved.sequence).toBe(150)
    // created, funded for all; delivered for 100; released for 50; cancelled for 10: each owed, once
    const owed = saved.pendingWebhooks.map((event) => `${JSON.parse(event.body).external_reference} ${event.status}`)
    expect(owed).toHaveLength(150 + 150 + 100 + 50 + 10)
    expect(new Set(owed).size).toBe(owed.length)
    expect(owed.slice(0, 3)).toEqual(['many-0 created', 'many-1 created', 'many-2 created'])
    expect(owed.at(-1)).toBe('many-149 cancelled')

    const second = sandboxOver(stateFile, { clock: frozen })
    try {
      expect(second.trades()).toEqual(before)
      expect(before.filter((t) => t.status === 'released')).toHaveLength(50)
      const again = sandboxClient(await second.listen(0), { keyId, secret: apiSecret, clock: frozen })
      expect((await again.createTrade(trade('many-after'))).reference).toBe('TRD-000151')
    } finally {
      await second.close()
    }
  })

  it('writes a change among thousands of trades as one line appended to the journal, the snapshot left as it was', async () => {
    const stateFile = stateFileIn('sandbox-journal-append-')
    const at = new Date().toISOString()
    const trades = Array.from({ length: 3000 }, (_, i) => ({
      ...trade(`seeded-${i}`),
      trade_id: `trd_${i.toString(16).padStart(16, '0')}`,
      reference: `TRD-${String(i + 1).padStart(6, '0')}`,
      status: 'created',
      buyer_name: null,
      buyer_phone: null,
      milestones: null,
      dispute: null,
      resolution: null,
      created_at: at,
      updated_at: at,
    }))
    // as a sandbox from before the journal left it
    writeFileSync(stateFile, JSON.stringify({ version: 1, sequence: 3000, trades, funded: [], pendingWebhooks: [] }), { mode: 0o600 })
    const sandbox = createSandbox({ keyId, apiSecret, webhookSecret, stateFile, faults: { dropRate: 1 }, logger: testLogger() })
    try {
      const client = sandboxClient(await sandbox.listen(0), { keyId, secret: apiSecret, clock: systemClock })
      // the first change after such a start writes a snapshot that names its journal
      await client.fundTrade(trades[0]!.trade_id)
      const snapshot = { contents: readFileSync(stateFile, 'utf8'), inode: statSync(stateFile).ino }
      expect(snapshot.contents.length).toBeGreaterThan(900_000)
      const journalBefore = statSync(sandboxJournalFile(stateFile)).size
      for (let i = 1; i <= 20; i++) await client.fundTrade(trades[i]!.trade_id)
      // the snapshot is the same file, untouched; the journal grew by the changes alone (a trade's record and a
      // webhook owed then dropped: well under 4 KiB each, where the whole state is over 900 KB)
      expect(statSync(stateFile).ino).toBe(snapshot.inode)
      expect(readFileSync(stateFile, 'utf8')).toBe(snapshot.contents)
      const grown = statSync(sandboxJournalFile(stateFile)).size - journalBefore
      expect(grown).toBeGreaterThan(0)
      expect(grown).toBeLessThan(20 * 4096)
      expect(readSandboxState(stateFile)!.trades.filter((t) => t.status === 'funded').map((t) => t.trade_id)).toEqual(
        trades.slice(0, 21).map((t) => t.trade_id),
      )
      expect(readSandboxState(stateFile)!.funded).toEqual(trades.slice(0, 21).map((t) => t.trade_id))
    } finally {
      await sandbox.close()
    }
  })

  it('drops a last line cut short by a crash with a warning, and carries on from the lines before it', async () => {
    const stateFile = stateFileIn('sandbox-journal-torn-')
    const frozen = new FakeClock(Date.now())
    const first = sandboxOver(stateFile, { clock: frozen })
    const client = sandboxClient(await first.listen(0), { keyId, secret: apiSecret, clock: frozen })
    for (let i = 0; i < 3; i++) await client.fundTrade((await client.createTrade(trade(`torn-${i}`))).trade_id)
    const before = first.trades()
    await first.close()
    const journal = sandboxJournalFile(stateFile)
    const lines = readFileSync(journal, 'utf8').split('\n').filter(Boolean)
    expect(lines.length).toBeGreaterThan(1)
    // the first half of a line, as a process killed in the middle of its write leaves it
    const torn = lines.at(-1)!.slice(0, Math.floor(lines.at(-1)!.length / 2))
    appendFileSync(journal, torn)

    const logged = logEntries().length
    const second = sandboxOver(stateFile, { clock: frozen })
    let after
    try {
      expect(second.trades()).toEqual(before)
      expect(logEntries().slice(logged)).toContainEqual(
        expect.objectContaining({ level: 40, file: journal, line: lines.length + 1, msg: expect.stringContaining('cut short') }),
      )
      // the next change follows what was read, not the torn line: a restart after it reads every line again
      const again = sandboxClient(await second.listen(0), { keyId, secret: apiSecret, clock: frozen })
      expect((await again.createTrade(trade('torn-after'))).reference).toBe('TRD-000004')
      after = second.trades()
    } finally {
      await second.close()
    }
    expect(readFileSync(journal, 'utf8')).not.toContain(torn)
    expect(readSandboxState(stateFile)!.trades).toEqual(after)
    expect(after.map((t) => t.external_reference)).toEqual(['torn-0', 'torn-1', 'torn-2', 'torn-after'])
  })

  it('refuses to start over a journal line it cannot read that is not the last, naming the file and the line', async () => {
    const stateFile = stateFileIn('sandbox-journal-bad-')
    const frozen = new FakeClock(Date.now())
    const first = sandboxOver(stateFile, { clock: frozen })
    const client = sandboxClient(await first.listen(0), { keyId, secret: apiSecret, clock: frozen })
    await client.fundTrade((await client.createTrade(trade('bad-1'))).trade_id)
    await first.close()
    const journal = sandboxJournalFile(stateFile)
    const lines = readFileSync(journal, 'utf8').split('\n').filter(Boolean)
    const damaged = [lines[0], '{"base":', ...lines.slice(1)].join('\n') + '\n'
    writeFileSync(journal, damaged)
    const start = () => sandboxOver(stateFile)
    expect(start).toThrow(SandboxStateError)
    expect(start).toThrow(`The sandbox state journal ${journal} is not valid at line 2: not JSON; move it and sandbox-state.json away`)
    expect(start).toThrow(/ \[sandbox_state_invalid\]$/)
    expect(readFileSync(journal, 'utf8')).toBe(damaged)
  })
})
