// The compiled `serve` with a fork's reaction handler that ignores its AbortSignal and never returns, stopped with
// SIGTERM (on embedded PGlite, and on Postgres when TEST_DATABASE_URL is given): the stop does not wait for the call
// past its bound; the job is given back before the process exits (pending, due now, not running under a lease of
// REACTION_LEASE_S), so the next process runs it at once, with the same event id (at least once). Before, the
// process exited 1 past its bound and left the job running, leased for 300 s, to every replica.
import { type ChildProcess, spawn } from 'node:child_process'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { type DatabaseHandle, openDatabase } from '../src/db/open-database.js'
import { ensureReactionStreams } from '../src/reactions/reaction-stream.repository.js'
import { HANDLER_IGNORED_ABORT } from '../src/reactions/stream-worker.js'
import { casesLeftOut } from './helpers/cli-database.js'
import { childEnv, jsonLogLines, killLeftovers, postgresServeEnv, receiverEnv, signalAndClose, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { moveNewOrder } from './helpers/orders.js'
import { createTestDatabase } from './helpers/test-database.js'

const root = path.resolve(import.meta.dirname, '..')
const HANDLER = 'fork-handler'

const children: ChildProcess[] = []
const cleanups: (() => Promise<void>)[] = []
afterAll(async () => {
  killLeftovers(children)
  for (const cleanup of cleanups) await cleanup()
})

/** `serve` of dist/ with the fork's handler registered (test/fixtures/serve-fork-handler.mjs): it hangs or returns. */
function serveWithForkHandler(env: Record<string, string>, behaviour: 'hang' | 'return'): ChildProcess {
  const child = spawn(process.execPath, [path.join(root, 'test/fixtures/serve-fork-handler.mjs'), path.join(root, 'dist')], {
    cwd: root,
    env: childEnv({ ...env, FORK_HANDLER: behaviour }),
    stdio: 'pipe',
  })
  children.push(child)
  return child
}

/** A database of the kind with one transition committed for the handler; `open` gives a handle on it while no serve runs. */
async function withOneEvent(kind: 'pglite' | 'postgres'): Promise<{ env: Record<string, string>; open: () => Promise<DatabaseHandle> }> {
  const dataDir = migratedDataDir('reactions-stop-hung-')
  let open: () => Promise<DatabaseHandle>
  let env: Record<string, string>
  if (kind === 'pglite') {
    open = async () => openDatabase({ dataDir })
    env = receiverEnv(dataDir)
  } else {
    const database = await createTestDatabase({ kind: 'postgres' })
    cleanups.push(() => database.close())
    // (the test's own handle stays open; closing what open() gave closes another)
    open = async () => database.openAnother()
    env = postgresServeEnv({ databaseUrl: database.url!, dataDir })
  }
  const seed = await open()
  try {
    // the handler's stream starts before the transition, so the first process reads it
    await ensureReactionStreams(seed.db, [HANDLER], new Date())
    await moveNewOrder(seed.db, { externalReference: 'hung-1', statuses: ['funded'], handlersFor: () => [HANDLER], now: () => new Date() })
  } finally {
    await seed.close()
  }
  return { env, open }
}

async function jobsOf(open: () => Promise<DatabaseHandle>) {
  const database = await open()
  try {
    return await database.db
      .selectFrom('reactionJobs')
      .select(['eventId', 'state', 'attempts', 'leaseExpiresAt', 'runAt'])
      .where('handler', '=', HANDLER)
      .execute()
  } finally {
    await database.close()
  }
}

const kinds = [
  ['embedded PGlite', 'pglite'],
  ['Postgres through DATABASE_URL (Postgres)', 'postgres'],
] as const

for (const [name, kind] of kinds) describe.skipIf(casesLeftOut(kind))(`the compiled serve on ${name}, stopped while a fork handler that ignores its abort hangs`, () => {
  it('gives the job back before it exits, and the next process runs it at once', async () => {
    const { env, open } = await withOneEvent(kind)

    const first = serveWithForkHandler(env, 'hang')
    const lines = jsonLogLines(first)
    const called = await waitForLogLine(first, 'fork handler called')
    const { code } = await signalAndClose(first, 'SIGTERM')
    // named as the call that ignored its abort (a handler that ends on it is not: test/partner-handlers-process.test.ts)
    expect(lines.filter((line) => line.level === 40).map((line) => [line.msg, line.handler, line.eventId])).toEqual([
      [HANDLER_IGNORED_ABORT, HANDLER, called.eventId],
      ['reaction handlers stopped before finishing; their jobs run again', HANDLER, undefined],
    ])

    // not running under a lease of REACTION_LEASE_S (300 s): pending and due now, the call that never ended not counted
    const [given] = await jobsOf(open)
    expect(given).toMatchObject({ eventId: called.eventId, state: 'pending', attempts: 0, leaseExpiresAt: null })
    expect(given!.runAt.getTime()).toBeLessThanOrEqual(Date.now())
    // within its bound: the stop did not wait for the call
    expect(code).toBe(0)

    const second = serveWithForkHandler(env, 'return')
    const again = await waitForLogLine(second, 'fork handler called')
    expect(again.eventId).toBe(called.eventId)
    expect((await signalAndClose(second, 'SIGTERM')).code).toBe(0)
    expect(await jobsOf(open)).toMatchObject([{ eventId: called.eventId, state: 'done', attempts: 1 }])
  })
})
