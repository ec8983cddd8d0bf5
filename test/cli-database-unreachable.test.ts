// The compiled CLI while its database cannot be reached: one line that says so, with the driver's reason, ends
// in [database_unavailable] and exits 1, and no password of DATABASE_URL in it. Before, the line was the
// driver's bare words ("Connection terminated unexpectedly", "read ECONNRESET", "timeout exceeded when trying to
// connect"), which named neither the database nor what to do.
import net from 'node:net'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { freePort, runCli, signalAndClose, spawnCli } from './helpers/cli-process.js'
import { createTestDatabase, describePostgres, postgresUrl, type TestDatabase } from './helpers/test-database.js'

const PASSWORD = 'not-for-the-terminal'

const withPassword = (url: string) => {
  const parsed = new URL(url)
  parsed.password = PASSWORD
  return parsed.toString()
}

const unavailableLine = (reason: RegExp) =>
  new RegExp(`^The database cannot be reached \\(${reason.source}\\); try again once it is up \\[database_unavailable\\]\\n$`)

describe('the CLI with nothing listening at DATABASE_URL', () => {
  it('says the database cannot be reached, with the driver reason, [database_unavailable], exit 1', async () => {
    const port = await freePort()
    for (const command of [['orders', 'list'], ['migrate']]) {
      const result = await runCli(command, { DATABASE_URL: `postgres://root:${PASSWORD}@127.0.0.1:${port}/test` })
      expect(result.stderr).toMatch(unavailableLine(new RegExp(`connect ECONNREFUSED 127\\.0\\.0\\.1:${port}`)))
      expect(result.code).toBe(1)
      expect(result.stdout).toBe('')
      expect(result.stderr).not.toContain(PASSWORD)
    }
  })
})

const noAnswerLine = (port: number) =>
  new RegExp(
    `^The database did not answer within 5 s at 127\\.0\\.0\\.1:${port}: something there took the connection and sent nothing back ` +
      '\\(a Postgres server stopped or overloaded, or another program on that port\\); try again once it answers \\[database_unavailable\\]\\n$',
  )

// A gate in front of Postgres that passes the first connection, the migration's (it runs on a connection of its own,
// open-database.ts), and treats every later one, the command's, as a database gone away would: closed, reset, or
// taken and never answered. There the driver's words were printed bare; a failed migration put "Migration …
// failed:" before them.
type Gone = 'close' | 'reset' | 'silent'

async function startGate(target: { host: string; port: number }, gone: Gone, passing = 1) {
  const sockets = new Set<net.Socket>()
  let connections = 0
  const server = net.createServer((client) => {
    sockets.add(client)
    client.on('error', () => {}).on('close', () => sockets.delete(client))
    if (connections++ >= passing) {
      // once the driver has sent its first bytes, so the connection was up: the words are those of one lost
      if (gone === 'close') client.once('data', () => client.end())
      else if (gone === 'reset') client.once('data', () => client.resetAndDestroy())
      return
    }
    const upstream = net.connect(target.port, target.host)
    sockets.add(upstream)
    upstream.on('error', () => client.destroy()).on('close', () => client.destroy())
    client.on('close', () => upstream.destroy())
    client.pipe(upstream)
    upstream.pipe(client)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as net.AddressInfo).port,
    connections: () => connections,
    close: async () => {
      for (const socket of sockets) socket.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}

// It was reported "The database cannot be reached (Connection terminated unexpectedly)", the words of a connection cut,
// after a 5 s wait the line did not mention, nor where
describe('the CLI with a listener at DATABASE_URL that takes the connection and never answers', () => {
  it('says the database did not answer within 5 s at its host:port, [database_unavailable], exit 1', async () => {
    const gate = await startGate({ host: '127.0.0.1', port: 1 }, 'silent', 0)
    try {
      for (const command of [['orders', 'list'], ['migrate']]) {
        const result = await runCli(command, { DATABASE_URL: `postgres://root:${PASSWORD}@127.0.0.1:${gate.port}/test` })
        expect(result.stderr, command.join(' ')).toMatch(noAnswerLine(gate.port))
        expect([result.code, result.stdout]).toEqual([1, ''])
        expect(result.stderr).not.toContain(PASSWORD)
      }
    } finally {
      await gate.close()
    }
  })
})

// Opening waits up to the 5 s connect timeout on a database that takes the connection and never answers: a Ctrl-C
// there ended the command by Node's default, exit 130 without a word of what it had done
describe('a stop signal while the database does not answer', () => {
  for (const command of [['orders', 'create', '--external-reference', 'sig-1'], ['prune'], ['migrate']]) {
    it(`${command.join(' ')}: says it stopped before doing anything, [stopped], exit 130`, async () => {
      const gate = await startGate({ host: '127.0.0.1', port: 1 }, 'silent', 0)
      try {
        const child = spawnCli(command, { DATABASE_URL: `postgres://root:${PASSWORD}@127.0.0.1:${gate.port}/test` })
        let stderr = ''
        child.stderr!.on('data', (chunk) => (stderr += chunk))
        // the driver's connection is at the gate: the command is opening its database
        await expect.poll(() => gate.connections(), { timeout: 20_000 }).toBeGreaterThan(0)
        const { code } = await signalAndClose(child, 'SIGINT')
        expect(stderr).toBe('Stopped by a signal while opening the database: the command did nothing [stopped]\n')
        expect(code).toBe(130)
      } finally {
        await gate.close()
      }
    })
  }
})

describePostgres('the CLI when its database goes away after the look at its migrations, or takes no writes (Postgres)', () => {
  let database: TestDatabase

  beforeAll(async () => {
    database = await createTestDatabase()
  })
  afterAll(async () => {
    await database?.close()
  })

  const cases: { gone: Gone; line: (port: number) => RegExp }[] = [
    { gone: 'close', line: () => unavailableLine(/Connection terminated unexpectedly/) },
    { gone: 'reset', line: () => unavailableLine(/read ECONNRESET/) },
    // pg's pool waits 5 s for a connection (connectionTimeoutMillis), then ends it: said as a wait, not a cut connection
    { gone: 'silent', line: noAnswerLine },
  ]
  for (const { gone, line } of cases) {
    const what = { close: 'closed', reset: 'reset', silent: 'never answered' }[gone]
    it(`a connection ${what}: named as the database's, [database_unavailable], exit 1`, async () => {
      const target = new URL(postgresUrl!)
      const gate = await startGate({ host: target.hostname, port: Number(target.port || 5432) }, gone)
      try {
        const url = new URL(withPassword(database.url!))
        url.hostname = '127.0.0.1'
        url.port = String(gate.port)
        const result = await runCli(['orders', 'list'], { DATABASE_URL: url.toString() })
        expect(gate.connections(), 'the look at the migrations passed and the command connected again').toBeGreaterThan(1)
        expect(result.stderr).toMatch(line(gate.port))
        expect(result.code).toBe(1)
        expect(result.stdout).toBe('')
        expect(result.stderr).not.toContain(PASSWORD)
      } finally {
        await gate.close()
      }
    })
  }

  // `prune` holds its lock on a connection of its own (a pg client outside the pool, open-database.ts holdLock), opened
  // after the look at the migrations and the pool's first: taken and never answered, it ended the command with the
  // driver's bare `timeout expired`, no code, where every other connection's wait is said as such
  it('prune, its lock connection taken and never answered: named as the wait it is, [database_unavailable], exit 1', async () => {
    const target = new URL(postgresUrl!)
    const gate = await startGate({ host: target.hostname, port: Number(target.port || 5432) }, 'silent', 2)
    try {
      const url = new URL(withPassword(database.url!))
      url.hostname = '127.0.0.1'
      url.port = String(gate.port)
      const result = await runCli(['prune'], { DATABASE_URL: url.toString() })
      expect(gate.connections(), 'the look at the migrations and the pool passed, and the lock connected').toBe(3)
      expect(result.stderr).toMatch(noAnswerLine(gate.port))
      expect([result.code, result.stdout]).toEqual([1, ''])
      expect(result.stderr).not.toContain(PASSWORD)
    } finally {
      await gate.close()
    }
  })

  it('a connection closed at the first statement (`migrate`, or a command\'s look at the migrations): the driver\'s reason, not a wrapping of it', async () => {
    const target = new URL(postgresUrl!)
    const gate = await startGate({ host: target.hostname, port: Number(target.port || 5432) }, 'close', 0)
    try {
      const url = new URL(withPassword(database.url!))
      url.hostname = '127.0.0.1'
      url.port = String(gate.port)
      for (const command of [['orders', 'list'], ['migrate']]) {
        const result = await runCli(command, { DATABASE_URL: url.toString() })
        // it read "(Migration (before any migration ran) failed: Connection terminated unexpectedly)"
        expect(result.stderr).toMatch(unavailableLine(/Connection terminated unexpectedly/))
        expect(result.code).toBe(1)
      }
    } finally {
      await gate.close()
    }
  })

  it("a database that takes no writes: its state in the service's fixed words and code, [database_unavailable], exit 1", async () => {
    // every session of this URL begins read-only, as on a standby after a failover
    const url = new URL(withPassword(database.url!))
    url.searchParams.set('options', `${url.searchParams.get('options')} -c default_transaction_read_only=on`)
    const result = await runCli(['orders', 'create', '--external-reference', 'read-only-1'], { DATABASE_URL: url.toString() })
    expect(result.stderr).toMatch(/^The database could not run the command now: the database is read-only \(.*\) \(25006\); try again later \[database_unavailable\]\n$/)
    expect(result.code).toBe(1)
    expect(result.stderr).not.toContain(PASSWORD)
  })
})
