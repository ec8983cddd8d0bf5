// The storages that hold a console page's deadline, its proxy's prefix and a second terminal's command
// (scoped-store.ts) are turned off once no work runs under them. On Node 20 and 22 a storage that is on makes every
// promise of the process run a hook, which leaves its marks on the promise (its async ids and the store it
// carries): a promise made once the work is over must carry none, or every later webhook delivery pays for the
// hook (5-7 µs each). Node 24 carries stores without a hook: there a promise never carries them, and only the
// storages' own behaviour is checked.
import { AsyncLocalStorage } from 'node:async_hooks'
import { performance } from 'node:perf_hooks'
import request from 'supertest'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { runCapturedCommandLine } from '../src/cli/run-cli.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { ScopedStore } from '../src/scoped-store.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

/** The marks the promise hook left on a promise made now: none while no storage is on. */
const hookMarks = () => Object.getOwnPropertySymbols(Promise.resolve()).length
/** Marks are left a tick after the hook goes off, for promises made in the tick that turned it off. */
const marksNextTick = () => new Promise<number>((resolve) => setImmediate(() => resolve(hookMarks())))

// whether this Node's AsyncLocalStorage works by the promise hook (20, 22) or not (24)
const probe = new AsyncLocalStorage<number>()
const HOOKED = probe.run(1, hookMarks) > 0
probe.disable()

describe('a scoped store', () => {
  it('gives its store to the work and to what the work starts, and counts the work until its promise settles', async () => {
    const store = new ScopedStore<string>()
    let release!: () => void
    const held = new Promise<void>((resolve) => (release = resolve))
    const seen: (string | undefined)[] = []
    const work = store.run('page-1', async () => {
      seen.push(store.getStore())
      await held
      seen.push(store.getStore())
    })
    expect(store.running).toBe(1)
    if (HOOKED) expect(hookMarks()).toBeGreaterThan(0)
    release()
    await work
    expect(seen).toEqual(['page-1', 'page-1'])
    expect(store.running).toBe(0)
    expect(await marksNextTick()).toBe(0)
    // outside any run there is no store
    expect(store.getStore()).toBeUndefined()
  })

  it('counts work that returns no promise until the `done` it was given settles', async () => {
    const store = new ScopedStore<string>()
    let answer!: () => void
    const answered = new Promise<void>((resolve) => (answer = resolve))
    const seen: (string | undefined)[] = []
    store.run('request', () => void setImmediate(() => seen.push(store.getStore())), { done: answered })
    await new Promise((resolve) => setImmediate(resolve))
    expect(seen).toEqual(['request'])
    expect(store.running).toBe(1)
    if (HOOKED) expect(hookMarks()).toBeGreaterThan(0)
    answer()
    await answered
    expect(store.running).toBe(0)
    expect(await marksNextTick()).toBe(0)
  })

  it('stays on until the time asked for has passed, then goes off by itself', async () => {
    const store = new ScopedStore<string>()
    await store.run('page', async () => {}, { notBefore: performance.now() + 200 })
    expect(store.running).toBe(0)
    // still on: what the work left running until then still sees its store
    if (HOOKED) expect(hookMarks()).toBeGreaterThan(0)
    await vi.waitFor(async () => expect(await marksNextTick()).toBe(0), { timeout: 5_000, interval: 50 })
  })

  it('stays on while another run is not over, and a run after it has gone off gets its store again', async () => {
    const store = new ScopedStore<string>()
    let release!: () => void
    const held = store.run('long', () => new Promise<void>((resolve) => (release = resolve)))
    await store.run('short', async () => {})
    if (HOOKED) expect(await marksNextTick()).toBeGreaterThan(0)
    release()
    await held
    expect(await marksNextTick()).toBe(0)
    expect(await store.run('again', async () => store.getStore())).toBe('again')
  })

  it('counts a run whose work throws as over', async () => {
    const store = new ScopedStore<string>()
    expect(() =>
      store.run('throws', () => {
        throw new Error('boom')
      }),
    ).toThrow('boom')
    expect(store.running).toBe(0)
    await expect(store.run('rejects', async () => Promise.reject(new Error('no')))).rejects.toThrow('no')
    expect(store.running).toBe(0)
    expect(await marksNextTick()).toBe(0)
  })
})

describe('the console and a second terminal leave no hook on once they are done', () => {
  const TOKEN = 'scoped-store-token-0123456789abcdef'
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database.close()
  })

  it('after a console page and a proxied one, once the page’s deadline is a second past', async () => {
    // a page of another file this worker ran may still be within its own second
    await vi.waitFor(async () => expect(await marksNextTick()).toBe(0), { timeout: 10_000, interval: 100 })
    const pageAnswerMs = 300
    const admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: database.db, logger: testLogger([TOKEN]), consolePageAnswerMs: pageAnswerMs })
    const started = performance.now()
    const page = await request(admin).get('/console/').set('Authorization', `Bearer ${TOKEN}`)
    expect(page.status).toBe(200)
    const proxied = await request(admin).get('/console/orders').set('Authorization', `Bearer ${TOKEN}`).set('X-Forwarded-Prefix', '/ops')
    expect(proxied.status).toBe(200)
    expect(proxied.text).toContain('href="/ops/console/')
    // a request with no prefix, after one with it, gets none
    expect((await request(admin).get('/console/orders').set('Authorization', `Bearer ${TOKEN}`)).text).not.toContain('/ops/')
    await vi.waitFor(async () => expect(await marksNextTick()).toBe(0), { timeout: 10_000, interval: 100 })
    // not before the deadline of the last page and the second after it: a statement still running then keeps its deadline
    if (HOOKED) expect(performance.now() - started).toBeGreaterThanOrEqual(pageAnswerMs + 1000)
  })

  it('after a command line run with its output captured, as a second terminal’s is', async () => {
    const output = await runCapturedCommandLine(['--help'])
    expect(output.code).toBe(0)
    expect(output.stdout).toContain('Usage')
    expect(await marksNextTick()).toBe(0)
  })
})
