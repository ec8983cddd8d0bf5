// The operator listener authenticates from the headers before it reads a body: a request without the
// console's token (or the local command token) is refused without `100 Continue` and without its body being
// read, and only an authenticated one is told to continue, its form then read and its CSRF token checked.
// Through the real server (http/server.ts), whose 'checkContinue' hands such requests to the application.
import { describe, expect, it } from 'vitest'
import { LOCAL_CLI_PATH } from '../src/local/running-service.js'
import { useLocalCommandServer } from './helpers/local-command-server.js'
import { connect, exchange, finalAnswer } from './helpers/raw-http-client.js'
import { useTestDatabase } from './helpers/test-database.js'

const TOKEN = 'console-token-0123456789abcdef0123'
const COMMAND_TOKEN = 'c'.repeat(64)
const CONTINUE = 'HTTP/1.1 100 Continue\r\n\r\n'

describe('the operator listener reads a body only once the headers authenticate it', () => {
  const database = useTestDatabase()
  const endpoint = useLocalCommandServer(database, { token: COMMAND_TOKEN, config: { ADMIN_TOKEN: TOKEN } })

  /** A POST's head, sent alone: the body follows only when a test writes it. */
  const postHead = (path: string, headers: Record<string, string | number>, type = 'application/x-www-form-urlencoded') =>
    `POST ${path} HTTP/1.1\r\nHost: 127.0.0.1:${endpoint.port}\r\nContent-Type: ${type}\r\n` +
    `${Object.entries(headers)
      .map(([name, value]) => `${name}: ${value}\r\n`)
      .join('')}\r\n`

  /** The CSRF token and a fresh action id from an action's confirm page, as a bearer caller sees it. */
  async function confirmFields(path: string): Promise<string> {
    const page = await fetch(`${endpoint.url}${path}`, { headers: { authorization: `Bearer ${TOKEN}` } })
    expect(page.status).toBe(200)
    const text = await page.text()
    const csrf = /name="csrf" value="([0-9a-f]+)"/.exec(text)?.[1]
    const actionId = /name="action_id" value="([0-9a-f]{32})"/.exec(text)?.[1]
    expect(csrf).toBeDefined()
    expect(actionId).toBeDefined()
    return new URLSearchParams({ csrf: csrf!, action_id: actionId! }).toString()
  }

  describe('the console', () => {
    it.each([
      ['no credentials', {}],
      ['a wrong bearer token', { Authorization: `Bearer ${TOKEN}x` }],
      ['a forged session cookie', { Cookie: `console_session=${'a'.repeat(64)}` }],
    ])('answers a form that waits for 100 Continue with %s 401 first, never asking for the form', async (_case, credentials) => {
      for (const path of ['/console/reactions/retry-failed', '/console/logout', '/console/no-such-page']) {
        // the server closes the connection after the answer: it never waits for the form
        const received = await exchange(endpoint.port, postHead(path, { ...credentials, 'Content-Length': 60, Expect: '100-continue' }))
        expect(received, path).toMatch(/^HTTP\/1\.1 401 Unauthorized\r\n/)
        expect(received, path).not.toContain('100 Continue')
        const answer = finalAnswer(received)
        expect(answer.headers['www-authenticate'], path).toContain('Bearer')
        expect(answer.body, path).toContain('name="token"')
      }
    })

    it('answers 401 to a POST without credentials that announced a form and never sent it, and closes the connection', async () => {
      // before its form was parsed first, this request waited for a body that never came
      const client = await connect(endpoint.port)
      client.write(postHead('/console/reactions/retry-failed', { 'Content-Length': 60 }))
      const answer = finalAnswer(await client.closed)
      expect(answer.status).toBe(401)
      expect(answer.headers.connection).toBe('close')
    })

    // an authenticated POST that waits for `100 Continue`, checks it came first, then sends the form: all received
    const postAfterContinue = async (path: string, form: string) => {
      const client = await connect(endpoint.port)
      client.write(postHead(path, { Authorization: `Bearer ${TOKEN}`, 'Content-Length': form.length, Expect: '100-continue', Connection: 'close' }))
      expect(await client.until((received) => received.length > 0)).toBe(CONTINUE)
      client.write(form)
      return client.closed
    }

    it('tells an authenticated form to continue, then answers its action once the form is sent', async () => {
      const form = await confirmFields('/console/reactions/retry-failed')
      const received = await postAfterContinue('/console/reactions/retry-failed', form)
      expect(received.startsWith(`${CONTINUE}HTTP/1.1 200 OK\r\n`)).toBe(true)
      expect(finalAnswer(received).body).toContain('no failed reaction jobs')
    })

    it('tells an authenticated form to continue, then refuses it 403 when its CSRF token is wrong', async () => {
      const form = (await confirmFields('/console/reactions/retry-failed')).replace(/csrf=[0-9a-f]+/, `csrf=${'0'.repeat(64)}`)
      const answer = finalAnswer(await postAfterContinue('/console/reactions/retry-failed', form))
      expect(answer.status).toBe(403)
      expect(answer.body).toContain('CSRF')
    })

    it.each([
      ['an authenticated action', '/console/reactions/retry-failed', { Authorization: `Bearer ${TOKEN}` }],
      ['the login page', '/console/login', {}],
    ])('refuses a form past 16 KB to %s 413, without 100 Continue', async (_case, path, credentials) => {
      // the head alone: the refusal comes from the announced length, while the client still waits to be told to send
      const received = await exchange(endpoint.port, postHead(path, { ...credentials, 'Content-Length': 16 * 1024 + 5, Expect: '100-continue' }))
      expect(received).not.toContain('100 Continue')
      const answer = finalAnswer(received)
      expect(answer.status).toBe(413)
      expect(JSON.parse(answer.body)).toEqual({ error: { code: 'payload_too_large', message: expect.any(String) } })
    })

    it('answers HEAD with the status alone: 401 without credentials, 200 with them', async () => {
      const refused = await fetch(`${endpoint.url}/console/`, { method: 'HEAD' })
      expect(refused.status).toBe(401)
      expect(await refused.text()).toBe('')
      const page = await fetch(`${endpoint.url}/console/`, { method: 'HEAD', headers: { authorization: `Bearer ${TOKEN}` } })
      expect(page.status).toBe(200)
      expect(page.headers.get('content-type')).toMatch(/^text\/html/)
      expect(await page.text()).toBe('')
    })
  })

  describe('the local command endpoint', () => {
    const body = JSON.stringify({ args: ['orders', 'list'] })

    it('answers a command that waits for 100 Continue without its token 401 first, running nothing', async () => {
      for (const credentials of [{}, { Authorization: 'Bearer not-the-token' }] as Record<string, string>[]) {
        const received = await exchange(
          endpoint.port,
          postHead(LOCAL_CLI_PATH, { ...credentials, 'Content-Length': Buffer.byteLength(body), Expect: '100-continue' }, 'application/json'),
        )
        expect(received).toMatch(/^HTTP\/1\.1 401 Unauthorized\r\n/)
        expect(received).not.toContain('100 Continue')
        expect(JSON.parse(finalAnswer(received).body)).toEqual({ error: { code: 'invalid_command_token', message: expect.any(String) } })
      }
      expect(endpoint.commands).toEqual([])
    })

    it('tells a command with its token to continue, then runs it once the body is sent', async () => {
      const client = await connect(endpoint.port)
      client.write(
        postHead(
          LOCAL_CLI_PATH,
          { Authorization: `Bearer ${COMMAND_TOKEN}`, 'Content-Length': Buffer.byteLength(body), Expect: '100-continue', Connection: 'close' },
          'application/json',
        ),
      )
      expect(await client.until((received) => received.length > 0)).toBe(CONTINUE)
      client.write(body)
      const answer = finalAnswer(await client.closed)
      expect(answer.status).toBe(200)
      expect(JSON.parse(answer.body)).toMatchObject({ code: 0, stdout: 'ran\n' })
      expect(endpoint.commands).toEqual([['orders', 'list']])
    })
  })
})
