// An output that cannot be written (the log's disk full: ENOSPC, here /dev/full) is not the service's failure. The
// JSON log's writer threw that error, and pino's flush at the exit then retried the write without end: the service
// answered nothing more, not even /healthz, and only SIGKILL ended it. With LOG_PRETTY it crashed with a stack
// trace, and so did a command whose output could not be written (`orders list > /dev/full`).
import { type ChildProcess, spawn } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { closeSync, existsSync, openSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { childEnv, freePort, killLeftovers, receiverEnv, remoteServeEnv, runCli, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { postDelivery, signBody, tradePayload } from './helpers/webhook-delivery.js'

const root = path.resolve(import.meta.dirname, '..')
const children: ChildProcess[] = []
// the platform: answers a create with the trade `created`, a fund with it `funded`; what it was sent, counted
const funds: string[] = []
const platform = createServer((req, res) => {
  req.resume()
  req.on('end', () => {
    const funded = req.url?.endsWith('/fund/') === true
    if (funded) funds.push(req.url!)
    const reference = funded ? decodeURIComponent(req.url!.split('/')[5]!).replace(/^tr_/, '') : 'full-open'
    res.writeHead(funded ? 200 : 201, { 'content-type': 'application/json' })
    res.end(JSON.stringify(tradeRecord({ trade_id: `tr_${reference}`, external_reference: reference, status: funded ? 'funded' : 'created' })))
  })
})
afterAll(async () => {
  killLeftovers(children)
  platform.closeAllConnections()
  await new Promise((resolve) => platform.close(resolve))
})

async function platformUrl(): Promise<string> {
  if (!platform.listening) {
    platform.listen(0, '127.0.0.1')
    await once(platform, 'listening')
  }
  return `http://127.0.0.1:${(platform.address() as AddressInfo).port}`
}

const DONE_BUT_LOST =
  /(?:^|\n)could not write to stdout \(ENOSPC\): the command was done \(the platform took it and the order records it\); only its output is lost: see the order with `orders show`, do not run the command again \[stdout_failed\]\n$/

/** The line a command that made its change (other than a trade call) says when only its output is lost. */
function doneButLost(done: string): RegExp {
  const escaped = done.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')
  return new RegExp(`(?:^|\\n)could not write to stdout \\(ENOSPC\\): the command was done \\(${escaped}\\); only its output is lost: [^\\n]+, do not run the command again \\[stdout_failed\\]\\n$`)
}

/** `args` with its stdout on /dev/full: the exit code and stderr. */
async function onFullOutput(args: string[], env: Record<string, string>): Promise<{ code: number | null; stderr: string }> {
  const { child, stderr } = runOnFullOutput(args, env)
  const [code] = (await once(child, 'exit')) as [number | null]
  return { code, stderr: stderr() }
}

/** The compiled CLI with its stdout on /dev/full (every write fails with ENOSPC), its stderr read. */
function runOnFullOutput(args: string[], env: Record<string, string>) {
  const full = openSync('/dev/full', 'w')
  const child = spawn(process.execPath, [path.join(root, 'dist/src/cli.js'), ...args], { cwd: root, env: childEnv(env), stdio: ['ignore', full, 'pipe'] })
  closeSync(full)
  children.push(child)
  let stderr = ''
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  return { child, stderr: () => stderr }
}

/**
 * `trades open full-open` as usual, then `trades fund full-open` with its stdout on /dev/full: the fund reaches the
 * platform once, and the command says it was done and exits 0.
 */
async function fundsWithOutputLost(env: Record<string, string>): Promise<void> {
  const opened = await runCli(['trades', 'open', 'full-open', '--title', 'Lamp', '--amount', '5.00', '--currency', 'EUR', '--seller', 's_1'], env)
  expect([opened.code, opened.stderr]).toEqual([0, ''])
  const before = funds.length
  const { child, stderr } = runOnFullOutput(['trades', 'fund', 'full-open'], env)
  const [code] = (await once(child, 'exit')) as [number | null]
  expect(stderr()).toMatch(DONE_BUT_LOST)
  expect(code).toBe(0)
  expect(funds.length - before).toBe(1)
}

// a bound on a hang, as waitForLogLine's (the tests' own 5 min): a start on a loaded 2-core machine took over 2 min
async function until(check: () => Promise<boolean>, what: string): Promise<void> {
  for (const deadline = Date.now() + 240_000; Date.now() < deadline; ) {
    if (await check().catch(() => false)) return
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
  throw new Error(`timed out: ${what}`)
}

describe.skipIf(!existsSync('/dev/full'))('stdout that cannot be written (ENOSPC)', () => {
  it.each([['JSON lines', 'false'], ['LOG_PRETTY', 'true']])('the service (%s) goes on taking deliveries, says so once on stderr, and stops on SIGTERM with exit 0', async (_, pretty) => {
    const port = await freePort()
    // a migrated copy: what a first start does is not this test's (its initdb cost 6-15 s of a core)
    const dataDir = migratedDataDir(`output-full-serve-${pretty}-`)
    // SHUTDOWN_TIMEOUT_MS: its 10-s default, past which the service exits 1, was a loaded machine's time to stop too
    const { child, stderr } = runOnFullOutput(['serve'], {
      ...receiverEnv(dataDir),
      PORT: String(port),
      LOG_PRETTY: pretty,
      SHUTDOWN_TIMEOUT_MS: '120000',
    })
    const url = `http://127.0.0.1:${port}`
    await until(async () => (await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(5_000) })).status === 200, 'the service is ready')
    // every delivery answered, each a few log lines no one can write
    for (let n = 0; n < 20; n++) {
      const body = JSON.stringify(tradePayload(`full-${n}`, 'funded'))
      const answer = await fetch(`${url}/webhooks/partner`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-partner-delivery-id': randomUUID(), 'x-partner-signature': signBody(body) },
        body,
        signal: AbortSignal.timeout(30_000),
      })
      expect(answer.status).toBe(200)
    }
    expect((await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(30_000) })).status).toBe(200)
    const exited = once(child, 'exit')
    child.kill('SIGTERM')
    // past its SHUTDOWN_TIMEOUT_MS it exits on its own, with 1; one that hung is ended here (and fails the check)
    const hung = setTimeout(() => child.kill('SIGKILL'), 150_000)
    const [code, signal] = (await exited) as [number | null, NodeJS.Signals | null]
    clearTimeout(hung)
    expect({ code, signal }).toEqual({ code: 0, signal: null })
    const said = stderr().split('\n').filter((line) => line.startsWith('could not write'))
    expect(said.length).toBeGreaterThanOrEqual(1)
    expect(new Set(said).size).toBe(said.length)
    expect(stderr()).not.toMatch(/\n\s+at /)
  })

  it('a command whose output cannot be written exits 1 with one line saying so, no stack trace', async () => {
    const { child, stderr } = runOnFullOutput(['orders', 'list'], { DATA_DIR: migratedDataDir('output-full-cli-') })
    const [code] = (await once(child, 'exit')) as [number | null]
    expect(code).toBe(1)
    expect(stderr()).toMatch(/(?:^|\n)could not write to stdout \(ENOSPC\): what follows on it is lost \[stdout_failed\]\n$/)
    expect(stderr()).not.toMatch(/\n\s+at /)
  })

  // A script that took that exit 1 for a failure ran the fund again after it was done: the change made, only the
  // report of it is lost, and the command says so and exits 0
  it('a trade call the platform took exits 0 when only its output is lost, saying the command was done', async () => {
    const dataDir = migratedDataDir('output-full-fund-')
    const env = { ...remoteServeEnv({ dataDir, platformUrl: await platformUrl() }), POLL_ENABLED: 'false' }
    await fundsWithOutputLost(env)
    const shown = await runCli(['orders', 'show', 'full-open', '--json'], env)
    expect(JSON.parse(shown.stdout)).toMatchObject({ externalReference: 'full-open', tradeStatus: 'funded' })

    // a command that failed still exits 1, its own line said (the order has a trade already)
    const again = runOnFullOutput(['trades', 'open', 'full-open', '--title', 'Lamp', '--amount', '5.00', '--currency', 'EUR', '--seller', 's_1'], env)
    const [againCode] = (await once(again.child, 'exit')) as [number | null]
    expect(againCode).toBe(1)
    expect(again.stderr()).toContain('[trade_exists]')
  })

  it('a second terminal whose output is lost after the service did the fund exits 0 and says the command was done', async () => {
    const dataDir = migratedDataDir('output-full-forwarded-')
    const service = spawnCli(['serve'], { ...remoteServeEnv({ dataDir, platformUrl: await platformUrl() }), POLL_ENABLED: 'false' })
    children.push(service)
    try {
      await waitForLogLine(service, 'service listening')
      const secondTerminal = { DATA_DIR: dataDir }
      await fundsWithOutputLost(secondTerminal)

      // a forwarded read whose output is lost is still a failure
      const listed = runOnFullOutput(['orders', 'list'], secondTerminal)
      const [listCode] = (await once(listed.child, 'exit')) as [number | null]
      expect(listCode).toBe(1)
      expect(listed.stderr()).toMatch(/could not write to stdout \(ENOSPC\): what follows on it is lost \[stdout_failed\]\n$/)
    } finally {
      await stopChild(service)
    }
  }, 300_000)

  // `orders create > /dev/full` exited 1 after the order was created: a script ran it again, to be told [order_exists]
  it('a command that made its change exits 0 when only its output is lost, on its own and forwarded, saying what was done', async () => {
    const dataDir = migratedDataDir('output-full-create-')
    const alone = await onFullOutput(['orders', 'create', '--external-reference', 'full-alone'], { DATA_DIR: dataDir })
    expect(alone.stderr).toMatch(doneButLost('the order was created'))
    expect(alone.code).toBe(0)
    const again = await runCli(['orders', 'create', '--external-reference', 'full-alone'], { DATA_DIR: dataDir })
    expect([again.code, again.stderr]).toEqual([1, expect.stringContaining('[order_exists]')])

    const service = spawnCli(['serve'], { ...remoteServeEnv({ dataDir, platformUrl: 'http://127.0.0.1:1' }), POLL_ENABLED: 'false' })
    children.push(service)
    try {
      await waitForLogLine(service, 'service listening')
      const secondTerminal = { DATA_DIR: dataDir }
      const created = await onFullOutput(['orders', 'create', '--external-reference', 'full-forwarded'], secondTerminal)
      expect(created.stderr).toMatch(doneButLost('the order was created'))
      expect(created.code).toBe(0)
      expect((await runCli(['orders', 'show', 'full-forwarded'], secondTerminal)).code).toBe(0)

      // a delivery parked for a reference that is not this backend's, then dismissed
      const { webhookUrl } = JSON.parse(readFileSync(path.join(dataDir, 'serve.json'), 'utf8')) as { webhookUrl: string }
      const parked = await postDelivery(new URL(webhookUrl).origin, { id: randomUUID(), body: JSON.stringify(tradePayload('full-parked', 'funded')) })
      expect(parked.status).toBe(200)
      const dismissed = await onFullOutput(['deliveries', 'dismiss', 'full-parked'], secondTerminal)
      expect(dismissed.stderr).toMatch(doneButLost('the parked deliveries were dismissed'))
      expect(dismissed.code).toBe(0)
      const dismissedAgain = await runCli(['deliveries', 'dismiss', 'full-parked'], secondTerminal)
      expect([dismissedAgain.code, dismissedAgain.stderr]).toEqual([1, expect.stringContaining('[not_found]')])

      const pruned = await onFullOutput(['prune'], secondTerminal)
      expect(pruned.stderr).toMatch(doneButLost('what it counts was pruned'))
      expect(pruned.code).toBe(0)
      // a read changes nothing: its lost output is still its failure
      const dryRun = await onFullOutput(['prune', '--dry-run'], secondTerminal)
      expect([dryRun.code, dryRun.stderr]).toEqual([1, expect.stringMatching(/what follows on it is lost \[stdout_failed\]\n$/)])
    } finally {
      await stopChild(service)
    }
  }, 300_000)
})
