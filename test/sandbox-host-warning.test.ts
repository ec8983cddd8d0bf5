// `cli sandbox` on a host other machines can reach says so, once, on stderr: its API is signed and its control
// endpoints need the token, but it is a simulator with test secrets. On a loopback host it says nothing of it.
import { describe, expect, it } from 'vitest'
import { signalAndClose, spawnCli } from './helpers/cli-process.js'

/** Starts `sandbox` with `args` and `env` on a free port, waits until it listens, stops it: what it wrote. */
async function sandboxOutput(args: string[], env: Record<string, string> = {}) {
  const child = spawnCli(['sandbox', '--port', '0', ...args], env)
  let stdout = ''
  let stderr = ''
  child.stderr!.on('data', (chunk) => {
    stderr += chunk
  })
  const listening = new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (chunk) => {
      stdout += chunk
      if (stdout.includes('sandbox platform listening on')) resolve()
    })
    child.once('exit', (code) => reject(new Error(`sandbox exited with ${code} before listening:\n${stdout}${stderr}`)))
    child.once('error', reject)
  })
  await listening
  await signalAndClose(child)
  const warnings = stderr.split('\n').filter((line) => line.includes('loopback') || line.includes('other machines'))
  return { stdout, warnings }
}

describe('`cli sandbox` on a host other machines can reach', () => {
  it('warns once on stderr when --host is every interface, naming the option', async () => {
    const { stdout, warnings } = await sandboxOutput(['--host', '0.0.0.0'])
    expect(stdout).toContain('sandbox platform listening on http://0.0.0.0:')
    // found from outside: the receiver was told PARTNER_API_BASE_URL=http://0.0.0.0:…, no address to go to
    expect(stdout).toMatch(/a receiver's PARTNER_API_BASE_URL=http:\/\/<this machine's address>:(\d+) \(http:\/\/127\.0\.0\.1:\1 on this machine\)\)\n/)
    expect(warnings).toEqual([
      'warning: --host 0.0.0.0 is not a loopback address, so other machines can reach the simulator: its API is signed ' +
        'and its control endpoints need the token, but it is a simulator with test secrets. Give 127.0.0.1 unless they must reach it.',
    ])
  })

  it('names SANDBOX_HOST when the host came from it', async () => {
    const { warnings } = await sandboxOutput([], { SANDBOX_HOST: '::' })
    expect(warnings).toHaveLength(1)
    expect(warnings[0]).toMatch(/^warning: SANDBOX_HOST=:: is not a loopback address, so other machines can reach the simulator: /)
  })

  it.each([
    ['the default host', []],
    ['localhost', ['--host', 'localhost']],
    ['another address of 127.0.0.0/8', ['--host', '127.0.0.2']],
    ['::1', ['--host', '::1']],
  ])('says nothing of it on %s', async (_name, args) => {
    const { stdout, warnings } = await sandboxOutput(args)
    expect(stdout).toContain('sandbox platform listening on')
    expect(warnings).toEqual([])
  })
})
