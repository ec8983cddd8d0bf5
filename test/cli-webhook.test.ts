import { createHmac } from 'node:crypto'
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { runCli } from './helpers/cli-process.js'
import { answerEndlessly, MiB } from './helpers/endless-answer.js'
import { rememberSecret } from './helpers/log-sink.js'

const secret = 'cli-webhook-secret-0123456789abcdef'
rememberSecret(secret)
const dir = mkdtempSync(path.join(tmpdir(), 'cli-webhook-'))
const bodyFile = path.join(dir, 'trade-funded.json')
// non-ASCII on purpose: the signature covers the bytes of the file, not a re-serialization
const body = '{"trade_id":"trd_1","reference":"R-1","status":"funded","external_reference":"order-é"}\n'
writeFileSync(bodyFile, body)
const expectedSignature = `sha256=${createHmac('sha256', secret).update(Buffer.from(body)).digest('hex')}`
const env = { DATA_DIR: dir, LOG_LEVEL: 'warn' }

describe('webhook sign', () => {
  it('prints the headers the platform would send, signed over the file bytes', async () => {
    const result = await runCli(['webhook', 'sign', '--file', bodyFile, '--secret', secret, '--delivery-id', 'dlv_1', '--json'], env)
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toEqual({
      'Content-Type': 'application/json',
      'X-Partner-Signature': expectedSignature,
      'X-Partner-Delivery-Id': 'dlv_1',
    })
  })

  // it created them without a word, and a receiver with other secrets refused every delivery signed so (401)
  it('says so on stderr when it creates the local secrets it signs with, naming the file; once, and never with --secret', async () => {
    const dataDir = path.join(mkdtempSync(path.join(tmpdir(), 'cli-webhook-new-')), 'data')
    const secretsFile = path.join(dataDir, 'local-secrets.json')
    const first = await runCli(['webhook', 'sign', '--file', bodyFile, '--json'], { DATA_DIR: dataDir })
    expect([first.code, first.stderr]).toEqual([
      0,
      `Note: no local secrets in DATA_DIR ${dataDir}: created ${secretsFile} with a new webhook secret, and signing with it. ` +
        'A service started from this DATA_DIR (`npm start`) verifies it; a receiver with other secrets (another DATA_DIR, remote mode) ' +
        'refuses it: give its secret with --secret, or the DATA_DIR of its service.\n',
    ])
    const { webhookSecret } = JSON.parse(readFileSync(secretsFile, 'utf8')) as { webhookSecret: string }
    rememberSecret(webhookSecret)
    const signature = `sha256=${createHmac('sha256', webhookSecret).update(Buffer.from(body)).digest('hex')}`
    expect(JSON.parse(first.stdout)['X-Partner-Signature']).toBe(signature)
    // the file is there now: the secret is the one a service started from this DATA_DIR verifies, nothing to say
    const again = await runCli(['webhook', 'sign', '--file', bodyFile, '--json'], { DATA_DIR: dataDir })
    expect([again.code, again.stderr, JSON.parse(again.stdout)['X-Partner-Signature']]).toEqual([0, '', signature])
    const otherDir = path.join(path.dirname(dataDir), 'other')
    const given = await runCli(['webhook', 'sign', '--file', bodyFile, '--secret', secret], { DATA_DIR: otherDir })
    expect([given.code, given.stderr]).toEqual([0, ''])
  })

  it('exits 2 with a clear message when --file is missing or unreadable', async () => {
    const missing = await runCli(['webhook', 'sign', '--secret', secret], env)
    expect(missing.code).toBe(2)
    expect(missing.stderr).toContain("error: required option '--file <path>' not specified [invalid_arguments]\n")
    const unreadable = await runCli(['webhook', 'sign', '--file', path.join(dir, 'nope.json')], env)
    expect(unreadable.code).toBe(2)
    expect(unreadable.stderr).toMatch(/^Cannot read --file [^\n]*nope\.json: ENOENT[^\n]* \[file_unreadable\]\n$/)
  })

  // accepted, such an id was one the receiver refuses (400), and one with a line feed printed a forged header line
  it.each([['a b'], ['x\r\nX-Evil: 1'], ['d'.repeat(201)], ['é']])('exits 2 for a --delivery-id the receiver would refuse (%j), printing no header', async (id) => {
    const signed = ['--file', bodyFile, '--secret', secret, '--delivery-id', id]
    for (const args of [['webhook', 'sign', ...signed], ['webhook', 'send', '--url', 'http://127.0.0.1:9/x', ...signed]]) {
      const result = await runCli(args, env)
      expect(result.code).toBe(2)
      expect(result.stdout).toBe('')
      expect(result.stderr).toContain('must be 1 to 200 characters from ! to ~ (printable ASCII, no space), as the receiver takes it')
    }
  })

  it('exits 2 for an empty --secret, which would sign with no key at all', async () => {
    for (const command of ['sign', 'send']) {
      const result = await runCli(['webhook', command, '--file', bodyFile, '--secret', ''], env)
      expect([result.code, result.stdout], command).toEqual([2, ''])
      expect(result.stderr, command).toContain("option '--secret <secret>' argument '' is invalid. must not be empty")
    }
  })
})

describe('webhook send', () => {
  const received: { headers: http.IncomingHttpHeaders; body: string }[] = []
  let server: http.Server
  let url: string

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      let data = ''
      req.on('data', (chunk) => {
        data += chunk
      })
      req.on('end', () => {
        received.push({ headers: req.headers, body: data })
        if (req.url === '/endless') {
          return answerEndlessly(res, (written) => {
            endless.written = written
            endless.closed++
          })
        }
        if (req.url === '/long') {
          // a proxy's error page, say: shown shortened on a terminal, whole in --json
          return res.writeHead(502, { 'content-type': 'text/html' }).end(`<html>${'x'.repeat(99_987)}</html>`)
        }
        if (req.url === '/forged') return res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\nFAKE  [forged line]\tTAB\u001b[31mRED')
        const redirect = /^\/moved-(\d{3})$/.exec(req.url ?? '')
        if (redirect) return res.writeHead(Number(redirect[1]), { location: `${url}/elsewhere` }).end('moved')
        const status = req.url === '/refuse' ? 401 : 200
        res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ received: status === 200 }))
      })
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  })
  afterAll(() => {
    server.closeAllConnections()
    server.close()
  })

  const endless = { written: 0, closed: 0 }
  it('delivers the exact bytes with a valid signature and prints the answer', async () => {
    const result = await runCli(['webhook', 'send', '--url', `${url}/hook`, '--file', bodyFile, '--secret', secret, '--json'], env)
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toMatchObject({ status: 200, body: { received: true } })
    const delivery = received.at(-1)!
    expect(delivery.body).toBe(body)
    expect(delivery.headers['x-partner-signature']).toBe(expectedSignature)
    expect(delivery.headers['x-partner-delivery-id']).toMatch(/^dlv_cli_/)
  })

  it('exits 1 when the receiver refuses the delivery', async () => {
    const result = await runCli(['webhook', 'send', '--url', `${url}/refuse`, '--file', bodyFile, '--secret', secret], env)
    expect(result.code).toBe(1)
    expect(result.stdout).toMatch(/^401 dlv_cli_/)
  })

  // followed, a 301-303 sent the signature and delivery id on to the other URL as a GET and printed its 200, exit 0;
  // a 307/308 failed with "Cannot perform ArrayBuffer.prototype.slice on a detached ArrayBuffer"
  it.each([[301], [302], [303], [307], [308]])('does not follow a %i: exit 1 [redirected], naming where it pointed, nothing sent there', async (status) => {
    const before = received.length
    const result = await runCli(['webhook', 'send', '--url', `${url}/moved-${status}`, '--file', bodyFile, '--secret', secret], env)
    expect(result).toEqual({
      code: 1,
      stdout: '',
      stderr:
        `${url}/moved-${status} answered ${status}, a redirect to ${url}/elsewhere: not followed (the delivery is signed for the ` +
        'receiver at --url, as the platform sends it); give the URL the receiver takes deliveries at [redirected]\n',
    })
    expect(received.slice(before).map((request) => request.headers['x-partner-signature'] !== undefined)).toEqual([true])
    expect(received.length).toBe(before + 1)
  })

  // the answer is the receiver's text: its line feed printed a second line after the status (an outside attack)
  it('shows the answer on one line, its line feeds and tabs escaped', async () => {
    const shown = await runCli(['webhook', 'send', '--url', `${url}/forged`, '--file', bodyFile, '--secret', secret], env)
    expect(shown.code).toBe(0)
    expect(shown.stdout).toMatch(/^200 dlv_cli_\S+ ok\\u000aFAKE {2}\[forged line\]\\u0009TAB\\u001b\[31mRED\n$/)
  })

  it('shows a long answer shortened, with its length, and whole with --json', async () => {
    const shown = await runCli(['webhook', 'send', '--url', `${url}/long`, '--file', bodyFile, '--secret', secret], env)
    expect(shown.code).toBe(1)
    expect(shown.stdout).toMatch(new RegExp(`^502 dlv_cli_\\S+ <html>x{1994}… \\(100,000 characters\\)\n$`))
    const json = await runCli(['webhook', 'send', '--url', `${url}/long`, '--file', bodyFile, '--secret', secret, '--json'], env)
    expect(json.code).toBe(1)
    expect(JSON.parse(json.stdout)).toMatchObject({ status: 502, body: `<html>${'x'.repeat(99_987)}</html>` })
  })

  it('reads at most 1 MiB of an answer and exits 1 naming that, instead of holding a body without end', async () => {
    const result = await runCli(['webhook', 'send', '--url', `${url}/endless`, '--file', bodyFile, '--secret', secret], env)
    expect(result.code).toBe(1)
    expect(result.stderr).toContain(
      `${url}/endless answered 200 with a body larger than 1,048,576 bytes, the most this command reads; the rest was not read [answer_too_large]\n`,
    )
    // the connection was closed with most of the answer unsent: the limit plus what the kernel's buffers hold
    await expect.poll(() => endless.closed).toBe(1)
    expect(endless.written).toBeLessThan(32 * MiB)
  })

  it('exits 1 with a message and its code when nothing listens at the URL, and 2 for a URL that is not http', async () => {
    // a port that was free a moment ago (port 9 is one fetch refuses to call: `bad port`)
    const closed = http.createServer()
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve))
    const { port } = closed.address() as AddressInfo
    await new Promise((resolve) => closed.close(resolve))
    for (const json of [[], ['--json']]) {
      const unreachable = await runCli(['webhook', 'send', '--url', `http://127.0.0.1:${port}/x`, '--file', bodyFile, '--secret', secret, ...json], env)
      // the reason alone, not its class name (`Error: connect …`), and neither the secret nor the signature
      expect(unreachable).toEqual({
        code: 1,
        stdout: '',
        stderr: `Could not deliver to http://127.0.0.1:${port}/x: connect ECONNREFUSED 127.0.0.1:${port} [not_delivered]\n`,
      })
    }
    // fetch refuses a URL holding a password, and quotes the URL: the password is not shown
    const withPassword = await runCli(['webhook', 'send', '--url', 'http://user:hunter2@127.0.0.1:9/x', '--file', bodyFile, '--secret', secret], env)
    expect(withPassword.code).toBe(1)
    expect(withPassword.stderr).toMatch(/^Could not deliver to http:\/\/user:\*\*\*@127\.0\.0\.1:9\/x: .* \[not_delivered\]\n$/)
    expect(withPassword.stderr).not.toContain('hunter2')
    const bad = await runCli(['webhook', 'send', '--url', 'ftp://x', '--file', bodyFile, '--secret', secret], env)
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('--url must be an http(s) URL')
  })

  // an http URL with a line feed in it was quoted raw in the refusal, which split into two lines: one forged
  it('shows the controls of a URL it could not deliver to escaped, on one line, through the compiled CLI', async () => {
    const forged = await runCli(['webhook', 'send', '--url', 'http://127.0.0.1:1/\u001b[2J\r\nFORGED', '--file', bodyFile, '--secret', secret], env)
    expect(forged.code).toBe(1)
    expect(forged.stderr).toMatch(/^Could not deliver to http:\/\/127\.0\.0\.1:1\/\\u001b\[2J\\u000d\\u000aFORGED: .* \[not_delivered\]\n$/)
    expect(forged.stderr.split('\n')).toHaveLength(2)
    expect(forged.stderr).not.toContain('\u001b')
  })
})
