// What the compiled `serve` does with an environment a partner's engineer got slightly wrong: a misspelled
// DATABASE_URL ran production on an embedded database of its own (logged at info), other misspelled variables were
// ignored without a word, PARTNER_ENV=live took a half-given live key pair completed with the sandbox's secret, and
// compose's published placeholder secrets were taken against a live platform. Every refusal exits 2 with the code
// [config_invalid], and no value is ever printed.
import { once } from 'node:events'
import { mkdtempSync, readdirSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { type CliResult, jsonLogLines, runCli, signalAndClose, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const WEBHOOK_SECRET = 'a-webhook-secret-of-enough-length-000'
const API_SECRET = 'an-api-secret-of-enough-length-0000'
/** A production configuration: a real platform, its key pair and webhook secret, listeners on free ports, no poller. */
const production = {
  PORT: '0',
  ADMIN_PORT: '0',
  POLL_ENABLED: 'false',
  PARTNER_API_BASE_URL: 'https://platform.example',
  PARTNER_API_KEY_ID: 'pk_1',
  PARTNER_API_SECRET: API_SECRET,
  WEBHOOK_SECRETS: WEBHOOK_SECRET,
}
// refused before it is ever connected to
const POSTGRES = { DATABASE_URL: 'postgres://127.0.0.1:9/unused' }

/**
 * `serve` run to its exit. A refusal writes to stderr alone; one that logs a line instead took the configuration (the
 * fault: it ran, or waits for its database) and is stopped at once, `started` true, rather than left running for the
 * test's timeout.
 */
async function serveOnce(env: Record<string, string>): Promise<CliResult & { started: boolean }> {
  const child = spawnCli(['serve'], env)
  let stdout = ''
  let stderr = ''
  let started = false
  child.stderr!.on('data', (chunk) => (stderr += chunk))
  child.stdout!.on('data', (chunk) => {
    stdout += chunk
    if (!started && stdout.includes('\n')) {
      started = true
      child.kill('SIGTERM')
    }
  })
  const [code] = (await once(child, 'close')) as [number | null]
  return { code, stdout, stderr, started }
}

const directories: string[] = []
afterAll(() => {
  for (const directory of directories) rmSync(directory, { recursive: true, force: true })
})
function emptyDataDir(): string {
  const directory = mkdtempSync(path.join(tmpdir(), 'config-variables-'))
  directories.push(directory)
  return directory
}

describe('`serve` refuses, exit 2 with [config_invalid]', () => {
  it('a near miss of DATABASE_URL while DATABASE_URL is unset, naming it and never its value, before anything is made in DATA_DIR', async () => {
    const dataDir = emptyDataDir()
    const result = await serveOnce({ ...production, DATA_DIR: dataDir, DATABSE_URL: 'postgres://partner:hunter2-db-password@db.internal/escrow' })
    expect(result).toMatchObject({ started: false, code: 2, stdout: '' })
    expect(result.stderr).toBe(
      'Invalid configuration [config_invalid]\n' +
        '  - DATABSE_URL: is not a variable the service reads: did you mean DATABASE_URL? Without DATABASE_URL the service would run on ' +
        'an embedded database of its own in DATA_DIR (each replica on its own); rename it to DATABASE_URL, or unset it\n',
    )
    expect(readdirSync(dataDir)).toEqual([])
  })

  it('PARTNER_ENV=live with a live key id and no live secret (the sandbox’s PARTNER_API_SECRET beside it)', async () => {
    const result = await serveOnce({
        ...production,
        ...POSTGRES,
        DATA_DIR: emptyDataDir(),
        PARTNER_ENV: 'live',
        PARTNER_LIVE_API_BASE_URL: 'https://live.platform.example',
        PARTNER_LIVE_API_KEY_ID: 'pk_live_1',
    })
    expect(result).toMatchObject({ started: false, code: 2 })
    expect(result.stderr).toMatch(/^Invalid configuration \[config_invalid\]\n {2}- PARTNER_LIVE_API_SECRET: required when PARTNER_LIVE_API_KEY_ID is set/)
    expect(result.stderr).not.toContain(API_SECRET)
  })

  it('PARTNER_ENV=live with compose’s placeholder webhook secret, left in force by a misspelled WEBHOOK_SECRET in .env', async () => {
    const liveWebhookSecret = 'the-live-webhook-secret-000000000000'
    const result = await serveOnce({
        ...POSTGRES,
        PORT: '0',
        ADMIN_PORT: '0',
        DATA_DIR: emptyDataDir(),
        // what compose.yaml's replicas get from a live .env with the typo
        PARTNER_ENV: 'live',
        PARTNER_API_BASE_URL: 'http://sandbox:4010',
        PARTNER_API_KEY_ID: 'pk_compose_sandbox',
        PARTNER_API_SECRET: 'compose-sandbox-api-secret-not-for-production',
        WEBHOOK_SECRETS: 'compose-sandbox-webhook-secret-not-for-production',
        PARTNER_LIVE_API_BASE_URL: 'https://platform.example',
        PARTNER_LIVE_API_KEY_ID: 'pk_live_1',
        PARTNER_LIVE_API_SECRET: 'the-live-api-secret-of-enough-length',
        WEBHOOK_SECRET: liveWebhookSecret,
    })
    expect(result).toMatchObject({ started: false, code: 2 })
    expect(result.stderr).toMatch(/^Invalid configuration \[config_invalid\]\n {2}- WEBHOOK_SECRETS: is a placeholder this repository publishes/)
    expect(result.stderr).not.toContain(liveWebhookSecret)
  })

  // it started cleanly, and every publish then failed amqp_unreachable ("Field 'heartbeat' is the wrong type"), the
  // broker up, retried for a day; a forward URL of port 0 and a bad forward secret alike, each named apart
  it('an AMQP_URL query option amqplib cannot send, a FORWARD_URL of port 0, a FORWARD_SECRET of URL-safe base64; never a value', async () => {
    const password = 'amqp-Passw0rd-never-shown'
    const result = await serveOnce({
      ...production,
      ...POSTGRES,
      DATA_DIR: emptyDataDir(),
      AMQP_URL: `amqp://guest:${password}@127.0.0.1:5672/%2f?heartbeat=abc`,
      AMQP_EXCHANGE: 'x',
      FORWARD_URL: 'http://127.0.0.1:0/x',
      FORWARD_SECRET: `whsec_${Buffer.alloc(32, 0xfb).toString('base64url')}`,
    })
    expect(result).toMatchObject({ started: false, code: 2, stdout: '' })
    expect(result.stderr).toBe(
      'Invalid configuration [config_invalid]\n' +
        "  - FORWARD_URL: must not have port 0, where nothing can be reached; give the receiver's port (or none: 80, 443)\n" +
        '  - AMQP_URL: its query option heartbeat must be a whole number of seconds from 0 to 65535 (0: no heartbeats)\n' +
        '  - FORWARD_SECRET: the secret is URL-safe base64 after whsec_ (- or _): write it in standard base64 (+ and /) (each is whsec_ followed by ' +
        'the base64 of at least 24 random bytes); make one with: echo "whsec_$(openssl rand -base64 32)"\n',
    )
    expect(result.stderr).not.toContain(password)
  })

  it('PARTNER_ENV=live without DATABASE_URL', async () => {
    const dataDir = emptyDataDir()
    const result = await serveOnce({ ...production, DATA_DIR: dataDir, PARTNER_ENV: 'live' })
    expect(result).toMatchObject({ started: false, code: 2 })
    expect(result.stderr).toMatch(/^Invalid configuration \[config_invalid\]\n {2}- DATABASE_URL: required when PARTNER_ENV=live: /)
    expect(readdirSync(dataDir)).toEqual([])
  })

  it('and a command alike', async () => {
    const result = await runCli(['orders', 'list'], { DATA_DIR: emptyDataDir(), DATABASE_URI: 'postgres://127.0.0.1:9/unused' })
    expect(result.code).toBe(2)
    expect(result.stderr).toMatch(/^Invalid configuration \[config_invalid\]\n {2}- DATABASE_URI: is not a variable the service reads: did you mean DATABASE_URL\?/)
  })
})

describe('a command warns on stderr', () => {
  it('of each misspelled variable, with the name it is nearest to, never a value; the command still runs', async () => {
    const result = await runCli(
      ['orders', 'list'],
      { DATA_DIR: migratedDataDir('config-variables-command-'), PRUNE_BATCH_SIZ: 'value-not-to-show', PARTNER_SOMETHING: 'value-not-to-show' },
    )
    expect(result.code).toBe(0)
    expect(result.stderr).toBe(
      'Warning: PARTNER_SOMETHING is set but is not a variable the service reads\n' +
        'Warning: PRUNE_BATCH_SIZ is set but is not a variable the service reads: did you mean PRUNE_BATCH_SIZE?\n',
    )
    expect(result.stdout + result.stderr).not.toContain('value-not-to-show')
  })
})

describe('`serve` warns at start', () => {
  it('of each misspelled variable, with the name it is nearest to, and of the embedded database against a real platform; never a value', async () => {
    const value = (name: string) => `value-of-${name.toLowerCase()}-not-to-show`
    const misspelled = ['FORWARD_EVENT', 'AMQP_EXCHANGES', 'REACTION_MAX_ATTEMPT', 'PARTNER_SOMETHING']
    const dataDir = migratedDataDir('config-variables-data-')
    const child = spawnCli(
      ['serve'],
      {
        ...production,
        DATA_DIR: dataDir,
        ...Object.fromEntries(misspelled.map((name) => [name, value(name)])),
        // not ours: never named
        npm_config_cache: value('npm_config_cache'),
        OTHER_TOOL_SETTING: value('OTHER_TOOL_SETTING'),
        FTP_PROXY: 'http://proxy.internal:3128',
      },
    )
    let output = ''
    child.stdout!.on('data', (chunk) => (output += chunk))
    child.stderr!.on('data', (chunk) => (output += chunk))
    const lines = jsonLogLines(child)
    try {
      await waitForLogLine(child, 'service listening')
    } finally {
      await signalAndClose(child)
    }
    const warned = lines.filter((line) => line.level === 40)
    expect(warned.filter((line) => line.variable !== undefined).map(({ variable, didYouMean, msg }) => ({ variable, didYouMean, msg }))).toEqual([
      { variable: 'AMQP_EXCHANGES', didYouMean: 'AMQP_EXCHANGE', msg: 'AMQP_EXCHANGES is set but is not a variable the service reads: did you mean AMQP_EXCHANGE?' },
      { variable: 'FORWARD_EVENT', didYouMean: 'FORWARD_EVENTS', msg: 'FORWARD_EVENT is set but is not a variable the service reads: did you mean FORWARD_EVENTS?' },
      { variable: 'PARTNER_SOMETHING', didYouMean: undefined, msg: 'PARTNER_SOMETHING is set but is not a variable the service reads' },
      {
        variable: 'REACTION_MAX_ATTEMPT',
        didYouMean: 'REACTION_MAX_ATTEMPTS',
        msg: 'REACTION_MAX_ATTEMPT is set but is not a variable the service reads: did you mean REACTION_MAX_ATTEMPTS?',
      },
    ])
    const embedded = warned.find((line) => String(line.msg).startsWith('DATABASE_URL is not set'))
    expect(embedded).toMatchObject({ dataDir })
    expect(String(embedded?.msg)).toContain('Several replicas must share one DATABASE_URL')
    expect(output).not.toContain('-not-to-show')
  })

  it('nothing new in local mode, however much else the environment holds (npm start’s npm_* variables)', async () => {
    const child = spawnCli(
      ['serve'],
      {
        DATA_DIR: migratedDataDir('config-variables-local-'),
        PORT: '0',
        ADMIN_PORT: '0',
        SANDBOX_PORT: '0',
        npm_lifecycle_event: 'start',
        npm_package_name: 'partner-escrow',
        npm_config_cache: '/root/.npm',
        INIT_CWD: '/work',
        NODE_ENV: 'development',
      },
    )
    let output = ''
    child.stdout!.on('data', (chunk) => (output += chunk))
    const lines = jsonLogLines(child)
    try {
      await waitForLogLine(child, 'service listening')
      // the banner comes after the line
      while (!output.includes('lost and repeated webhooks')) await new Promise((resolve) => setTimeout(resolve, 20))
    } finally {
      await signalAndClose(child)
    }
    expect(output).toContain('LOCAL SANDBOX MODE')
    expect(lines.filter((line) => Number(line.level) >= 40)).toEqual([])
  })
})
