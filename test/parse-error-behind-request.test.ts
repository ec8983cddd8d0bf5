// Bytes the HTTP parser refuses behind a request still being answered on the same connection: that request's answer
// goes out first, then the connection closes. The refusal used to be written onto the connection ahead of it, so a
// delivery stored (its statement still running when the bytes came) was never answered 200; and a well-formed request
// sent after a `Connection: close` one was answered 400 "not valid HTTP" (an outside attack).
import { connect } from 'node:net'
import type http from 'node:http'
import { afterEach, describe, expect, it } from 'vitest'
import { listen, type RunningServer } from '../src/http/server.js'

describe('a parse error behind a request still being answered', () => {
  let running: RunningServer | undefined
  afterEach(async () => {
    await running?.stop(0)
    running = undefined
  })

  // answered 50 ms later, as a delivery is once its statement committed
  const slowApp: http.RequestListener = (_req, res) => {
    setTimeout(() => res.end('stored'), 50)
  }

  const exchange = async (bytes: string) => {
    running = await listen(slowApp, { port: 0, host: '127.0.0.1' })
    const socket = connect(Number(new URL(running.url).port), '127.0.0.1')
    socket.write(bytes)
    let answer = ''
    for await (const chunk of socket) answer += String(chunk)
    return answer
  }

  it.each([
    ['garbage', 'POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}GARBAGE\r\n\r\n'],
    ['headers over 16 KB', `POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}GET / HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(17_000)}\r\n\r\n`],
    ['a request after Connection: close', 'POST /d HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n'],
  ])('%s: the request is answered, alone, and the connection closed', async (_kind, bytes) => {
    const answer = await exchange(bytes)
    expect(answer.startsWith('HTTP/1.1 200 OK\r\n'), answer.slice(0, 200)).toBe(true)
    expect(answer.endsWith('stored')).toBe(true)
    expect(answer.match(/HTTP\/1\.1 /g)).toHaveLength(1)
    expect(answer).toContain('Connection: close')
  })
})
