// Postgres over TLS, as hosted databases require: a certificate the driver cannot verify ends `migrate` (and a
// start) in words that say what to give DATABASE_URL, where it used to end in the TLS layer's own ("unable to
// verify the first certificate"). The database here is a stand-in that speaks only the start of Postgres's
// protocol: it accepts the SSLRequest and makes the TLS handshake with a certificate of the test CA in
// test/fixtures/tls (made for these tests only, valid until 2126).
import { once } from 'node:events'
import { readFileSync } from 'node:fs'
import { type AddressInfo, createServer, type Server, type Socket } from 'node:net'
import path from 'node:path'
import { TLSSocket } from 'node:tls'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { runCli } from './helpers/cli-process.js'

const fixtures = path.join(import.meta.dirname, 'fixtures', 'tls')
const key = readFileSync(path.join(fixtures, 'server.key'))
const cert = readFileSync(path.join(fixtures, 'server.crt'))

/**
 * A stand-in for Postgres on a free port of 127.0.0.1, for the describe block it is called in: `answer` is given each
 * connection once its SSLRequest (8 bytes) has arrived.
 */
function standIn(answer: (socket: Socket) => void): { readonly url: (query: string) => string } {
  let server: Server
  let port = 0
  beforeAll(async () => {
    server = createServer((socket) => {
      socket.on('error', () => {})
      socket.once('data', () => answer(socket))
    })
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    port = (server.address() as AddressInfo).port
  })
  afterAll(async () => {
    await new Promise((resolve) => server.close(resolve))
  })
  return { url: (query) => `postgres://partner@127.0.0.1:${port}/escrow?${query}` }
}

describe('Postgres over TLS with a certificate the driver cannot verify', () => {
  // startup messages that arrived over an established TLS session (the client accepted the certificate)
  let startedOverTls = 0
  // the SSLRequest: yes, then the handshake
  const database = standIn((socket) => {
    socket.write('S')
    const secure = new TLSSocket(socket, { isServer: true, key, cert })
    secure.on('error', () => {})
    secure.once('data', () => {
      startedOverTls++
      // the startup message: a stand-in has nothing more to say
      secure.destroy()
    })
  })

  it('ends migrate with exit 1, naming the setting that gives the driver its CA', async () => {
    const result = await runCli(['migrate'], { DATABASE_URL: database.url('sslmode=verify-full'), LOG_LEVEL: 'warn' })
    expect(result.code).toBe(1)
    expect(result.stderr).toContain("the database's TLS certificate was not accepted")
    expect(result.stderr).toContain('(UNABLE_TO_VERIFY_LEAF_SIGNATURE)')
    expect(result.stderr).toContain('sslrootcert=')
    // its line ends in a code, as every failed command's does
    expect(result.stderr).toMatch(/ \[database_refused\]\n$/)
    expect(startedOverTls).toBe(0)
  })

  it('gets past the handshake once DATABASE_URL names the CA', async () => {
    const ca = path.join(fixtures, 'ca.crt')
    const result = await runCli(['migrate'], {
      DATABASE_URL: database.url(`sslmode=verify-full&sslrootcert=${encodeURIComponent(ca)}`),
      LOG_LEVEL: 'warn',
    })
    expect(startedOverTls).toBeGreaterThan(0)
    expect(result.stderr).not.toContain('TLS certificate')
  })

  // node-postgres warns through process.emitWarning that these modes verify like verify-full; Node printed it as
  // plain text among the JSON lines ("(node:…) Warning: SECURITY WARNING: …")
  it("logs the driver's warning about sslmode=require as one JSON line, not as plain text on stderr", async () => {
    const result = await runCli(['migrate'], { DATABASE_URL: database.url('sslmode=require'), LOG_LEVEL: 'warn' })
    expect(result.code).toBe(1)
    const lines = result.stderr.split('\n').filter((line) => line.length > 0)
    const warnings = lines.filter((line) => line.startsWith('{')).map((line) => JSON.parse(line) as Record<string, unknown>)
    expect(warnings).toEqual([
      expect.objectContaining({ level: 40, warning: { name: 'Warning' }, msg: expect.stringMatching(/^SECURITY WARNING: The SSL modes/) }),
    ])
    expect(result.stderr).not.toContain('(node:')
    // the rest is the command's own words
    expect(lines.filter((line) => !line.startsWith('{'))).toEqual([expect.stringContaining("the database's TLS certificate was not accepted")])
  })
})

describe('Postgres without TLS, asked for it by DATABASE_URL', () => {
  // the SSLRequest answered no, as a server with ssl off does
  const database = standIn((socket) => socket.write('N'))

  it('ends a command with exit 1 and [database_refused], saying the server does not take TLS (it printed the driver\'s words alone)', async () => {
    const result = await runCli(['reactions', 'list'], { DATABASE_URL: database.url('sslmode=require'), LOG_LEVEL: 'warn' })
    expect(result.code).toBe(1)
    expect(result.stderr).toContain('the database server does not take TLS, which DATABASE_URL asks for (sslmode)')
    expect(result.stderr).toMatch(/\(tls_not_offered\) \[database_refused\]\n$/)
  })
})
