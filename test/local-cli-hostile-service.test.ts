// The compiled CLI beside a "service" it must not trust: a DATA_DIR/serve.json that is not a service's, and an
// operator listener that answers with something else than a command's result, redirects, writes controls to the
// terminal, or never answers. Each ends in one line with our code, no stack trace, nothing on stdout but what a
// real command printed; a file that is not a service's is ignored, and the command runs in its own process.
// The fakes are this test process (a live pid, so the file stands) and servers it owns; one block checks the same
// paths against a real `serve`.
import { constants } from 'node:buffer'
import { once } from 'node:events'
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import http from 'node:http'
import https from 'node:https'
import net, { type AddressInfo } from 'node:net'
import { networkInterfaces, tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { ServiceFile } from '../src/local/running-service.js'
import { type CliResult, freePort, receiverEnv, runCli, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { answerEndlessly, MiB } from './helpers/endless-answer.js'
import { useUnansweredListener } from './helpers/unanswered-connect.js'

const TOKEN = 'hostile-test-token'

interface FakeService {
  url: string
  /** The bodies of the requests it received. */
  requests: string[]
  close: () => Promise<void>
}

/** A server on `host` that reads each request's body and then lets `answer` answer (or not); https with `tls`. */
async function fakeService(
  answer: (response: http.ServerResponse, request: http.IncomingMessage) => void,
  host = '127.0.0.1',
  tls?: https.ServerOptions,
): Promise<FakeService> {
  const requests: string[] = []
  const serve = (request: http.IncomingMessage, response: http.ServerResponse) => {
    let body = ''
    request.on('data', (chunk) => (body += chunk))
    request.on('end', () => {
      requests.push(body)
      answer(response, request)
    })
  }
  const server = tls ? https.createServer(tls, serve) : http.createServer(serve)
  server.listen(0, host)
  await once(server, 'listening')
  const { port } = server.address() as AddressInfo
  return {
    url: `${tls ? 'https' : 'http'}://${host.includes(':') ? `[${host}]` : host}:${port}`,
    requests,
    close: () => {
      server.closeAllConnections()
      return new Promise((resolve) => server.close(() => resolve()))
    },
  }
}

const answering = (status: number, body: string, headers: http.OutgoingHttpHeaders = { 'content-type': 'application/json' }) =>
  (response: http.ServerResponse) => {
    response.writeHead(status, headers)
    response.end(body)
  }

function serviceFile(dataDir: string, adminUrl: string): ServiceFile {
  return {
    pid: process.pid,
    url: adminUrl,
    adminUrl,
    token: TOKEN,
    webhookUrl: `${adminUrl}/webhooks/partner`,
    mode: 'remote',
    database: { kind: 'pglite', location: dataDir },
  }
}

function advertise(dataDir: string, contents: unknown): void {
  const text = typeof contents === 'string' ? contents : `${JSON.stringify(contents)}\n`
  writeFileSync(path.join(dataDir, 'serve.json'), text, { mode: 0o600 })
}

function newDataDir(): string {
  return mkdtempSync(path.join(tmpdir(), 'cli-hostile-'))
}

/** `orders list` run by the compiled CLI beside a service advertised at `service` from a new DATA_DIR. */
async function ordersListBeside(service: FakeService): Promise<CliResult & { dataDir: string }> {
  const dataDir = newDataDir()
  advertise(dataDir, serviceFile(dataDir, service.url))
  return { ...(await runCli(['orders', 'list'], { DATA_DIR: dataDir })), dataDir }
}

function expectNoStackTrace(result: CliResult): void {
  expect(result.stderr).not.toMatch(/^\s+at /m)
  expect(result.stderr).not.toMatch(/Error:|node:internal/)
}

describe('the CLI when the service answers 200 with something that is not a command’s result', () => {
  const answers: [string, string][] = [
    ['<html><body>It works!</body></html>', 'not JSON'],
    ['', 'not JSON'],
    ['null', 'not a JSON object'],
    ['[0, "out", ""]', 'not a JSON object'],
    ['{"stdout":42}', 'no exit code from 0 to 255'],
    ['{"code":999}', 'no exit code from 0 to 255'],
    ['{"code":999,"stdout":"","stderr":""}', 'no exit code from 0 to 255'],
    ['{"code":-1,"stdout":"","stderr":""}', 'no exit code from 0 to 255'],
    ['{"code":1.5,"stdout":"","stderr":""}', 'no exit code from 0 to 255'],
    ['{"code":"0","stdout":"","stderr":""}', 'no exit code from 0 to 255'],
    ['{"code":0,"stdout":42,"stderr":""}', 'no stdout and stderr as text'],
    ['{"code":0,"stdout":"printed\\n"}', 'no stdout and stderr as text'],
    ['{"code":0,"stdout":"","stderr":null}', 'no stdout and stderr as text'],
  ]

  for (const [body, problem] of answers) {
    it(`says so in one line ending in [service_bad_answer], exit 1, nothing on stdout: ${body || '(empty)'}`, async () => {
      const service = await fakeService(answering(200, body))
      try {
        const result = await ordersListBeside(service)
        expectNoStackTrace(result)
        expect(result.stderr).toBe(
          `The service running from ${result.dataDir} (pid ${process.pid}) answered the command with something that is not its result (${problem}) [service_bad_answer]\n`,
        )
        expect(result.code).toBe(1)
        expect(result.stdout).toBe('')
        expect(service.requests).toHaveLength(1)
      } finally {
        await service.close()
      }
    })
  }

  it('says the answer was cut short, and that the command may have run, when the connection closes mid-answer', async () => {
    const service = await fakeService((response) => {
      response.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' })
      response.write('{"code":0,"stdout":"')
      setTimeout(() => response.destroy(), 50)
    })
    try {
      const result = await ordersListBeside(service)
      expectNoStackTrace(result)
      expect(result.stderr).toMatch(
        new RegExp(`^The service running from ${result.dataDir} \\(pid ${process.pid}\\) cut its answer to the command short \\([^\\n]+\\); the command may have run there \\[service_bad_answer\\]\\n$`),
      )
      expect(result.code).toBe(1)
      expect(result.stdout).toBe('')
    } finally {
      await service.close()
    }
  })

  it('prints a result as it came and exits with its code, a field a newer service may add ignored', async () => {
    const service = await fakeService(answering(200, JSON.stringify({ code: 3, stdout: 'row\tone\nrow\ttwo\n', stderr: 'a warning\n', durationMs: 12 })))
    try {
      const result = await ordersListBeside(service)
      expect(result.stdout).toBe('row\tone\nrow\ttwo\n')
      expect(result.stderr).toBe('a warning\n')
      expect(result.code).toBe(3)
    } finally {
      await service.close()
    }
  })
})

/** Answers `status` with `size` bytes of spaces, chunked, as fast as the reader takes them (endless-answer.ts). */
const streamedAnswer = (status: number, size: number, onClose: (written: number) => void) => (response: http.ServerResponse) =>
  answerEndlessly(response, onClose, { size, status, announced: false })

describe('the CLI when the service answers with more than it reads', () => {
  // the bound running-service.ts reads a result up to: the longest string Node holds, about 512 MiB
  const resultBound = constants.MAX_STRING_LENGTH

  it('stops at its bound, says so in one line ending in [service_bad_answer], exit 1, the rest never sent', async () => {
    let written: number | undefined
    const size = resultBound + 64 * MiB
    const service = await fakeService(streamedAnswer(200, size, (bytes) => (written = bytes)))
    try {
      const result = await ordersListBeside(service)
      expectNoStackTrace(result)
      expect(result.stderr).toBe(
        `The service running from ${result.dataDir} (pid ${process.pid}) answered the command with more than ` +
          `${resultBound.toLocaleString('en-US')} bytes, the most this CLI reads; the rest was not read, and the command may have run there [service_bad_answer]\n`,
      )
      expect(result.code).toBe(1)
      expect(result.stdout).toBe('')
      // the CLI closed the connection at its bound: what the server could write past it is what the two sockets'
      // kernel buffers hold, a few MiB, not the 64 MiB more it had to send
      await expect.poll(() => written, { timeout: 30_000 }).toBeDefined()
      expect(written).toBeLessThan(resultBound + 32 * MiB)
    } finally {
      await service.close()
    }
  })

  it('prints a long result whole: a listing of tens of MiB is far within the bound (the control)', async () => {
    // ASCII: runCli decodes the child's stdout chunk by chunk, and a character cut between two would not compare
    const stdout = `${JSON.stringify(Array.from({ length: 250_000 }, (_, index) => ({ externalReference: `order-${index}`, title: 'Lamp with a shade, brass, 40 cm' })))}\n`
    expect(Buffer.byteLength(stdout)).toBeGreaterThan(16 * MiB)
    const service = await fakeService(answering(200, JSON.stringify({ code: 0, stdout, stderr: '' })))
    try {
      const result = await ordersListBeside(service)
      expect(result.stderr).toBe('')
      expect(result.code).toBe(0)
      expect(result.stdout.length).toBe(stdout.length)
      // (compared whole without a diff of megabytes on failure)
      expect(result.stdout === stdout).toBe(true)
    } finally {
      await service.close()
    }
  })

  it('reads no more of a refusal than 64 KiB: says the refusal was too large to read, [service_refused], exit 1', async () => {
    let written: number | undefined
    const size = 256 * MiB
    const service = await fakeService(streamedAnswer(500, size, (bytes) => (written = bytes)))
    try {
      const result = await ordersListBeside(service)
      expectNoStackTrace(result)
      expect(result.stderr).toBe('The running service refused the command (500): (an answer larger than 65,536 bytes, not read) [service_refused]\n')
      expect(result.code).toBe(1)
      expect(result.stdout).toBe('')
      await expect.poll(() => written, { timeout: 30_000 }).toBeDefined()
      expect(written).toBeLessThan(32 * MiB)
    } finally {
      await service.close()
    }
  })
})

describe('the CLI’s own settings beside a running service', () => {
  // an outside attack ran `RETENTION_DAYS=-1 prune --dry-run` beside a service: the service's 30 and 90 days were
  // used, exit 0, and nothing said that the values given were not
  it('says which of prune’s settings set here the service does not use, naming no value', async () => {
    const service = await fakeService(answering(200, JSON.stringify({ code: 0, stdout: 'pruned\n', stderr: '' })))
    try {
      const dataDir = newDataDir()
      advertise(dataDir, serviceFile(dataDir, service.url))
      const env = { DATA_DIR: dataDir, RETENTION_DAYS: '-1', PRUNE_BATCH_SIZE: '5000' }
      const result = await runCli(['prune', '--dry-run'], env)
      expect(result.stderr).toBe(
        `The service running from ${dataDir} (pid ${process.pid}) runs the command with its own settings: ` +
          'RETENTION_DAYS, PRUNE_BATCH_SIZE are set here and not used [settings_ignored]\n',
      )
      expect([result.code, result.stdout]).toEqual([0, 'pruned\n'])
      // the command went to the service as typed
      expect(service.requests.map((body) => JSON.parse(body) as unknown)).toEqual([{ args: ['prune', '--dry-run'] }])
      // another command is not told about prune's settings
      const list = await runCli(['orders', 'list'], env)
      expect(list.stderr).toBe('')
    } finally {
      await service.close()
    }
  })

  // an outside attack funded with the service's platform and key from a terminal set for another (PARTNER_ENV=live
  // and the live keys beside a service on the sandbox), with not a word about them
  it('says which platform settings set here name another platform or key than the service’s, naming no value', async () => {
    const service = await fakeService(answering(200, JSON.stringify({ code: 0, stdout: 'funded\n', stderr: '' })))
    try {
      const dataDir = newDataDir()
      const platform = { env: 'sandbox', baseUrl: 'https://sandbox.platform.example', keyId: 'pk_service' }
      advertise(dataDir, { ...serviceFile(dataDir, service.url), platform })
      const live = { DATA_DIR: dataDir, PARTNER_ENV: 'live', PARTNER_LIVE_API_KEY_ID: 'pk_live_1', PARTNER_LIVE_API_SECRET: 'live-secret-0123456789abcdef0123' }
      for (const command of [['trades', 'fund', 'order-1'], ['disputes', 'open', 'order-1'], ['reconcile', '--once']]) {
        const result = await runCli(command, live)
        expect(result.stderr, command.join(' ')).toBe(
          `The service running from ${dataDir} (pid ${process.pid}) runs the command with its own settings: ` +
            'PARTNER_ENV, PARTNER_LIVE_API_KEY_ID are set here and not used [settings_ignored]\n',
        )
        expect([result.code, result.stdout]).toEqual([0, 'funded\n'])
      }
      const otherUrl = await runCli(['trades', 'fund', 'order-1'], { DATA_DIR: dataDir, PARTNER_API_BASE_URL: 'https://live.platform.example' })
      expect(otherUrl.stderr).toContain(': PARTNER_API_BASE_URL is set here and not used [settings_ignored]\n')
      // the service's own settings (its .env in this shell too): nothing to say
      const same = { DATA_DIR: dataDir, PARTNER_ENV: 'sandbox', PARTNER_API_BASE_URL: 'https://sandbox.platform.example/', PARTNER_API_KEY_ID: 'pk_service', PARTNER_API_SECRET: 'any' }
      expect((await runCli(['trades', 'fund', 'order-1'], same)).stderr).toBe('')
      expect((await runCli(['orders', 'list'], live)).stderr).toBe('')
    } finally {
      await service.close()
    }
  })
})

describe('a forwarded command the service had begun when it answered something else', () => {
  it('says its outcome is unknown, not that the service refused it', async () => {
    const stopping = JSON.stringify({ error: { code: 'not_ready', message: 'Shutting down: this request could not be answered in time; retry' } })
    const service = await fakeService(answering(503, stopping, { 'content-type': 'application/json', 'x-command-started': 'true' }))
    try {
      const dataDir = newDataDir()
      advertise(dataDir, serviceFile(dataDir, service.url))
      const result = await runCli(['trades', 'release', 'order-1'], { DATA_DIR: dataDir })
      expect([result.code, result.stdout]).toEqual([1, ''])
      expect(result.stderr).toBe(
        `The service running from ${dataDir} (pid ${process.pid}) had begun to run \`trades release\` and answered 503, not its result: ` +
          `it may or may not have taken effect (${stopping}). Check what it would have changed (\`orders show\`, \`trades get\`) ` +
          'before running it again [outcome_unknown]\n',
      )
      // the same answer without the mark (a refusal before the command began) is a refusal, as before
      const refused = await fakeService(answering(503, stopping))
      try {
        advertise(dataDir, serviceFile(dataDir, refused.url))
        const before = await runCli(['trades', 'release', 'order-1'], { DATA_DIR: dataDir })
        expect([before.code, before.stderr]).toEqual([1, expect.stringContaining('[service_refused]')])
      } finally {
        await refused.close()
      }
    } finally {
      await service.close()
    }
  })
})

describe('the CLI and the controls in a forwarded command’s output', () => {
  it('shows them as \\uXXXX on stdout and stderr, keeping line feeds and tabs: the terminal is neither cleared nor retitled', async () => {
    const service = await fakeService(
      answering(200, JSON.stringify({ code: 0, stdout: '\u001b[2J\u001b[31mFAKE\u001b]0;owned\u0007\nrow\tcell\n', stderr: 'careful\u202efdp.exe\r\n' })),
    )
    try {
      const result = await ordersListBeside(service)
      expect(result.stdout).toBe('\\u001b[2J\\u001b[31mFAKE\\u001b]0;owned\\u0007\nrow\tcell\n')
      expect(result.stderr).toBe('careful\\u202efdp.exe\\u000d\n')
      expect([...result.stdout + result.stderr].filter((character) => /[\p{Cc}\p{Cf}]/u.test(character) && character !== '\n' && character !== '\t')).toEqual([])
      expect(result.code).toBe(0)
    } finally {
      await service.close()
    }
  })

  it('keeps a JSON document the same document: what it escapes in a string, \\uXXXX, is JSON for the same character', async () => {
    // JSON.stringify leaves DEL, the C1 controls and the format characters in its strings as they are
    const document = JSON.stringify([{ reference: 'ref\u202e-1\u007f\u0085\u200b', title: 'Lampe à café 🙂', note: 'tab\tand\nline' }], null, 2)
    const service = await fakeService(answering(200, JSON.stringify({ code: 0, stdout: `${document}\n`, stderr: '' })))
    try {
      const result = await ordersListBeside(service)
      expect(result.stdout).not.toBe(`${document}\n`)
      expect(result.stdout).toContain('ref\\u202e-1\\u007f\\u0085\\u200b')
      expect(JSON.parse(result.stdout)).toEqual(JSON.parse(document))
      expect(result.code).toBe(0)
    } finally {
      await service.close()
    }
  })
})

describe('the CLI when the service answers with a redirect', () => {
  let elsewhere: FakeService
  beforeAll(async () => {
    elsewhere = await fakeService(answering(200, JSON.stringify({ code: 0, stdout: 'ran elsewhere\n', stderr: '' })))
  })
  afterAll(() => elsewhere.close())

  for (const status of [301, 302, 303, 307, 308]) {
    it(`does not follow a ${status} (the command line is sent nowhere else): [service_refused], exit 1`, async () => {
      const target = `${elsewhere.url}/_local/cli`
      const service = await fakeService(answering(status, 'moved', { location: target, 'content-type': 'text/plain' }))
      try {
        const result = await ordersListBeside(service)
        expect(result.stderr).toBe(`The running service refused the command (${status}, a redirect to ${target}, not followed): moved [service_refused]\n`)
        expect(result.code).toBe(1)
        expect(result.stdout).toBe('')
        expect(service.requests).toHaveLength(1)
        expect(elsewhere.requests).toEqual([])
      } finally {
        await service.close()
      }
    })
  }
})

describe('the CLI when DATA_DIR/serve.json is not a service’s file', () => {
  // The files name the database that DATABASE_URL names (Postgres on a port nobody listens on), so that a file
  // taken for a service's has the command forwarded to `recorder`, and one that is ignored has it run here, where
  // it cannot reach its database: [database_unavailable]
  let recorder: FakeService
  let env: Record<string, string>
  let database: { kind: 'postgres'; location: string }

  beforeAll(async () => {
    recorder = await fakeService(answering(200, JSON.stringify({ code: 0, stdout: '(forwarded)\n', stderr: '' })))
    const port = await freePort()
    database = { kind: 'postgres', location: `127.0.0.1:${port}/hostile` }
    env = { ...receiverEnv(newDataDir()), DATABASE_URL: `postgres://partner@127.0.0.1:${port}/hostile` }
  })
  afterAll(() => recorder.close())

  const goodFile = (): Record<string, unknown> => ({ ...serviceFile('', recorder.url), database })
  const runBeside = async (contents: unknown) => {
    const dataDir = newDataDir()
    advertise(dataDir, contents)
    const before = recorder.requests.length
    const result = await runCli(['orders', 'list'], { ...env, DATA_DIR: dataDir })
    return { ...result, dataDir, forwarded: recorder.requests.length - before }
  }

  it('forwards the command when the file is a service’s (the control for the cases below)', async () => {
    const result = await runBeside(goodFile())
    expect(result.stderr).toBe('')
    expect(result.stdout).toBe('(forwarded)\n')
    expect(result.code).toBe(0)
    expect(result.forwarded).toBe(1)
  })

  it('forwards the command when the file is an older build’s: no mode (before 2026-12-02), no role of the database', async () => {
    const { mode: _, ...file } = goodFile()
    const result = await runBeside(file)
    expect(result.stderr).toBe('')
    expect(result.stdout).toBe('(forwarded)\n')
    expect(result.forwarded).toBe(1)
  })

  const cases: [string, (file: Record<string, unknown>) => unknown, string][] = [
    ['no database', ({ database: _, ...file }) => file, 'its database is not a kind and a location'],
    ['a database of another kind', (file) => ({ ...file, database: { kind: 'mysql', location: 'x' } }), 'its database is not a kind and a location'],
    ['a database location that is no text', (file) => ({ ...file, database: { kind: 'postgres', location: 5432 } }), 'its database is not a kind and a location'],
    ['a pid as text', (file) => ({ ...file, pid: '0x1' }), 'its pid is not a process id'],
    ['pid 0, the process group', (file) => ({ ...file, pid: 0 }), 'its pid is not a process id'],
    ['pid -1, every process', (file) => ({ ...file, pid: -1 }), 'its pid is not a process id'],
    ['a pid with a fraction', (file) => ({ ...file, pid: process.pid + 0.5 }), 'its pid is not a process id'],
    ['a pid past pid_t', (file) => ({ ...file, pid: 2 ** 32 + process.pid }), 'its pid is not a process id'],
    ['no pid', ({ pid: _, ...file }) => file, 'its pid is not a process id'],
    ['an adminUrl on another machine, by name', (file) => ({ ...file, adminUrl: 'http://evil.example:3001' }), 'its adminUrl is not an http URL of this machine'],
    ['an adminUrl on another machine, by address', (file) => ({ ...file, adminUrl: 'http://203.0.113.9:3001' }), 'its adminUrl is not an http URL of this machine'],
    ['an adminUrl that is a file', (file) => ({ ...file, adminUrl: 'file:///etc/passwd' }), 'its adminUrl is not an http URL of this machine'],
    ['an adminUrl with credentials', (file) => ({ ...file, adminUrl: recorder.url.replace('//', '//user:secret@') }), 'its adminUrl is not an http URL of this machine'],
    ['an adminUrl with a path', (file) => ({ ...file, adminUrl: `${recorder.url}/elsewhere` }), 'its adminUrl is not an http URL of this machine'],
    ['an adminUrl that is no URL', (file) => ({ ...file, adminUrl: 'localhost:3001' }), 'its adminUrl is not an http URL of this machine'],
    ['no url', ({ url: _, ...file }) => file, 'its url is not an http URL of this machine'],
    ['a webhookUrl on another machine', (file) => ({ ...file, webhookUrl: 'https://evil.example/webhooks/partner' }), 'its webhookUrl is not an http URL of this machine'],
    ['a sandboxUrl on another machine', (file) => ({ ...file, sandboxUrl: 'http://evil.example:4010' }), 'its sandboxUrl is not an http URL of this machine'],
    ['a token that is a number', (file) => ({ ...file, token: 42 }), 'its token is not a bearer token'],
    ['a token that would add a header', (file) => ({ ...file, token: 'x\r\nX-Injected: 1' }), 'its token is not a bearer token'],
    ['a mode of its own', (file) => ({ ...file, mode: 'evil' }), 'its mode is neither local nor remote'],
    ['a JSON array', (file) => [file], 'it is not a JSON object'],
    ['JSON null', () => 'null', 'it is not a JSON object'],
    ['a file that is not JSON', () => '{"pid": 1, "adminUrl": "http://127.0.0.1', 'it is not JSON'],
  ]
  for (const [what, make, problem] of cases) {
    it(`ignores a file with ${what}, saying so in one line, and runs the command here`, async () => {
      const result = await runBeside(make(goodFile()))
      expectNoStackTrace(result)
      const lines = result.stderr.trimEnd().split('\n')
      expect(lines[0]).toBe(
        `Ignored ${path.join(result.dataDir, 'serve.json')}: it is not a running service's file (${problem}); the command runs in this process [service_file_ignored]`,
      )
      // run here, against the database DATABASE_URL names, which nobody serves
      expect(lines.slice(1).join('\n')).toMatch(/\[database_unavailable\]$/)
      expect(result.code).toBe(1)
      expect(result.stdout).toBe('')
      expect(result.forwarded).toBe(0)
    })
  }

  it('ignores a file whose pid no process has, silently: a service that stopped without removing it', async () => {
    const result = await runBeside({ ...goodFile(), pid: 2 ** 22 + 7 })
    expect(result.stderr).not.toContain('service_file_ignored')
    expect(result.stderr).toMatch(/\[database_unavailable\]\n$/)
    expect(result.forwarded).toBe(0)
  })

  it('takes pid 1 for a process id: the image runs its service as its first process', async () => {
    const result = await runBeside({ ...goodFile(), pid: 1 })
    expect(result.stderr).not.toContain('service_file_ignored')
    let signalled = true
    try {
      process.kill(1, 0)
    } catch {
      signalled = false
    }
    // pid 1 of another user (this test not run as root) is a process the CLI cannot tell is a service's: ignored
    expect(result.forwarded).toBe(signalled ? 1 : 0)
  })

  it('forwards to an adminUrl on 0.0.0.0 or on an interface of this machine: where ADMIN_HOST may bind the listener', async () => {
    const viaAny = await runBeside({ ...goodFile(), adminUrl: recorder.url.replace('127.0.0.1', '0.0.0.0') })
    expect(viaAny.stderr).toBe('')
    expect(viaAny.forwarded).toBe(1)
    const address = Object.values(networkInterfaces())
      .flat()
      .find((entry) => entry !== undefined && !entry.internal && entry.family === 'IPv4')?.address
    if (address === undefined) return
    const onInterface = await fakeService(answering(200, JSON.stringify({ code: 0, stdout: '(on the interface)\n', stderr: '' })), address)
    try {
      const result = await runBeside({ ...goodFile(), adminUrl: onInterface.url, url: onInterface.url, webhookUrl: `${onInterface.url}/webhooks/partner` })
      expect(result.stderr).toBe('')
      expect(result.stdout).toBe('(on the interface)\n')
      expect(onInterface.requests).toHaveLength(1)
    } finally {
      await onInterface.close()
    }
  })
})

describe('the CLI and a stop signal while the service has not answered', () => {
  it('stops waiting on Ctrl-C (SIGINT): one line ending in [stopped_waiting], exit 130, the connection closed', async () => {
    let closed = false
    const service = await fakeService((_response, request) => {
      request.socket.once('close', () => (closed = true))
    })
    const dataDir = newDataDir()
    advertise(dataDir, serviceFile(dataDir, service.url))
    try {
      const child = spawnCli(['prune'], { DATA_DIR: dataDir })
      let stdout = ''
      let stderr = ''
      child.stdout!.on('data', (chunk) => (stdout += chunk))
      child.stderr!.on('data', (chunk) => (stderr += chunk))
      const exited = once(child, 'close') as Promise<[number | null, NodeJS.Signals | null]>
      // the command line has reached the service, which will never answer
      await expect.poll(() => service.requests.length, { timeout: 30_000 }).toBe(1)
      const signalledAt = performance.now()
      child.kill('SIGINT')
      const ended = await Promise.race([exited, new Promise<'still waiting'>((resolve) => setTimeout(() => resolve('still waiting'), 10_000))])
      if (ended === 'still waiting') {
        await stopChild(child, 'SIGKILL')
        throw new Error(`the CLI still waited 10 s after SIGINT; stderr: ${stderr}`)
      }
      expect(ended).toEqual([130, null])
      expect(performance.now() - signalledAt).toBeLessThan(5_000)
      expect(stderr).toBe(
        `Stopped waiting for the command's result: the service running from ${dataDir} (pid ${process.pid}) may still run it to its end, without showing its output here [stopped_waiting]\n`,
      )
      expect(stdout).toBe('')
      await expect.poll(() => closed, { timeout: 5_000 }).toBe(true)
    } finally {
      await service.close()
    }
  })
})

describe('a real `serve` and the CLI beside it', () => {
  const dataDir = migratedDataDir('cli-hostile-real-')
  const env = receiverEnv(dataDir)
  let service: ReturnType<typeof spawnCli>
  let serviceFileText: string

  beforeAll(async () => {
    service = spawnCli(['serve'], env)
    await waitForLogLine(service, 'service listening')
    serviceFileText = readFileSync(path.join(dataDir, 'serve.json'), 'utf8')
    for (const reference of ['plain-1', 'Lampe-à-café-2']) {
      const created = await runCli(['orders', 'create', '--external-reference', reference], env)
      expect(created.stderr).toBe('')
      expect(created.code).toBe(0)
    }
  })
  afterAll(async () => {
    await stopChild(service)
  })

  it('prints what the service answers, byte for byte: tables, JSON, a refusal', async () => {
    const { adminUrl, token } = JSON.parse(serviceFileText) as ServiceFile
    const commands = [
      ['orders', 'list'],
      ['orders', 'list', '--json'],
      ['orders', 'show', 'Lampe-à-café-2'],
      ['orders', 'show', 'plain-1', '--json'],
      ['deliveries', 'list'],
      ['reactions', 'list', '--json'],
      ['migrate', '--json'],
      ['orders', 'show', 'nobody'],
    ]
    for (const args of commands) {
      const answer = await fetch(`${adminUrl}/_local/cli`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
        body: JSON.stringify({ args }),
      })
      expect(answer.status).toBe(200)
      const sent = (await answer.json()) as { code: number; stdout: string; stderr: string }
      const shown = await runCli(args, env)
      expect({ code: shown.code, stdout: shown.stdout, stderr: shown.stderr }, args.join(' ')).toEqual(sent)
    }
    // the control: these commands printed something
    const listed = await runCli(['orders', 'list', '--json'], env)
    expect((JSON.parse(listed.stdout) as { externalReference: string }[]).map((order) => order.externalReference).sort()).toEqual(['Lampe-à-café-2', 'plain-1'])
  })

  it('refuses, as the database’s owner’s, a command that ignored a service file that is not one, and writes nothing', async () => {
    const file = path.join(dataDir, 'serve.json')
    const real = JSON.parse(serviceFileText) as ServiceFile
    writeFileSync(file, JSON.stringify({ ...real, pid: String(real.pid) }), { mode: 0o600 })
    let result: CliResult
    try {
      result = await runCli(['orders', 'create', '--external-reference', 'beside-the-owner-1'], env)
    } finally {
      writeFileSync(file, serviceFileText, { mode: 0o600 })
    }
    expectNoStackTrace(result)
    const lines = result.stderr.trimEnd().split('\n')
    expect(lines[0]).toBe(`Ignored ${file}: it is not a running service's file (its pid is not a process id); the command runs in this process [service_file_ignored]`)
    expect(lines.slice(1).join('\n')).toContain(`in use by process ${service.pid}`)
    expect(result.code).toBe(1)
    expect(result.stdout).toBe('')
    // forwarded again once the file is the service's: the order was never created
    const shown = await runCli(['orders', 'show', 'beside-the-owner-1'], env)
    expect(shown.stderr).toMatch(/\[order_not_found\]\n$/)
  })
})

describe('the CLI when the running service cannot run its command', () => {
  it('exits 1 with [service_unreachable] when the advertised service does not answer', async () => {
    const dataDir = newDataDir()
    const url = `http://127.0.0.1:${await freePort()}`
    advertise(dataDir, serviceFile(dataDir, url))
    const result = await runCli(['orders', 'list'], { DATA_DIR: dataDir })
    expect(result.code).toBe(1)
    expect(result.stderr).toContain(`(pid ${process.pid}) does not answer`)
    expect(result.stderr.trim()).toMatch(/\[service_unreachable\]$/)
    expect(result.stdout).toBe('')
  })

  // a service that died while it ran a forwarded command (30,000 of 200,002 orders requeued) was said not to answer,
  // [service_unreachable], as if the command had not been taken
  it('exits 1 with [outcome_unknown] when the service took the command and the connection was lost before its result', async () => {
    const service = await fakeService((response) => response.socket?.destroy())
    try {
      const dataDir = newDataDir()
      advertise(dataDir, serviceFile(dataDir, service.url))
      const result = await runCli(['reconcile', '--requeue-open', '--within', '0'], { DATA_DIR: dataDir })
      expectNoStackTrace(result)
      expect(service.requests).toHaveLength(1)
      expect(result.stderr).toBe(
        `The service running from ${dataDir} (pid ${process.pid}) took \`reconcile --requeue-open\` and the connection to it was lost before its result ` +
          '(ECONNRESET): the command may have run there in part or whole, its outcome is unknown. Check what it would have changed ' +
          '(`orders show`, `trades get`) before running it again [outcome_unknown]\n',
      )
      expect(result.code).toBe(1)
      expect(result.stdout).toBe('')
    } finally {
      await service.close()
    }
  })

  // once the connection is made the command may have been taken, whatever comes back: before, an answer that is not
  // HTTP was said not to answer at all, [service_unreachable], as if the command had never been sent
  it('exits 1 with [outcome_unknown] when whatever listens there takes the command and answers with something that is not HTTP', async () => {
    const received: string[] = []
    const listener = net.createServer((socket) => {
      socket.on('data', (chunk) => {
        received.push(chunk.toString('latin1'))
        socket.end('SSH-2.0-OpenSSH_9.6\r\n')
      })
    })
    listener.listen(0, '127.0.0.1')
    await once(listener, 'listening')
    try {
      const dataDir = newDataDir()
      advertise(dataDir, serviceFile(dataDir, `http://127.0.0.1:${(listener.address() as AddressInfo).port}`))
      const result = await runCli(['trades', 'release', 'order-1'], { DATA_DIR: dataDir })
      expectNoStackTrace(result)
      expect(received.join('')).toMatch(/^POST \/_local\/cli HTTP\/1\.1\r\n/)
      expect(result.stderr).toMatch(
        new RegExp(
          `^The service running from ${dataDir} \\(pid ${process.pid}\\) took \`trades release\` and the connection to it was lost before its result ` +
            '\\(HPE_[A-Z_]+\\): the command may have run there in part or whole, its outcome is unknown\\. .* \\[outcome_unknown\\]\\n$',
        ),
      )
      expect(result.code).toBe(1)
      expect(result.stdout).toBe('')
    } finally {
      await new Promise((resolve) => listener.close(resolve))
    }
  })

  it('prints a refusal on one line, its controls visible and its length cut, ending in [service_refused], exit 1', async () => {
    const service = await fakeService(answering(500, `boom\u001b[31m\nforged: line ${'x'.repeat(2_000)}`, { 'content-type': 'text/plain' }))
    try {
      const result = await ordersListBeside(service)
      expect(result.code).toBe(1)
      const lines = result.stderr.trim().split('\n')
      expect(lines).toHaveLength(1)
      expect(lines[0]).toMatch(/^The running service refused the command \(500\): boom\\u001b\[31m\\u000aforged: line x+… \(2,023 characters\) \[service_refused\]$/)
      expect(result.stderr).not.toContain('\u001b')
    } finally {
      await service.close()
    }
  })
})

// The command goes to the service over node:http (src/local/service-request.ts): https for a fork that added TLS to its
// operator listener, and a connect bounded as fetch bounded it
describe('the CLI when the service’s operator listener is https, or never completes a connect', () => {
  const tlsFixtures = path.join(import.meta.dirname, 'fixtures/tls')
  const unanswered = useUnansweredListener()

  const certificate = { cert: readFileSync(path.join(tlsFixtures, 'server.crt')), key: readFileSync(path.join(tlsFixtures, 'server.key')) }
  const httpsService = (answer: (response: http.ServerResponse) => void) => fakeService(answer, '127.0.0.1', certificate)

  it('forwards the command over https to a certificate this machine trusts (NODE_EXTRA_CA_CERTS)', async () => {
    const service = await httpsService(answering(200, JSON.stringify({ code: 0, stdout: 'over tls\n', stderr: '' })))
    try {
      const dataDir = newDataDir()
      advertise(dataDir, serviceFile(dataDir, service.url))
      const result = await runCli(['orders', 'list'], { DATA_DIR: dataDir, NODE_EXTRA_CA_CERTS: path.join(tlsFixtures, 'ca.crt') })
      expect(result).toEqual({ code: 0, stdout: 'over tls\n', stderr: '' })
      expect(service.requests.map((body) => JSON.parse(body) as unknown)).toEqual([{ args: ['orders', 'list'] }])
    } finally {
      await service.close()
    }
  })

  // the handshake failed, so nothing of the command was written: the service did not take it
  it('says the service does not answer, [service_unreachable], when its certificate is not trusted here: the command never sent', async () => {
    const service = await httpsService(answering(200, JSON.stringify({ code: 0, stdout: 'over tls\n', stderr: '' })))
    try {
      const dataDir = newDataDir()
      advertise(dataDir, serviceFile(dataDir, service.url))
      const result = await runCli(['trades', 'release', 'order-1'], { DATA_DIR: dataDir })
      expectNoStackTrace(result)
      expect(result.stderr).toBe(
        `The service running from ${dataDir} (pid ${process.pid}) does not answer at ${service.url} (UNABLE_TO_VERIFY_LEAF_SIGNATURE). ` +
          'Try again once it is up, or stop it. [service_unreachable]\n',
      )
      expect(result.code).toBe(1)
      expect(service.requests).toEqual([])
    } finally {
      await service.close()
    }
  })

  // without a bound of its own, node:http waits for the kernel's SYN retries: over two minutes
  it('gives up a connect that never completes after 10 s, [service_unreachable]: the command never sent', async () => {
    const dataDir = newDataDir()
    const url = `http://127.0.0.1:${unanswered.port}`
    advertise(dataDir, serviceFile(dataDir, url))
    const started = Date.now()
    const result = await runCli(['trades', 'release', 'order-1'], { DATA_DIR: dataDir })
    expectNoStackTrace(result)
    expect(result.stderr).toBe(
      `The service running from ${dataDir} (pid ${process.pid}) does not answer at ${url} (CONNECT_TIMEOUT). Try again once it is up, or stop it. [service_unreachable]\n`,
    )
    expect(result.code).toBe(1)
    expect(Date.now() - started).toBeGreaterThanOrEqual(10_000)
  }, 60_000)
})
