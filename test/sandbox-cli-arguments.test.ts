// `cli sandbox` refuses, before it starts, the arguments that would leave it running but useless (webhooks to
// an address it never delivers to, an empty key or secret, an attempt timeout that aborts every attempt), and
// prints the webhook URL without its password.
import { once } from 'node:events'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { type CliResult, signalAndClose, spawnCli } from './helpers/cli-process.js'
import { sandboxClient } from './helpers/sandbox-client.js'

/** Runs `sandbox` with `args` and `env` on a free port; one that starts anyway is stopped once it listens. */
async function sandboxRun(args: string[], env: Record<string, string> = {}): Promise<CliResult> {
  const child = spawnCli(['sandbox', '--port', '0', ...args], env)
  let stdout = ''
  let stderr = ''
  child.stderr!.on('data', (chunk) => {
    stderr += chunk
  })
  child.stdout!.on('data', (chunk) => {
    stdout += chunk
    if (stdout.includes('Ctrl-C stops it')) child.kill('SIGTERM')
  })
  const [code] = (await once(child, 'close')) as [number | null]
  return { code, stdout, stderr }
}

describe('`cli sandbox` arguments', () => {
  it.each([
    ['a --webhook-url that is not a URL', ['--webhook-url', 'notaurl'], '--webhook-url', 'must be an http:// or https:// URL'],
    ['a file: --webhook-url', ['--webhook-url', 'file:///etc/passwd'], '--webhook-url', 'must be an http:// or https:// URL'],
    ['an ftp: --webhook-url', ['--webhook-url', 'ftp://x/'], '--webhook-url', 'must be an http:// or https:// URL'],
    ['an empty --key-id', ['--key-id', ''], '--key-id', 'must not be empty'],
    ['an empty --api-secret', ['--api-secret', ''], '--api-secret', 'must not be empty'],
    ['an empty --webhook-secret', ['--webhook-secret', ''], '--webhook-secret', 'must not be empty'],
    ['an --attempt-timeout-ms of 0', ['--attempt-timeout-ms', '0'], '--attempt-timeout-ms', 'must be from 1 to'],
  ])('refuses %s with exit code 2, naming the option, and does not start', async (_name, args, option, message) => {
    const result = await sandboxRun(args)
    expect(result.code).toBe(2)
    expect(result.stderr).toContain(`option '${option} <`)
    expect(result.stderr).toContain(message)
    expect(result.stdout).not.toContain('listening')
  })
})

describe('`cli sandbox` with credentials in --webhook-url', () => {
  // fetch sends no request to a URL with a user or password: it started, and every webhook failed without a word
  it('refuses it at start, exit 2, with the password nowhere', async () => {
    const result = await sandboxRun(['--webhook-url', 'http://user:hunter2-webhook-pw@127.0.0.1:9/hook'])
    expect(result.code).toBe(2)
    expect(result.stderr).toMatch(/^--webhook-url: holds a user name or password, .* \[webhook_url_has_credentials\]\n$/)
    expect(`${result.stdout}${result.stderr}`).not.toContain('hunter2-webhook-pw')
  })

  it('refuses SANDBOX_WEBHOOK_URL that is not http(s) in a real process, exit code 2', async () => {
    const result = await sandboxRun([], { SANDBOX_WEBHOOK_URL: 'file:///etc/passwd' })
    expect(result.code).toBe(2)
    expect(result.stderr).toContain("from env 'SANDBOX_WEBHOOK_URL' is invalid")
    expect(result.stderr).toContain('must be an http:// or https:// URL')
    expect(result.stdout).toBe('')
  })
})

describe('`cli sandbox` with its secrets in files (SANDBOX_API_SECRET_FILE, SANDBOX_WEBHOOK_SECRET_FILE)', () => {
  const directory = mkdtempSync(path.join(tmpdir(), 'sandbox-secret-files-'))
  afterAll(() => rmSync(directory, { recursive: true, force: true }))
  const apiSecret = 'sandbox-api-secret-in-a-file-0000000'
  const apiSecretFile = path.join(directory, 'api-secret')
  writeFileSync(apiSecretFile, `${apiSecret}\n`, { mode: 0o600 })

  it('verifies calls with the secret in the file', async () => {
    const child = spawnCli(['sandbox', '--port', '0', '--key-id', 'pk_files'], { SANDBOX_API_SECRET_FILE: apiSecretFile })
    let output = ''
    child.stderr!.on('data', (chunk) => (output += chunk))
    const url = await new Promise<string>((resolve, reject) => {
      child.stdout!.on('data', (chunk) => {
        output += chunk
        const listening = /sandbox platform listening on (http:\/\/\S+) /.exec(output)
        if (listening && output.includes('Ctrl-C stops it')) resolve(listening[1]!)
      })
      child.once('exit', (code) => reject(new Error(`sandbox exited with ${code} before listening:\n${output}`)))
    })
    try {
      await expect(sandboxClient(url, { keyId: 'pk_files', secret: apiSecret }).getTrade('trd_not_there')).rejects.toMatchObject({ status: 404 })
      await expect(sandboxClient(url, { keyId: 'pk_files', secret: `${apiSecret}\n` }).getTrade('trd_not_there')).rejects.toMatchObject({ status: 401 })
    } finally {
      await signalAndClose(child)
    }
    expect(output).not.toContain(apiSecret)
  })

  it('refuses a file beside its variable, or one it cannot read, exit 2 with [config_invalid], and does not start', async () => {
    const both = await sandboxRun([], { SANDBOX_API_SECRET: apiSecret, SANDBOX_API_SECRET_FILE: apiSecretFile })
    expect({ code: both.code, stderr: both.stderr }).toEqual({
      code: 2,
      stderr:
        'Invalid configuration [config_invalid]\n  - SANDBOX_API_SECRET and SANDBOX_API_SECRET_FILE: both are set; give the value one way, in SANDBOX_API_SECRET ' +
        'or in the file SANDBOX_API_SECRET_FILE names, and unset the other\n',
    })
    const missing = path.join(directory, 'not-there')
    const unread = await sandboxRun([], { SANDBOX_WEBHOOK_SECRET_FILE: missing })
    expect({ code: unread.code, stderr: unread.stderr }).toEqual({
      code: 2,
      stderr: `Invalid configuration [config_invalid]\n  - SANDBOX_WEBHOOK_SECRET_FILE: the file ${missing} does not exist\n`,
    })
    // the option on the command line wins over the file, as over the variable
    const option = await sandboxRun(['--webhook-secret', 'an-option-secret-of-enough-length-00'], { SANDBOX_WEBHOOK_SECRET_FILE: missing })
    expect(option.code).not.toBe(2)
    expect(option.stdout).toContain('Ctrl-C stops it')
  })
})
