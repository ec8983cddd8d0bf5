// The storages that hold a console page's deadline, its proxy's prefix and a second terminal's command
// (scoped-store.ts) are turned off once no work runs under them. On Node 20 and 22 a storage that is on makes every
// promise of the process run a hook, which marks each promise with the storage's store: a promise made once the work
// is over must carry no mark of that storage, or every later webhook delivery pays for the hook (5-7 µs each). Each
// storage's mark is told by its store (the files of a worker share its process, and other storages there, a
// library's, may stay on). Node 24 carries stores without a hook: there no promise is marked, and only the storages'
// own behaviour is checked.
import { AsyncLocalStorage } from 'node:async_hooks'
import { performance } from 'node:perf_hooks'
import request from 'supertest'
import type { Kysely } from 'kysely'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { runCapturedCommandLine } from '../src/cli/run-cli.js'
import type { Database } from '../src/db/database.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { ScopedStore } from '../src/scoped-store.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

// The mark a storage that is on leaves on a promise made in its run: a property keyed by a symbol of the storage's
// own, whose value is the store. Other storages of the process (a library's, a test's) have marks of their own.
const markNow = (isStore: (value: unknown) => boolean): symbol | undefined => {
  const promise = Promise.resolve() as unknown as Record<symbol, unknown>
  return Object.getOwnPropertySymbols(promise).find((key) => isStore(promise[key]))
}
/** Whether a promise made a tick from now (the hook is turned off by then) carries that mark. */
const markedNextTick = (mark: symbol) => new Promise<boolean>((resolve) => setImmediate(() => resolve(Object.getOwnPropertySymbols(Promise.resolve()).includes(mark))))

// whether this Node's AsyncLocalStorage works by the promise hook (20, 22) or not (24)
const probe = new AsyncLocalStorage<string>()
const HOOKED = probe.run('probe', () => markNow((value) => value === 'probe')) !== undefined
probe.disable()

/** The storage's mark, made in its run: there is one where the hook carries stores, and none elsewhere. */
function markIn(isStore: (value: unknown) => boolean): symbol | undefined {
  const mark = markNow(isStore)
  expect(mark !== undefined).toBe(HOOKED)
  return mark
}

/** Waits until a new promise no longer carries the mark (none to wait for where the hook carries nothing). */
async function markGone(mark: symbol | undefined, timeout = 10_000): Promise<void> {
  if (mark !== undefined) await vi.waitFor(async () => expect(await markedNextTick(mark)).toBe(false), { timeout, interval: 50 })
}

describe('a scoped store', () => {
  it('gives its store to the work and to what the work starts, and counts the work until its promise settles', async () => {
    const store = new ScopedStore<string>()
    let release!: () => void
    const held = new Promise<void>((resolve) => (release = resolve))
    const seen: (string | undefined)[] = []
    let mark: symbol | undefined
    const work = store.run('page-1', async () => {
      seen.push(store.getStore())
      mark = markIn((value) => value === 'page-1')
      await held
      seen.push(store.getStore())
    })
    expect(store.running).toBe(1)
    if (mark) expect(await markedNextTick(mark)).toBe(true)
    release()
    await work
    expect(seen).toEqual(['page-1', 'page-1'])
    expect(store.running).toBe(0)
    if (mark) expect(await markedNextTick(mark)).toBe(false)
    // outside any run there is no store
    expect(store.getStore()).toBeUndefined()
  })

  it('counts work that returns no promise until the `done` it was given settles', async () => {
    const store = new ScopedStore<string>()
    let answer!: () => void
    const answered = new Promise<void>((resolve) => (answer = resolve))
    const seen: (string | undefined)[] = []
    let mark: symbol | undefined
    store.run('request', () => void setImmediate(() => seen.push(store.getStore())), { done: answered })
    store.run('request', () => (mark = markIn((value) => value === 'request')), { done: answered })
    await new Promise((resolve) => setImmediate(resolve))
    expect(seen).toEqual(['request'])
    expect(store.running).toBe(2)
    if (mark) expect(await markedNextTick(mark)).toBe(true)
    answer()
    await answered
    expect(store.running).toBe(0)
    if (mark) expect(await markedNextTick(mark)).toBe(false)
  })

  it('stays on until the time asked for has passed, then goes off by itself', async () => {
    const store = new ScopedStore<string>()
    let mark: symbol | undefined
    await store.run('page', async () => void (mark = markIn((value) => value === 'page')), { notBefore: performance.now() + 200 })
    expect(store.running).toBe(0)
    // still on: what the work left running until then still sees its store
    if (mark) expect(await markedNextTick(mark)).toBe(true)
    await markGone(mark, 5_000)
  })

  it('stays on while another run is not over, and a run after it has gone off gets its store again', async () => {
    const store = new ScopedStore<string>()
    let release!: () => void
    let mark: symbol | undefined
    const held = store.run('long', () => {
      mark = markIn((value) => value === 'long')
      return new Promise<void>((resolve) => (release = resolve))
    })
    await store.run('short', async () => {})
    if (mark) expect(await markedNextTick(mark)).toBe(true)
    release()
    await held
    if (mark) expect(await markedNextTick(mark)).toBe(false)
    expect(await store.run('again', async () => store.getStore())).toBe('again')
  })

  it('counts a run whose work throws as over', async () => {
    const store = new ScopedStore<string>()
    let mark: symbol | undefined
    expect(() =>
      store.run('throws', () => {
        mark = markIn((value) => value === 'throws')
        throw new Error('boom')
      }),
    ).toThrow('boom')
    expect(store.running).toBe(0)
    await expect(store.run('rejects', async () => Promise.reject(new Error('no')))).rejects.toThrow('no')
    expect(store.running).toBe(0)
    if (mark) expect(await markedNextTick(mark)).toBe(false)
  })
})

describe('the console and a second terminal leave no hook on once they are done', () => {
  const TOKEN = 'scoped-store-token-0123456789abcdef'
  let database: TestDatabase
  // a promise made as each statement is compiled, in the context of the page or command that sends it
  let madeInStatements: Record<symbol, unknown>[] = []
  let observed: Kysely<Database>
  beforeAll(async () => {
    database = await createTestDatabase()
    observed = database.db.withPlugin({
      transformQuery: (args) => {
        madeInStatements.push(Promise.resolve() as unknown as Record<symbol, unknown>)
        return args.node
      },
      transformResult: async (args) => args.result,
    })
  })
  afterAll(async () => {
    await database.close()
  })
  /** The mark of the storage whose store `isStore` recognises, as a statement carried it; none where the hook carries nothing. */
  const markInStatements = (isStore: (value: unknown) => boolean): symbol | undefined => {
    const marks = madeInStatements.flatMap((promise) => Object.getOwnPropertySymbols(promise).filter((key) => isStore(promise[key])))
    expect(marks.length > 0).toBe(HOOKED)
    return marks[0]
  }

  it('after a console page and a proxied one, once the page’s deadline is a second past', async () => {
    madeInStatements = []
    const pageAnswerMs = 300
    const admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: observed, logger: testLogger([TOKEN]), consolePageAnswerMs: pageAnswerMs })
    const page = await request(admin).get('/console/').set('Authorization', `Bearer ${TOKEN}`)
    expect(page.status).toBe(200)
    const proxied = await request(admin).get('/console/orders').set('Authorization', `Bearer ${TOKEN}`).set('X-Forwarded-Prefix', '/ops')
    const lastPage = performance.now()
    expect(proxied.status).toBe(200)
    expect(proxied.text).toContain('href="/ops/console/')
    // a request with no prefix, after one with it, gets none
    expect((await request(admin).get('/console/orders').set('Authorization', `Bearer ${TOKEN}`)).text).not.toContain('/ops/')
    const deadline = markInStatements((value) => (value as { boundMs?: unknown } | undefined)?.boundMs === pageAnswerMs)
    const prefix = markInStatements((value) => value === '/ops')
    // the prefix's storage goes off once its request is answered; the deadline's not before the last page's deadline
    // and the second after it, as a statement still running by then keeps its deadline
    await markGone(prefix)
    if (deadline) expect(await markedNextTick(deadline)).toBe(true)
    await markGone(deadline)
    if (deadline) expect(performance.now() - lastPage).toBeGreaterThanOrEqual(pageAnswerMs + 1000)
  })

  it('after a command run inside the service, as a second terminal’s is', async () => {
    madeInStatements = []
    const output = await runCapturedCommandLine(['orders', 'list'], { config: testConfig(), logger: testLogger(), db: observed })
    expect(output).toMatchObject({ code: 0, stderr: '' })
    const command = markInStatements((value) => typeof (value as { exitCode?: unknown } | undefined)?.exitCode === 'number')
    if (command) expect(await markedNextTick(command)).toBe(false)
  })
})
