// A fork's reaction handler, in a fork's build: the compiled service with src/reactions/partner-handlers.js as a fork
// writes it (the project's own registers none, and the suite's other processes leave it out), run by the compiled
// `serve` on embedded PGlite, and on Postgres when TEST_DATABASE_URL is given. An order is created and a signed
// `trade.funded` webhook moves it; the handler writes each call, with its event, to a file of the test's. Seen from
// outside only: the webhook in, the handler's file, the service's log, and `reactions list` of the fork's CLI. The
// contract is README's "Reactions": at least once per (event, handler), its event id the idempotency key; a stop
// gives a running handler up to half of SHUTDOWN_TIMEOUT_MS, then aborts it and gives its job back, to run again.
import type { ChildProcess } from 'node:child_process'
import { readFileSync, rmSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { casesLeftOut } from './helpers/cli-database.js'
import { endedAfterAll, jsonLogLines, postgresServeEnv, receiverEnv, signalAndClose, startedCli, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { forkBuild } from './helpers/fork-build.js'
import { createTestDatabase } from './helpers/test-database.js'
import { postDelivery, tradePayload } from './helpers/webhook-delivery.js'

const { children, cleanups } = endedAfterAll()

const HANDLER = 'ship-goods'

/** A line the fork's handler writes: a call started (with its event and attempt), held, aborted or returned. */
interface Note {
  call: 'started' | 'held' | 'aborted' | 'returned'
  eventId: string
  [field: string]: unknown
}

/**
 * A fork's build whose partner-handlers.js registers `ship-goods` for trade.funded, as README's example does. Each call
 * writes its event to `notes`; while the file `hold` is there it waits (a shipping system slow to answer), and it ends
 * on its signal, as the contract asks.
 */
function forkWithReactionHandler() {
  const { directory, cli, write } = forkBuild(cleanups)
  const notesFile = path.join(directory, 'ship-goods.jsonl')
  const hold = path.join(directory, 'hold')
  writeFileSync(notesFile, '')
  write(
    'dist/src/reactions/partner-handlers.js',
    `import { appendFileSync, existsSync } from 'node:fs'
const note = (line) => appendFileSync(${JSON.stringify(notesFile)}, JSON.stringify(line) + '\\n')
export function registerPartnerHandlers(reactions, setup) {
  reactions.on('trade.funded', ${JSON.stringify(HANDLER)}, async (event, { signal, attempt }) => {
    const { eventId, type, externalReference, from, to, source, sequence } = event
    note({ call: 'started', eventId, type, externalReference, from, to, source, sequence, attempt })
    if (existsSync(${JSON.stringify(hold)})) {
      note({ call: 'held', eventId })
      await new Promise((resolve, reject) => {
        const aborted = () => {
          clearInterval(look)
          note({ call: 'aborted', eventId, reason: signal.reason.message })
          reject(signal.reason)
        }
        const look = setInterval(() => {
          if (existsSync(${JSON.stringify(hold)})) return
          clearInterval(look)
          signal.removeEventListener('abort', aborted)
          resolve()
        }, 20)
        signal.addEventListener('abort', aborted, { once: true })
      })
    }
    note({ call: 'returned', eventId })
  }, { timeoutMs: 15_000 })
}
`,
  )
  const notes = (): Note[] =>
    readFileSync(notesFile, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as Note)
  return { cli, hold, notes }
}

/** A record of `reactions list --json`. */
interface Listed {
  id: string | null
  eventId: string
  externalReference: string
  type: string
  handler: string
  state: string
  attempts: number
  runAt: string | null
  lastError: string | null
}

/** Reads `read()` every 50 ms until `holds` is true of what it read, and returns that; fails with what it read last. */
async function readUntil<T>(read: () => T | Promise<T>, holds: (value: T) => boolean, what: string, timeoutMs = 120_000): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const value = await read()
    if (holds(value)) return value
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting until ${what}; last seen: ${JSON.stringify(value)}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

const kinds = [
  ['embedded PGlite', 'pglite'],
  ['Postgres through DATABASE_URL (Postgres)', 'postgres'],
] as const

for (const [name, kind] of kinds) describe.skipIf(casesLeftOut(kind))(`a fork’s reaction handler in partner-handlers.js, run by the compiled serve on ${name}`, () => {
  /** The environment of `serve` (and its commands) on a database of the kind of its own, with `settings`. */
  async function serveEnv(settings: Record<string, string> = {}): Promise<Record<string, string>> {
    const dataDir = migratedDataDir('partner-handlers-')
    if (kind === 'pglite') return { ...receiverEnv(dataDir), ...settings }
    const database = await createTestDatabase({ kind: 'postgres' })
    cleanups.push(() => database.close())
    return { ...postgresServeEnv({ databaseUrl: database.url!, dataDir }), ...settings }
  }

  /** The fork with the environment `env`: its `serve`, its commands, and an order moved to funded by a webhook. */
  function fork(env: Record<string, string>) {
    const build = forkWithReactionHandler()
    const command = async (...args: string[]) => startedCli(args, env, children, { cli: build.cli }).ended()
    const list = async (...options: string[]): Promise<Listed[]> => {
      const listed = await command('reactions', 'list', '--handler', HANDLER, '--json', ...options)
      expect(listed, 'reactions list').toMatchObject({ code: 0, stderr: '' })
      return JSON.parse(listed.stdout) as Listed[]
    }
    const serve = async (): Promise<{ child: ChildProcess; url: string; log: Record<string, unknown>[] }> => {
      const { child } = startedCli(['serve'], env, children, { cli: build.cli })
      const log = jsonLogLines(child)
      const { url } = (await waitForLogLine(child, 'service listening')) as { url: string }
      return { child, url, log }
    }
    /** Creates the order `reference` and sends the platform's trade.funded webhook for it (delivery `dlv-REFERENCE`). */
    const funded = async (url: string, reference: string) => {
      expect(await command('orders', 'create', '--external-reference', reference)).toMatchObject({ code: 0, stderr: '' })
      const delivered = await postDelivery(url, { id: `dlv-${reference}`, body: JSON.stringify(tradePayload(reference, 'funded')) })
      expect(delivered).toEqual({ status: 200, answer: { received: true } })
    }
    /** Waits until the handler's call of `reference` is held and its job is `running` (handed off by its stream's batch). */
    const heldAndRunning = async (reference: string): Promise<{ eventId: string; jobId: string }> => {
      const [started] = await readUntil(
        () => build.notes(),
        (notes) => notes.some((note) => note.call === 'held'),
        'the handler is held',
      )
      const [running] = await readUntil(() => list('--state', 'running'), (jobs) => jobs.length === 1, `the job of ${reference} is running`)
      expect(running).toMatchObject({ eventId: started!.eventId, externalReference: reference, state: 'running', attempts: 1 })
      return { eventId: started!.eventId, jobId: running!.id! }
    }
    return { ...build, command, list, serve, funded, heldAndRunning }
  }

  /** A fork with `settings` whose serve runs, its handler's call of `reference`'s trade.funded held, its job running. */
  async function heldIn(settings: Record<string, string>, reference: string) {
    const shop = fork(await serveEnv(settings))
    writeFileSync(shop.hold, '')
    const first = await shop.serve()
    await shop.funded(first.url, reference)
    return { shop, first, ...(await shop.heldAndRunning(reference)) }
  }

  /** The note of a call that started for `reference`'s trade.funded (its first, from an order with no status yet). */
  const startedFor = (reference: string, eventId: string, attempt: number): Note => ({
    call: 'started',
    eventId,
    type: 'trade.funded',
    externalReference: reference,
    from: null,
    to: 'funded',
    source: 'webhook',
    sequence: 1,
    attempt,
  })

  /** What the service logged from its 'shutting down' on (level 30 info, 40 warn, 50 error). */
  const fromShutdown = (log: Record<string, unknown>[]) => log.slice(log.findIndex((line) => line.msg === 'shutting down'))

  it('calls the handler once with the transition’s event, and `reactions list` shows it done', async () => {
    const shop = fork(await serveEnv())
    const { child, url, log } = await shop.serve()
    await shop.funded(url, 'order-1')

    const notes = await readUntil(() => shop.notes(), (seen) => seen.some((note) => note.call === 'returned'), 'the handler has returned')
    const eventId = notes[0]!.eventId
    expect(notes).toEqual([startedFor('order-1', eventId, 1), { call: 'returned', eventId }])
    // done on its first attempt: no job row, its record is its batch's (the job id is -, null in --json)
    const [listed] = await readUntil(() => shop.list(), (jobs) => jobs[0]?.state === 'done', 'its job is done')
    expect(listed).toMatchObject({ id: null, eventId, externalReference: 'order-1', type: 'trade.funded', handler: HANDLER, state: 'done', attempts: 1 })

    expect((await signalAndClose(child, 'SIGTERM')).code).toBe(0)
    expect(log.filter((line) => Number(line.level) >= 40)).toEqual([])
    // called once: not again at the stop
    expect(shop.notes()).toEqual(notes)
  })

  it('calls it again with the same event id after serve is killed (SIGKILL) mid-call, and the job ends done', async () => {
    // the dead process's job comes back once its lease runs out (REACTION_LEASE_S, 300 s by default)
    const { shop, first, eventId, jobId } = await heldIn({ REACTION_LEASE_S: '20' }, 'order-2')
    expect(await signalAndClose(first.child, 'SIGKILL')).toEqual({ code: null, signal: 'SIGKILL' })
    expect(shop.notes()).toEqual([startedFor('order-2', eventId, 1), { call: 'held', eventId }])

    const second = await shop.serve()
    const again = await readUntil(() => shop.notes(), (notes) => notes.length >= 4, 'the handler is called again and held', 180_000)
    // the same event, the same idempotency key: a second attempt of it, not a new event
    expect(again.slice(2)).toEqual([startedFor('order-2', eventId, 2), { call: 'held', eventId }])
    rmSync(shop.hold)
    const [done] = await readUntil(() => shop.list(), (jobs) => jobs[0]?.state === 'done', 'its job is done')
    expect(done).toMatchObject({ id: jobId, eventId, state: 'done', attempts: 2, lastError: null })
    expect((await signalAndClose(second.child, 'SIGTERM')).code).toBe(0)
    expect(shop.notes().slice(4)).toEqual([{ call: 'returned', eventId }])
  })

  it('a stop (SIGTERM) waits for a held handler that returns within half of SHUTDOWN_TIMEOUT_MS: its job is done, its call not made again', async () => {
    // the handlers' grace is 30 s: the hold is let go as soon as the stop has begun
    const { shop, first, eventId, jobId } = await heldIn({ SHUTDOWN_TIMEOUT_MS: '60000' }, 'order-3')
    const { child, log } = first

    const stopped = signalAndClose(child, 'SIGTERM')
    await readUntil(() => log.some((line) => line.msg === 'shutting down'), Boolean, 'the stop has begun')
    rmSync(shop.hold)
    expect((await stopped).code).toBe(0)
    expect(shop.notes()).toEqual([startedFor('order-3', eventId, 1), { call: 'held', eventId }, { call: 'returned', eventId }])
    // no handler said to be stopped: the stop waited for it
    expect(fromShutdown(log).map((line) => [line.level, line.msg])).toEqual([
      [30, 'shutting down'],
      [30, 'reaction dispatcher stopped'],
      [30, 'stopped'],
    ])
    expect(await shop.list()).toMatchObject([{ id: jobId, eventId, state: 'done', attempts: 1, lastError: null }])
  })

  it('a stop (SIGTERM) past half of SHUTDOWN_TIMEOUT_MS aborts the held handler, gives its job back, and the next start runs it with the same event id', async () => {
    // the handlers' grace is 2 s: the hold outlasts it
    const { shop, first, eventId, jobId } = await heldIn({ SHUTDOWN_TIMEOUT_MS: '4000' }, 'order-4')

    expect((await signalAndClose(first.child, 'SIGTERM')).code).toBe(0)
    expect(shop.notes()).toEqual([
      startedFor('order-4', eventId, 1),
      { call: 'held', eventId },
      { call: 'aborted', eventId, reason: 'the service is shutting down' },
    ])
    expect(fromShutdown(first.log)).toContainEqual(
      expect.objectContaining({ level: 40, handler: HANDLER, jobs: 1, msg: 'reaction handlers stopped before finishing; their jobs run again' }),
    )
    // given back: pending and due now, the interrupted attempt not counted
    const [given] = await shop.list()
    expect(given).toMatchObject({ id: jobId, eventId, state: 'pending', attempts: 0, lastError: null })
    expect(Date.parse(given!.runAt!)).toBeLessThanOrEqual(Date.now())

    rmSync(shop.hold)
    const second = await shop.serve()
    const [done] = await readUntil(() => shop.list(), (jobs) => jobs[0]?.state === 'done', 'its job is done at the next start')
    expect(done).toMatchObject({ id: jobId, eventId, state: 'done', attempts: 1, lastError: null })
    expect((await signalAndClose(second.child, 'SIGTERM')).code).toBe(0)
    expect(shop.notes().slice(3)).toEqual([startedFor('order-4', eventId, 1), { call: 'returned', eventId }])
    // The handler ended on its abort: README keeps the warning "did not return after its abort at shutdown … make the
    // handler end on its signal" for a call that ignores it. The stream's batch aborts its calls and ends their grace in
    // the same turn (stream-worker.ts, onStop), so a call that rejects at once on its signal still loses that race, and
    // the warning is logged of it too.
    expect(fromShutdown(first.log).map((line) => [line.level, line.msg])).toEqual([
      [30, 'shutting down'],
      [40, 'reaction handlers stopped before finishing; their jobs run again'],
      [30, 'reaction dispatcher stopped'],
      [30, 'stopped'],
    ])
  })
})
