// The start-up banner's commands for another terminal, which finds the service by DATA_DIR/serve.json: they
// carry the service's DATA_DIR, whole and quoted for the shell, unless it is the default ./data. The commands
// themselves run, as printed, in test/newcomer.test.ts.
import { execFileSync } from 'node:child_process'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { cliInvocation, localModeBanner, reachableUrl } from '../src/main.js'
import { quoteForShell } from '../src/quote-for-shell.js'
import { testConfig } from './helpers/test-config.js'

function commands(env: Record<string, string>): string[] {
  const banner = localModeBanner(testConfig(env), 'http://127.0.0.1:3000', 'http://127.0.0.1:4010', 'http://127.0.0.1:3001', { terminal: true })
  return banner
    .split('\n')
    .map((line) => line.trim())
    .filter((line) => line.includes('npm run cli -- '))
}

describe('the banner’s commands for another terminal', () => {
  it('are plain `npm run cli -- ...` with the default DATA_DIR, given or not', () => {
    for (const env of [{ DATA_DIR: './data' }, { DATA_DIR: path.resolve('data') }]) {
      expect(commands(env)).toHaveLength(3)
      for (const command of commands(env)) expect(command).toMatch(/^npm run cli -- /)
    }
  })

  it('carry another DATA_DIR as a whole path, so they hold from any working directory', () => {
    for (const command of commands({ DATA_DIR: 'elsewhere/data' })) {
      expect(command.startsWith(`DATA_DIR=${path.resolve('elsewhere/data')} npm run cli -- `)).toBe(true)
    }
  })
})

// Redirected to a file (`npm start > service.log`), the banner would put the console's token in a log; it says
// where the token is instead. The token from local-secrets.json is checked end to end in test/newcomer.test.ts.
// The image has no tsx: there `npm run cli -- …` failed with ERR_MODULE_NOT_FOUND. The compiled commands run, as
// printed, in test/newcomer.test.ts.
describe('the banner of a compiled serve (the image, the bin entry)', () => {
  it('prints the compiled CLI by its whole path, quoted for the shell, and `npm run cli --` under npm start', () => {
    expect(cliInvocation('/app/dist/src/cli.js')).toBe('node /app/dist/src/cli.js')
    expect(cliInvocation("/srv/it's here/dist/src/cli.js")).toBe(`node '/srv/it'\\''s here/dist/src/cli.js'`)
    expect(cliInvocation('dist/src/cli.js')).toBe(`node ${path.resolve('dist/src/cli.js')}`)
    expect(cliInvocation(path.resolve('src/cli.ts'))).toBe('npm run cli --')
    const banner = localModeBanner(testConfig(), 'http://127.0.0.1:3000', 'http://127.0.0.1:4010', 'http://127.0.0.1:3001', {
      terminal: true,
      cli: 'node /app/dist/src/cli.js',
    })
    expect(banner).toContain('  node /app/dist/src/cli.js orders create --external-reference order-1\n')
    expect(banner).toContain('lost and repeated webhooks: node /app/dist/src/cli.js demo\n')
    expect(banner).not.toContain('npm run')
  })

  // found from outside: with the default ./data the commands had no DATA_DIR, and typed in another directory (the
  // compiled CLI runs where it is typed) made a new database there and blamed the platform for the missing service
  it('names even the default DATA_DIR for the compiled CLI, which runs where it is typed', () => {
    const banner = localModeBanner(testConfig({ DATA_DIR: './data' }), 'http://127.0.0.1:3000', 'http://127.0.0.1:4010', 'http://127.0.0.1:3001', {
      terminal: true,
      cli: 'node /app/dist/src/cli.js',
    })
    expect(banner).toContain(`  DATA_DIR=${quoteForShell(path.resolve('data'))} node /app/dist/src/cli.js orders create --external-reference order-1\n`)
    expect(banner).toContain(`  DATA_DIR=${quoteForShell(path.resolve('data'))} node /app/dist/src/cli.js orders show order-1\n`)
  })

  it('shows a listener on every interface by an address a person can open', () => {
    expect(reachableUrl('http://0.0.0.0:3000')).toBe('http://127.0.0.1:3000')
    expect(reachableUrl('http://[::]:3001')).toBe('http://[::1]:3001')
    expect(reachableUrl('http://10.0.0.5:3000')).toBe('http://10.0.0.5:3000')
    const banner = localModeBanner(testConfig(), 'http://0.0.0.0:3000', 'http://127.0.0.1:4010', 'http://0.0.0.0:3001', { terminal: true })
    expect(banner).toContain('receiver  http://127.0.0.1:3000/webhooks/partner')
    expect(banner).toContain('metrics   http://127.0.0.1:3001/metrics')
    expect(banner).not.toContain('0.0.0.0')
  })
})

describe('the banner’s console line', () => {
  const consoleLine = (config: ReturnType<typeof testConfig>, terminal: boolean) =>
    localModeBanner(config, 'http://127.0.0.1:3000', 'http://127.0.0.1:4010', 'http://127.0.0.1:3001', { terminal })
      .split('\n')
      .find((line) => line.trim().startsWith('console'))

  it('prints the token whole on a terminal only', () => {
    const config = testConfig({ ADMIN_TOKEN: 'a-token-of-the-operator-0123456789' })
    expect(consoleLine(config, true)).toContain('log in with the admin token: a-token-of-the-operator-0123456789')
    expect(consoleLine(config, false)).toContain('(log in with ADMIN_TOKEN)')
    expect(consoleLine(config, false)).not.toContain('a-token-of-the-operator')
  })

  it('piped, names where the token is: the local secrets file, or ADMIN_TOKEN for a token made for this run alone', () => {
    const fromFile = { ...testConfig(), adminToken: 'f'.repeat(64), adminTokenFrom: 'local-secrets' as const, localSecretsFile: '/srv/data/local-secrets.json' }
    expect(consoleLine(fromFile, false)).toContain('(log in with the admin token: adminToken in /srv/data/local-secrets.json)')
    const ofThisRun = { ...testConfig(), adminToken: 'e'.repeat(64), adminTokenFrom: 'this-process' as const }
    expect(consoleLine(ofThisRun, false)).toContain("(this run's admin token is printed on a terminal only: set ADMIN_TOKEN to log in)")
    for (const config of [fromFile, ofThisRun]) expect(consoleLine(config, false)).not.toMatch(/[ef]{64}/)
  })
})

describe('quoteForShell', () => {
  it('leaves a plain path as it is and quotes anything the shell would change', () => {
    expect(quoteForShell('/tmp/x')).toBe('/tmp/x')
    expect(quoteForShell('/srv/escrow-1/data_2,a=b@c:d+e%f')).toBe('/srv/escrow-1/data_2,a=b@c:d+e%f')
    expect(quoteForShell('/tmp/a b')).toBe(`'/tmp/a b'`)
    expect(quoteForShell(`/tmp/it's`)).toBe(`'/tmp/it'\\''s'`)
    expect(quoteForShell('~/data')).toBe(`'~/data'`)
    expect(quoteForShell('')).toBe(`''`)
  })

  it('gives a POSIX shell back every value as it was', () => {
    const values = ['/tmp/a b', `it's "here"`, '$HOME and `id` and $(id)', 'back\\slash', 'star *', '~', 'line\nfeed', `'`, '']
    for (const value of values) {
      expect(execFileSync('/bin/sh', ['-c', `printf %s ${quoteForShell(value)}`], { encoding: 'utf8' })).toBe(value)
    }
  })
})
