// The compiled service and CLI with their secrets in files only (WEBHOOK_SECRETS_FILE, PARTNER_API_SECRET_FILE,
// ADMIN_TOKEN_FILE, and DATABASE_URL_FILE on Postgres), as Docker secrets and Kubernetes secret volumes hand them
// over: `serve` starts and takes a delivery signed with the secret in the file, a command run afterwards reads the
// same files, and a file that cannot be read stops either with exit 2 and [config_invalid], never its content.
import { spawnSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { childEnv, runCli, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { createTestDatabase, postgresUrl, type TestDatabase } from './helpers/test-database.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const WEBHOOK_SECRET = `webhook-secret-in-a-file-${randomUUID()}`
const API_SECRET = `api-secret-in-a-file-${randomUUID()}`
const ADMIN_TOKEN = `admin-token-in-a-file-${randomUUID()}`

// a directory other users may enter (mkdtemp makes it 0700), for the run as nobody below
const directory = mkdtempSync(path.join(tmpdir(), 'secret-files-process-'))
chmodSync(directory, 0o755)
const cleanups: (() => Promise<void>)[] = []
afterAll(async () => {
  for (const cleanup of cleanups) await cleanup()
  rmSync(directory, { recursive: true, force: true })
})

function secretFile(name: string, content: string, mode = 0o600): string {
  const file = path.join(directory, name)
  writeFileSync(file, content, { mode })
  chmodSync(file, mode)
  return file
}

describe(`the compiled service with its secrets in files only (${postgresUrl ? 'Postgres' : 'PGlite'})`, () => {
  it('starts, takes a delivery signed with the file’s secret, and a command reads the same files', async () => {
    let database: TestDatabase | undefined
    if (postgresUrl) {
      database = await createTestDatabase({ kind: 'postgres' })
      cleanups.push(() => database!.close())
    }
    const env: Record<string, string> = {
      // PGlite's database, or on Postgres where serve.json alone is written
      DATA_DIR: database ? mkdtempSync(path.join(directory, 'data-')) : migratedDataDir('secret-files-process-'),
      PORT: '0',
      ADMIN_PORT: '0',
      POLL_ENABLED: 'false',
      PARTNER_API_BASE_URL: 'http://127.0.0.1:9',
      PARTNER_API_KEY_ID: 'pk_files',
      // as `echo secret > file` makes it, and as an editor on Windows saves it
      WEBHOOK_SECRETS_FILE: secretFile('webhook', `${WEBHOOK_SECRET}\n`),
      PARTNER_API_SECRET_FILE: secretFile('api', `${API_SECRET}\r\n`),
      ADMIN_TOKEN_FILE: secretFile('admin', ADMIN_TOKEN),
      ...(database && { DATABASE_URL_FILE: secretFile('database-url', `${database.url}\n`) }),
    }
    const service = spawnCli(['serve'], env)
    let output = ''
    service.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()))
    service.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()))
    try {
      const listening = await waitForLogLine(service, 'service listening')
      const url = String(listening.url)
      const deliveryId = `dlv_${randomUUID()}`
      const body = JSON.stringify(tradePayload(`files-${randomUUID()}`, 'funded'))
      const send = async (secret: string, id: string) =>
        (
          await fetch(`${url}/webhooks/partner`, {
            method: 'POST',
            headers: { 'content-type': 'application/json', 'x-partner-delivery-id': id, 'x-partner-signature': signBody(body, secret) },
            body,
          })
        ).status
      expect(await send(WEBHOOK_SECRET, deliveryId)).toBe(200)
      expect(await send(`${WEBHOOK_SECRET}\n`, `dlv_${randomUUID()}`)).toBe(401)
      // the console takes the token in the file
      const console = await fetch(new URL('/console/', String(listening.adminUrl)), { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })
      expect(console.status).toBe(200)
      await console.arrayBuffer()
      expect(await stopChild(service)).toBe(0)

      // a command with the same environment: in remote mode it needs the secrets, and finds the delivery where serve stored it
      const shown = await runCli(['deliveries', 'show', deliveryId], env)
      expect({ code: shown.code, stderr: shown.stderr }).toEqual({ code: 0, stderr: '' })
      expect(shown.stdout).toContain(deliveryId)
      // and signs with the secret in the file
      const signed = await runCli(['webhook', 'sign', '--file', secretFile('body.json', body, 0o644), '--json'], env)
      expect({ code: signed.code, stderr: signed.stderr }).toEqual({ code: 0, stderr: '' })
      expect((JSON.parse(signed.stdout) as Record<string, string>)['X-Partner-Signature']).toBe(signBody(body, WEBHOOK_SECRET))
      for (const secret of [WEBHOOK_SECRET, API_SECRET, ADMIN_TOKEN, ...(database ? [new URL(database.url!).password].filter((password) => password.length >= 8) : [])]) {
        expect(output).not.toContain(secret)
        expect(shown.stdout + shown.stderr).not.toContain(secret)
      }
    } finally {
      await stopChild(service)
    }
  })

  it('stops serve and a command alike, exit 2, naming the variable, the path and the reason', async () => {
    const missing = path.join(directory, 'not-there')
    const env = {
      DATA_DIR: path.join(directory, 'never-made'),
      PORT: '0',
      ADMIN_PORT: '0',
      PARTNER_API_BASE_URL: 'http://127.0.0.1:9',
      PARTNER_API_KEY_ID: 'pk_files',
      PARTNER_API_SECRET_FILE: secretFile('api-2', `${API_SECRET}\n`),
      WEBHOOK_SECRETS_FILE: missing,
    }
    const body = secretFile('body-2.json', '{}', 0o644)
    for (const args of [['serve'], ['orders', 'list'], ['webhook', 'sign', '--file', body]]) {
      const result = await runCli(args, env)
      expect({ code: result.code, stdout: result.stdout, stderr: result.stderr }, args.join(' ')).toEqual({
        code: 2,
        stdout: '',
        stderr: `Invalid configuration [config_invalid]\n  - WEBHOOK_SECRETS_FILE: the file ${missing} does not exist\n`,
      })
    }
  })

  // a file of root's, 0600, read by the service as another user: what a secret mounted from the host with its mode
  // kept meets in a container running as `node`. Running as another user needs root (skipped otherwise)
  const NOBODY = 65534
  const asNobody = [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups']
  const canRunAsNobody =
    process.getuid?.() === 0 &&
    spawnSync('setpriv', [...asNobody, process.execPath, '-e', `require('node:fs').accessSync(${JSON.stringify(path.resolve('dist/src/cli.js'))}, require('node:fs').constants.R_OK)`])
      .status === 0
  it.skipIf(!canRunAsNobody)('says a file this user may not read is so, with its owner and mode, never its content', () => {
    const file = secretFile('root-only', `${WEBHOOK_SECRET}\n`, 0o600)
    const result = spawnSync('setpriv', [...asNobody, process.execPath, path.resolve('dist/src/cli.js'), 'serve'], {
      env: childEnv({ DATA_DIR: 'memory://', PORT: '0', ADMIN_PORT: '0', WEBHOOK_SECRETS_FILE: file }),
      encoding: 'utf8',
      timeout: 60_000,
    })
    expect({ code: result.status, stdout: result.stdout, stderr: result.stderr }).toEqual({
      code: 2,
      stdout: '',
      stderr:
        'Invalid configuration [config_invalid]\n' +
        `  - WEBHOOK_SECRETS_FILE: the file ${file} cannot be read by this user (uid ${NOBODY}): permission denied (owned by uid 0, mode 0600)\n`,
    })
  })
})
