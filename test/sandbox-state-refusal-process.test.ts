// The compiled `serve` in local mode over a sandbox state (src/sandbox/sandbox-state.ts: the snapshot and its journal)
// it cannot use: the start is refused as every other refusal of the project's is, one line on stderr naming the
// file (and the journal's line) and ending in its code, no stack, exit 1, and the files are left as they were. The
// line used to end without a code, unlike every other refusal's. A journal that no snapshot names is not read: a
// line of it that could not be read refused the start, telling the operator to move a snapshot that was not there.
import type { ChildProcess } from 'node:child_process'
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { parseConfig } from '../src/config.js'
import { PartnerApiClient } from '../src/partner-api/partner-api.client.js'
import { readSandboxState } from '../src/sandbox/sandbox-state.js'
import { freePort, jsonLogLines, killLeftovers, runCli, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'

const RESET = 'to start the sandbox empty (its trades are then forgotten)'

// a journal line of the snapshot below, whole and valid: what a change the sandbox answered wrote
const SNAPSHOT = '{"version":1,"journal":"0011223344556677","sequence":0,"trades":[],"funded":[],"pendingWebhooks":[]}\n'
const LINE = '{"base":"0011223344556677","sequence":1,"trades":[],"funded":[],"put":[],"drop":[]}\n'

interface Case {
  name: string
  /** Writes the damaged files into `dataDir`. */
  damage: (state: string, journal: string) => void
  /** The refusal's line, given the two files' paths. */
  line: (state: string, journal: string) => string
}

const cases: Case[] = [
  {
    name: 'a snapshot that is not JSON',
    damage: (state) => writeFileSync(state, '{"version":1,"sequence":'),
    line: (state) => `The sandbox state file ${state} is not JSON; move it away ${RESET} [sandbox_state_invalid]`,
  },
  {
    name: 'a snapshot with a field out of shape',
    damage: (state) => writeFileSync(state, SNAPSHOT.replace('"sequence":0', '"sequence":-1')),
    line: (state) => `The sandbox state file ${state} is not valid at sequence: Too small: expected number to be >=0; move it away ${RESET} [sandbox_state_invalid]`,
  },
  {
    name: 'a journal line that cannot be read, not the last',
    damage: (state, journal) => {
      writeFileSync(state, SNAPSHOT)
      writeFileSync(journal, `${LINE}{"base":\n${LINE.replace('"sequence":1', '"sequence":2')}`)
    },
    line: (_state, journal) =>
      `The sandbox state journal ${journal} is not valid at line 2: not JSON; move it and sandbox-state.json away ${RESET} [sandbox_state_invalid]`,
  },
  {
    name: 'a directory where the snapshot is',
    damage: (state) => mkdirSync(state),
    line: (state) => `Cannot read the sandbox state file ${state}: a directory is in its place (EISDIR) [sandbox_state_unreadable]`,
  },
  {
    name: 'a directory where the journal is',
    damage: (state, journal) => {
      writeFileSync(state, SNAPSHOT)
      mkdirSync(journal)
    },
    line: (_state, journal) => `Cannot read the sandbox state journal ${journal}: a directory is in its place (EISDIR) [sandbox_state_unreadable]`,
  },
]

describe('the compiled serve in local mode over a sandbox state it cannot use', () => {
  it.each(cases)('refuses $name: one line naming it and ending in its code, no stack, exit 1, the files kept', async ({ damage, line }) => {
    const dataDir = migratedDataDir('sandbox-state-refusal-')
    const state = path.join(dataDir, 'sandbox-state.json')
    const journal = `${state}.journal`
    damage(state, journal)
    const contents = () => [state, journal].map((file) => (statSync(file, { throwIfNoEntry: false })?.isFile() ? readFileSync(file, 'utf8') : undefined))
    const before = contents()
    const env = { DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0', POLL_ENABLED: 'false', SANDBOX_PORT: String(await freePort()) }
    const result = await runCli(['serve'], env)
    expect({ code: result.code, stderr: result.stderr }).toEqual({ code: 1, stderr: `${line(state, journal)}\n` })
    expect(`${result.stdout}${result.stderr}`).not.toMatch(/\n\s+at |\\n\s+at /)
    // the sandbox never listened: nothing was written over the files
    expect(result.stdout).not.toContain('sandbox platform listening')
    expect(contents()).toEqual(before)
  })
})

describe('the compiled serve in local mode over a journal without its snapshot', () => {
  const children: ChildProcess[] = []
  afterAll(() => killLeftovers(children))

  it('starts without reading it, says so, and the first change writes a snapshot and a new journal in its place', async () => {
    const dataDir = migratedDataDir('sandbox-state-orphan-')
    const state = path.join(dataDir, 'sandbox-state.json')
    const journal = `${state}.journal`
    // the snapshot removed by hand, its journal left, with a line that cannot be read before the last
    const damaged = `${LINE}{"base":\n${LINE.replace('"sequence":1', '"sequence":2')}`
    writeFileSync(journal, damaged, { mode: 0o600 })
    // the local key pair, generated into DATA_DIR/local-secrets.json here, as the service then reads it
    const config = parseConfig({ DATA_DIR: dataDir })
    const { keyId, secret } = config.partner
    rememberSecret(secret, config.webhook.secrets[0]!)
    const env = { DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0', POLL_ENABLED: 'false', SANDBOX_PORT: String(await freePort()) }
    const child = spawnCli(['serve'], env)
    children.push(child)
    try {
      const logged = jsonLogLines(child)
      // it was refused here: "… is not valid at line 2: not JSON; move it and sandbox-state.json away …", exit 1
      const { url } = await waitForLogLine(child, 'sandbox platform listening')
      expect(logged).toContainEqual(
        expect.objectContaining({ level: 40, file: journal, snapshot: state, msg: expect.stringContaining('no snapshot names it') }),
      )
      // nothing written at the start
      expect(existsSync(state)).toBe(false)
      expect(readFileSync(journal, 'utf8')).toBe(damaged)

      const client = new PartnerApiClient({ baseUrl: String(url), keyId, secret, env: 'sandbox', kind: 'marketplace', timeoutMs: 120_000, clock: systemClock, logger: testLogger([secret]) })
      const trade = await client.createTrade({ title: 'Bike', amount: '120.00', currency: 'EUR', seller_id: 's-1', external_reference: 'orphan-1' })
      // the sandbox started empty: its first trade
      expect(trade.reference).toBe('TRD-000001')
      expect(await stopChild(child)).toBe(0)
      // the change is in a new snapshot, and the journal beside it is a new one: every line (the webhook's delivery,
      // when it came before the stop) names that snapshot
      const snapshot = JSON.parse(readFileSync(state, 'utf8')) as { journal: string }
      for (const line of readFileSync(journal, 'utf8').split('\n').filter(Boolean)) expect(JSON.parse(line)).toMatchObject({ base: snapshot.journal })
      expect(readSandboxState(state)!.trades.map((saved) => saved.trade_id)).toEqual([trade.trade_id])
    } finally {
      await stopChild(child)
    }
  })
})
