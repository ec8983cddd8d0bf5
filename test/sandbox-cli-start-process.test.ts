// The compiled `cli sandbox` at start: its line about the control endpoints names where the token really comes from
// (SANDBOX_CONTROL_TOKEN when it is set: it named local-secrets.json, whose token is then refused) and an address
// they answer at (bound to 0.0.0.0 it printed http://0.0.0.0:…/sandbox/*, answered 403 forbidden_host). A webhook
// URL with a user name or password, which fetch never sends, is refused at start; an attempt that gets no answer is
// said on stderr with its reason, where nothing was said.
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, describe, expect, it } from 'vitest'
import { killLeftovers, signalAndClose, spawnCli } from './helpers/cli-process.js'
import { rememberSecret } from './helpers/log-sink.js'

const controlToken = 'sandbox-cli-start-control-token-0123456789'
const password = 'hook-password-not-to-be-shown'
rememberSecret(controlToken)
const secrets = ['--key-id', 'pk_cli_start', '--api-secret', 'cli-start-api-secret-0123456789', '--webhook-secret', 'cli-start-webhook-secret-0123456']

const children: ChildProcess[] = []
afterAll(() => killLeftovers(children))

/** Starts the compiled `sandbox` and resolves with its stdout once it has written its last start line. */
async function startSandbox(args: string[], env: Record<string, string>) {
  const child = spawnCli(['sandbox', '--port', '0', ...secrets, ...args], env)
  children.push(child)
  let stdout = ''
  let stderr = ''
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (chunk) => {
      stdout += chunk
      if (/\ncontrol endpoints .*\n/.test(stdout)) resolve()
    })
    child.once('exit', (code) => reject(new Error(`sandbox exited with ${code} before its start lines:\n${stdout}${stderr}`)))
  })
  return { child, stdout: () => stdout, stderr: () => stderr }
}

/** What the compiled command wrote until it exited, or until it listened (then stopped): a start not refused. */
async function exitOrListening(args: string[], env: Record<string, string>) {
  const child = spawnCli(args, env)
  children.push(child)
  let stdout = ''
  let stderr = ''
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  child.stdout!.on('data', (chunk) => {
    stdout += chunk
    if (stdout.includes('sandbox platform listening')) child.kill()
  })
  const [code] = (await once(child, 'close')) as [number | null]
  return { code, stdout, stderr }
}

describe('the compiled `cli sandbox` at start', () => {
  it('bound to every interface with SANDBOX_CONTROL_TOKEN set, names the variable and a control URL that answers', async () => {
    const sandbox = await startSandbox(['--host', '0.0.0.0'], { SANDBOX_CONTROL_TOKEN: controlToken })
    const line = sandbox.stdout().split('\n').find((text) => text.startsWith('control endpoints '))!
    const match = /^control endpoints (http:\/\/127\.0\.0\.1:\d+)\/sandbox\/\* need Authorization: Bearer <SANDBOX_CONTROL_TOKEN>$/.exec(line)
    expect(match, line).not.toBeNull()
    const answer = await fetch(`${match![1]}/sandbox/deliveries`, { headers: { authorization: `Bearer ${controlToken}` } })
    expect(answer.status).toBe(200)
    await signalAndClose(sandbox.child)
  })

  it.each([
    ['--webhook-url', (url: string) => [['--webhook-url', url], {}] as const],
    ['SANDBOX_WEBHOOK_URL', (url: string) => [[], { SANDBOX_WEBHOOK_URL: url }] as const],
  ])('refuses a webhook URL with a user and password from %s: exit 2, its code, the password not shown', async (name, given) => {
    const [args, env] = given(`http://partner:${password}@127.0.0.1:9/hook`)
    const result = await exitOrListening(['sandbox', '--port', '0', ...secrets, ...args], { ...env, SANDBOX_CONTROL_TOKEN: controlToken })
    expect(result).toEqual({
      code: 2,
      stdout: '',
      stderr:
        `${name}: holds a user name or password, and fetch sends no request to such a URL, so every webhook would fail; ` +
        'give the receiver’s URL without them (the receiver checks the signature) [webhook_url_has_credentials]\n',
    })
  })

  it('says on stderr, with its reason, that a webhook attempt got no answer', async () => {
    // a port just given back: nothing listens there
    const closed = http.createServer()
    closed.listen(0, '127.0.0.1')
    await once(closed, 'listening')
    const { port } = closed.address() as AddressInfo
    await new Promise<void>((resolve) => closed.close(() => resolve()))
    const sandbox = await startSandbox(['--webhook-url', `http://127.0.0.1:${port}/hook`, '--retry-base-delay-ms', '60000'], {
      SANDBOX_CONTROL_TOKEN: controlToken,
    })
    const base = /listening on (http:\/\/\S+) /.exec(sandbox.stdout())![1]
    const queued = await fetch(`${base}/sandbox/sellers/s-1/status`, {
      method: 'POST',
      headers: { authorization: `Bearer ${controlToken}`, 'content-type': 'application/json' },
      body: '{"status":"verified"}',
    })
    expect(queued.status).toBe(202)
    const until = Date.now() + 10_000
    while (!sandbox.stderr().includes('sandbox webhook attempt got no answer') && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 50))
    const said = sandbox
      .stderr()
      .split('\n')
      .filter((text) => text.includes('sandbox webhook attempt got no answer'))
      .map((text) => JSON.parse(text) as Record<string, unknown>)
    expect(said).toMatchObject([{ event: 'seller.verified', attempt: 1, reason: 'ECONNREFUSED' }])
    await signalAndClose(sandbox.child)
  })
})
