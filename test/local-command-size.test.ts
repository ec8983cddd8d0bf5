// How large a command line the local command endpoint takes. A second terminal's command is its arguments alone,
// and the service refused any past 64 KiB (413), where the same command run with no service running was answered by
// the command itself: one argument may be 128 KiB, and all of them 6 MiB, on Linux. Now the largest a process can be
// given is taken, and a request larger than any command line is refused 413 `payload_too_large`, in words that say
// so. Through the real server (http/server.ts), as the CLI reaches it.
import { describe, expect, it } from 'vitest'
import { LOCAL_CLI_PATH, MAX_COMMAND_REQUEST_BYTES } from '../src/local/running-service.js'
import { useLocalCommandServer } from './helpers/local-command-server.js'
import { connect, exchange, finalAnswer } from './helpers/raw-http-client.js'
import { useTestDatabase } from './helpers/test-database.js'

const TOKEN = 'c'.repeat(64)
// Linux's most for a new process's arguments and environment together (3/4 of _STK_LIM), and for one argument
// (MAX_ARG_STRLEN, its NUL included); each argument also takes its NUL and an 8-byte pointer of the total
const ARGUMENTS_BYTES = 6 * 1024 * 1024
const ARGUMENT_BYTES = 128 * 1024
const footprint = (argument: string) => Buffer.byteLength(argument) + 1 + 8

/**
 * The command line that makes the largest request: as many bytes as Linux passes a process, every one a control
 * character, which JSON writes as six (\u0001).
 */
function largestCommandLine(): string[] {
  const args = ['orders', 'show']
  let left = ARGUMENTS_BYTES - args.reduce((sum, arg) => sum + footprint(arg), 0)
  while (left > 9) {
    const argument = '\u0001'.repeat(Math.min(ARGUMENT_BYTES - 1, left - 9))
    args.push(argument)
    left -= footprint(argument)
  }
  return args
}

const TOO_LARGE = {
  error: {
    code: 'payload_too_large',
    message: `A command line is at most ${MAX_COMMAND_REQUEST_BYTES.toLocaleString('en-US')} bytes as JSON, more than the arguments of any process can hold: this request is larger`,
  },
}

describe('the size of a command line the local command endpoint takes', () => {
  const database = useTestDatabase()
  const endpoint = useLocalCommandServer(database, { token: TOKEN })

  const head = (headers: Record<string, string | number>) =>
    `POST ${LOCAL_CLI_PATH} HTTP/1.1\r\nHost: 127.0.0.1:${endpoint.port}\r\nContent-Type: application/json\r\nAuthorization: Bearer ${TOKEN}\r\n` +
    `Connection: close\r\n${Object.entries(headers)
      .map(([name, value]) => `${name}: ${value}\r\n`)
      .join('')}\r\n`

  it('runs a command line with one argument past 64 KiB, as the CLI sends it', async () => {
    endpoint.commands.length = 0
    const args = ['orders', 'show', 'r'.repeat(ARGUMENT_BYTES - 1)]
    const response = await fetch(`${endpoint.url}${LOCAL_CLI_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify({ args }),
    })
    expect(response.status).toBe(200)
    expect(await response.json()).toEqual({ code: 0, stdout: 'ran\n', stderr: '' })
    expect(endpoint.commands).toEqual([args])
  })

  it('runs the largest command line a process can be given, all of it control characters', async () => {
    endpoint.commands.length = 0
    const args = largestCommandLine()
    const body = JSON.stringify({ args })
    expect(body.length).toBeGreaterThan(37_000_000)
    const response = await fetch(`${endpoint.url}${LOCAL_CLI_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
      body,
    })
    expect(response.status).toBe(200)
    expect(await response.json()).toEqual({ code: 0, stdout: 'ran\n', stderr: '' })
    expect(endpoint.commands).toHaveLength(1)
    // compared whole, not through toEqual: a difference would be printed as 36 MB of text
    expect(JSON.stringify(endpoint.commands[0]) === JSON.stringify(args)).toBe(true)
  })

  it('refuses a request announced one byte past the bound 413, from its headers, running nothing', async () => {
    endpoint.commands.length = 0
    const answer = finalAnswer(await exchange(endpoint.port, head({ 'Content-Length': MAX_COMMAND_REQUEST_BYTES + 1 })))
    expect(answer.status).toBe(413)
    expect(JSON.parse(answer.body)).toEqual(TOO_LARGE)
    expect(endpoint.commands).toEqual([])
  })

  it('refuses a chunked request once it passes the bound, in the same words, running nothing', async () => {
    endpoint.commands.length = 0
    const client = await connect(endpoint.port)
    client.write(head({ 'Transfer-Encoding': 'chunked' }))
    const chunk = Buffer.alloc(1024 * 1024, 'x')
    for (let sent = 0; sent <= MAX_COMMAND_REQUEST_BYTES; sent += chunk.length) client.write(`${chunk.length.toString(16)}\r\n${chunk}\r\n`)
    client.write('0\r\n\r\n')
    const answer = finalAnswer(await client.closed)
    expect(answer.status).toBe(413)
    expect(JSON.parse(answer.body)).toEqual(TOO_LARGE)
    expect(endpoint.commands).toEqual([])
  })

  // eight of the largest at once took the service from 430 MB to 2.9 GB (an outside attack): two are read at once
  it('reads two of the largest command lines at once, refuses a third 503 from its headers, and takes it once one ended', async () => {
    endpoint.commands.length = 0
    const largest = head({ 'Content-Length': MAX_COMMAND_REQUEST_BYTES, Expect: '100-continue' })
    // told to continue: admitted, its body awaited
    const admitted = async () => {
      const client = await connect(endpoint.port)
      client.write(largest)
      await client.until((received) => received.startsWith('HTTP/1.1 100 Continue\r\n'))
      return client
    }
    const first = await admitted()
    const second = await admitted()
    const refused = finalAnswer(await exchange(endpoint.port, largest))
    expect(refused.status).toBe(503)
    expect(refused.headers['retry-after']).toBe('1')
    expect(JSON.parse(refused.body)).toEqual({
      error: { code: 'overloaded', message: 'The service is reading or running other large commands; try again in a moment' },
    })
    // a command of a real size still fits beside them
    const small = await fetch(`${endpoint.url}${LOCAL_CLI_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify({ args: ['orders', 'list'] }),
    })
    expect(small.status).toBe(200)
    first.destroy()
    await first.closed
    const third = await admitted()
    second.destroy()
    third.destroy()
    await Promise.all([second.closed, third.closed])
    expect(endpoint.commands).toEqual([['orders', 'list']])
  })
})
