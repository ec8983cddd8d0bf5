// The connections a database handle keeps outside its pool, over a path that goes silent (no byte either way, no
// FIN, no RST): the one that holds a lock (a prune pass's, DatabaseHandle.holdLock) must give it back without
// waiting on a server that no longer answers, or a service's stop waits for it until its bound and exits 1; the
// LISTEN connection must notice that it hears nothing and connect again. And the LISTEN connection stopped while
// it connects to a server that does not answer yet must stop.
import net from 'node:net'
import pg from 'pg'
import pino from 'pino'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { openDatabase } from '../src/db/open-database.js'
import { startTcpProxy } from './helpers/tcp-proxy.js'
import { createTestDatabase, describePostgres, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const KEY = 0x5eed_10c4

describe('the LISTEN connection to a server that does not answer', () => {
  it('stops while it connects', async () => {
    // takes the connection and never says a word: the listener's connect waits (5 s, then it tries again)
    const held = new Set<net.Socket>()
    const server = net.createServer((socket) => void held.add(socket.on('error', () => {})))
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    const { port } = server.address() as net.AddressInfo
    const handle = openDatabase({ databaseUrl: `postgres://nobody@127.0.0.1:${port}/nothing`, poolSize: 1 })
    try {
      const unlisten = await handle.listen('silent_server', () => {})
      const deadline = Date.now() + 30_000
      while (held.size === 0 && Date.now() < deadline) await new Promise((resolve) => setTimeout(resolve, 20))
      expect(held.size, 'the listener is connecting').toBe(1)
      const outcome = await Promise.race([
        unlisten().then(() => 'stopped'),
        new Promise((resolve) => setTimeout(() => resolve('still waiting'), 30_000).unref()),
      ])
      // before, pg never settled the connect of a client ended meanwhile, and the stop waited for it for good
      expect(outcome).toBe('stopped')
    } finally {
      await handle.close()
      for (const socket of held) socket.destroy()
      await new Promise((resolve) => server.close(resolve))
    }
  })
})

describePostgres('connections of their own over a silent path (Postgres)', () => {
  let database: TestDatabase
  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database?.close()
  })

  const heldElsewhere = async () => {
    // a session of the same schema: holdLock's lock is (key, the schema's hash)
    const other = new pg.Client({ connectionString: database.url })
    await other.connect()
    try {
      const { rows } = await other.query<{ locked: boolean }>('select pg_try_advisory_lock($1::int, hashtext(current_schema())) as locked', [KEY])
      if (rows[0]?.locked) await other.query('select pg_advisory_unlock($1::int, hashtext(current_schema()))', [KEY])
      return rows[0]?.locked !== true
    } finally {
      await other.end()
    }
  }

  it('a listener on DATABASE_LISTEN_URL whose login is refused names DATABASE_LISTEN_URL, not DATABASE_URL', async () => {
    const lines: { msg?: string; err?: { message?: string } }[] = []
    const logger = pino({ level: 'warn' }, { write: (line: string) => void lines.push(JSON.parse(line) as (typeof lines)[number]) })
    const refused = new URL(database.url!)
    refused.username = 'no_such_role_here'
    const handle = openDatabase({ databaseUrl: database.url!, listenUrl: refused.toString(), poolSize: 1, logger })
    const unlisten = await handle.listen('refused_listener', () => {})
    try {
      const deadline = Date.now() + 30_000
      while (!lines.some((line) => line.msg === 'notification listener cannot connect') && Date.now() < deadline) {
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
      const warning = lines.find((line) => line.msg === 'notification listener cannot connect')
      // it said "check the user and password of DATABASE_URL", a setting that was right
      expect(warning?.err?.message).toBe('the database refused the login: check the user and password of DATABASE_LISTEN_URL')
    } finally {
      await unlisten()
      await handle.close()
    }
  })

  it('a lock is given back within seconds when its connection went silent', async () => {
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const handle = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 1, statementTimeoutMs: 1_000 })
    try {
      const release = await handle.holdLock(KEY)
      expect(release).toBeTypeOf('function')
      expect(await heldElsewhere()).toBe(true)
      // no byte passes either way any more, and no FIN or RST either
      proxy.stall()
      const outcome = await Promise.race([
        release!().then(() => 'given back'),
        new Promise((resolve) => setTimeout(() => resolve('still waiting'), 30_000).unref()),
      ])
      // the commit's answer is waited for 2 s (timeout and grace), the end 1 s; before, this waited for good.
      // The server keeps the session, and the lock, until its own TCP keepalive finds the path dead (the socket
      // closed here never reaches it): other replicas' passes skip meanwhile, which PruningStalled reports
      expect(outcome).toBe('given back')
    } finally {
      await handle.close()
      await proxy.close()
    }
  })

  it('a listener whose connection went silent connects again and hears the notifications sent after', async () => {
    const target = new URL(database.url!)
    const proxy = await startTcpProxy({ host: target.hostname, port: Number(target.port || 5432) })
    const lines: { msg?: string }[] = []
    const logger = pino({ level: 'warn' }, { write: (line: string) => void lines.push(JSON.parse(line) as { msg?: string }) })
    const handle = openDatabase({ databaseUrl: proxy.rewrite(database.url!), poolSize: 2, statementTimeoutMs: 1_000, listenerCheckMs: 200, logger })
    const channel = `silent_listener_${process.pid}`
    const heard: (string | undefined)[] = []
    const unlisten = await handle.listen(channel, (payload) => heard.push(payload))
    const notify = async (payload: string) => {
      const sender = new pg.Client({ connectionString: postgresUrl })
      await sender.connect()
      await sender.query('select pg_notify($1, $2)', [channel, payload])
      await sender.end()
    }
    const eventually = async (what: string, check: () => boolean, ms = 30_000) => {
      const deadline = Date.now() + ms
      while (!check()) {
        if (Date.now() > deadline) throw new Error(`${what}: not within ${ms} ms; log: ${JSON.stringify(lines)}`)
        await new Promise((resolve) => setTimeout(resolve, 50))
      }
    }
    try {
      await eventually('the first probe heard', () => handle.notificationsHeard?.() === true)
      await notify('before')
      await eventually('"before" heard', () => heard.includes('before'))
      proxy.stall()
      // a probe (sent through the pool: its silent connections time out, then new ones pass) is not heard in 10 s
      await eventually('the listener says its connection went silent', () => lines.some((line) => /did not hear its own probe/.test(line.msg ?? '')), 40_000)
      // connected again: it looks once (a wake without payload), and hears what is sent from now on
      await eventually('a new connection', () => heard.filter((payload) => payload === undefined).length >= 2)
      await notify('after')
      await eventually('"after" heard', () => heard.includes('after'))
    } finally {
      await unlisten()
      await handle.close()
      await proxy.close()
    }
  })
})
