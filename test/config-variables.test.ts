// What the environment holds besides the variables the service reads, and where the database and the key pair come
// from. A review that forked the project found: DATABSE_URL=postgres://… (a typo) ran production on an embedded
// database of its own, logged at info; FORWARD_EVENT, AMQP_EXCHANGES, REACTION_MAX_ATTEMPT were ignored without a
// word; PARTNER_ENV=live ran on the embedded database unasked; a live key id was signed with the sandbox's secret
// (every call 401); and compose's published placeholder secrets were taken against a live platform.
import { Command } from 'commander'
import { describe, expect, it } from 'vitest'
import { registerSandboxCommand } from '../src/cli/sandbox.command.js'
import {
  ConfigError,
  embeddedDatabaseWarning,
  isLocalSandboxUrl,
  parseConfig,
  PUBLISHED_SECRETS,
  READ_VARIABLES,
  unreadVariablesOf,
} from '../src/config.js'
import { problemsOf } from './helpers/test-config.js'
import { editDistance } from '../src/unread-variables.js'

const WEBHOOK_SECRET = 'a-webhook-secret-of-enough-length-000'
const API_SECRET = 'an-api-secret-of-enough-length-0000'
/** A production configuration: a real platform, its key pair and webhook secret. */
const production = {
  PARTNER_API_BASE_URL: 'https://platform.example/',
  PARTNER_API_KEY_ID: 'pk_1',
  PARTNER_API_SECRET: API_SECRET,
  WEBHOOK_SECRETS: WEBHOOK_SECRET,
}
const POSTGRES = { DATABASE_URL: 'postgres://db.internal/escrow' }

describe('variables the service does not read', () => {
  it('counts a swap of two neighbours as one edit, and letter case as none', () => {
    expect(editDistance('DATABSE_URL', 'DATABASE_URL')).toBe(1)
    expect(editDistance('DATABASE_ULR', 'DATABASE_URL')).toBe(1)
    expect(editDistance('database_url', 'DATABASE_URL')).toBe(0)
    expect(editDistance('DATABASE_URI', 'DATABASE_URL')).toBe(1)
    expect(editDistance('HOME', 'HOST')).toBe(2)
    expect(editDistance('', 'PORT')).toBe(4)
  })

  it('names a misspelled variable with the one it is nearest to, and one under a prefix of ours without a near name', () => {
    expect(
      unreadVariablesOf({
        FORWARD_EVENT: 'trade.funded',
        AMQP_EXCHANGES: 'orders',
        REACTION_MAX_ATTEMPT: '3',
        DATABSE_URL: 'postgres://db/escrow',
        WEBHOOK_SECRET: 'x',
        database_url: 'postgres://db/escrow',
        LOG_FORMAT: 'json',
        PARTNER_LIVE_API_KEY: 'pk_live_1',
      }),
    ).toEqual([
      { name: 'AMQP_EXCHANGES', nearest: 'AMQP_EXCHANGE' },
      { name: 'DATABSE_URL', nearest: 'DATABASE_URL' },
      { name: 'FORWARD_EVENT', nearest: 'FORWARD_EVENTS' },
      { name: 'LOG_FORMAT' },
      { name: 'PARTNER_LIVE_API_KEY', nearest: 'PARTNER_LIVE_API_KEY_ID' },
      { name: 'REACTION_MAX_ATTEMPT', nearest: 'REACTION_MAX_ATTEMPTS' },
      { name: 'WEBHOOK_SECRET', nearest: 'WEBHOOK_SECRETS' },
      { name: 'database_url', nearest: 'DATABASE_URL' },
    ])
  })

  it("leaves alone the variables it reads, other programs' variables, and a variable set empty", () => {
    expect(
      unreadVariablesOf({
        PATH: '/usr/bin',
        HOME: '/root',
        HOSTNAME: 'box',
        NODE_OPTIONS: '--max-old-space-size=512',
        NODE_ENV: 'production',
        npm_config_cache: '/root/.npm',
        npm_lifecycle_event: 'start',
        npm_package_name: 'partner-escrow',
        INIT_CWD: '/work',
        COLOR: '1',
        EDITOR: 'vi',
        FTP_PROXY: 'http://proxy:3128',
        ALL_PROXY: 'http://proxy:3128',
        MAX_JOBS: '4',
        APP_DATABASE_URL: 'postgres://db/app',
        PGUSER: 'root',
        CI: 'true',
        // read: the per-environment key pairs and the sandbox command's options
        PARTNER_LIVE_API_SECRET: 'x',
        PARTNER_SANDBOX_API_BASE_URL: 'http://127.0.0.1:4010',
        SANDBOX_HOST: '0.0.0.0',
        SANDBOX_WEBHOOK_URL: 'http://127.0.0.1:3000/webhooks/partner',
        http_proxy: 'http://proxy:3128',
        DATABASE_URL: 'postgres://db/escrow',
        // set empty: nothing is set
        FORWARD_EVENT: '',
        DATABSE_URL: '',
      }),
    ).toEqual([])
  })

  it("knows every variable the `sandbox` command's options read", () => {
    const sandbox = new Command('sandbox')
    registerSandboxCommand(sandbox)
    const variables = sandbox.options.map((option) => option.envVar).filter((name) => name !== undefined)
    expect(variables.length).toBeGreaterThan(10)
    expect(variables.filter((name) => !READ_VARIABLES.includes(name))).toEqual([])
  })

  it('keeps them in the configuration, for `serve` to warn of, by name alone', () => {
    const config = parseConfig({ ...production, ...POSTGRES, FORWARD_EVENT: 'trade.funded', PARTNER_SOMETHING: 'value-not-to-show' })
    expect(config.unreadVariables).toEqual([{ name: 'FORWARD_EVENT', nearest: 'FORWARD_EVENTS' }, { name: 'PARTNER_SOMETHING' }])
    expect(JSON.stringify(config.unreadVariables)).not.toContain('value-not-to-show')
  })
})

describe('a near miss of DATABASE_URL', () => {
  const refusal = (name: string) =>
    `${name}: is not a variable the service reads: did you mean DATABASE_URL? Without DATABASE_URL the service would run on ` +
    'an embedded database of its own in DATA_DIR (each replica on its own); rename it to DATABASE_URL, or unset it'

  it('is refused while DATABASE_URL is unset, in production and in local mode alike, naming it and never its value', () => {
    const url = 'postgres://partner:hunter2-password@db.internal:5432/escrow'
    expect(problemsOf({ ...production, DATABSE_URL: url })).toEqual([refusal('DATABSE_URL')])
    expect(problemsOf({ DATABASE_URI: url })).toEqual([refusal('DATABASE_URI')])
    expect(problemsOf({ ...production, database_url: url, DATABASE_URL: '' })).toEqual([refusal('database_url')])
    expect(problemsOf({ ...production, DATABSE_URL: url }).join('\n')).not.toContain('hunter2')
  })

  it('is a warning only beside a DATABASE_URL, or when further from it', () => {
    expect(parseConfig({ ...production, ...POSTGRES, DATABSE_URL: 'postgres://other/db' }).unreadVariables).toEqual([{ name: 'DATABSE_URL', nearest: 'DATABASE_URL' }])
    // three edits: DATABASE_URL_RO is a name of another program's as likely as a typo of ours
    expect(parseConfig({ ...production, DATA_DIR: 'memory://', DATABASE_URL_RO: 'postgres://replica/db' }).unreadVariables).toEqual([
      { name: 'DATABASE_URL_RO', nearest: 'DATABASE_URL' },
    ])
  })
})

describe('the embedded database', () => {
  it('is refused under PARTNER_ENV=live unless DATABASE_EMBEDDED=true says it is meant', () => {
    const live = { ...production, PARTNER_ENV: 'live' }
    expect(problemsOf(live)).toEqual([
      'DATABASE_URL: required when PARTNER_ENV=live: without it the service runs on an embedded database of its own in DATA_DIR, ' +
        'and several replicas each on their own (deduplication, claims and exactly-once hold per database); set DATABASE_URL ' +
        '(the same for every replica), or DATABASE_EMBEDDED=true to run one instance on the embedded database on purpose',
    ])
    expect(parseConfig({ ...live, ...POSTGRES }).databaseUrl).toBe(POSTGRES.DATABASE_URL)
    expect(parseConfig({ ...live, DATABASE_EMBEDDED: 'true', DATA_DIR: 'memory://' }).databaseEmbedded).toBe(true)
    // a throwaway database, named as such
    expect(parseConfig({ ...live, DATA_DIR: 'memory://' }).databaseUrl).toBeUndefined()
  })

  it('is said outright: DATABASE_EMBEDDED=true with a DATABASE_URL, or false without one, is refused', () => {
    expect(problemsOf({ ...production, ...POSTGRES, DATABASE_EMBEDDED: 'true' })).toEqual(['DATABASE_EMBEDDED: is true but DATABASE_URL is set: set one or the other'])
    expect(problemsOf({ DATABASE_EMBEDDED: 'false' })).toEqual(['DATABASE_URL: required when DATABASE_EMBEDDED=false'])
    expect(problemsOf({ DATABASE_EMBEDDED: 'maybe' })[0]).toMatch(/^DATABASE_EMBEDDED: /)
  })

  it('is warned of against a real platform, and not in local mode, against a local sandbox or where it is meant', () => {
    const warning = embeddedDatabaseWarning(parseConfig({ ...production, DATA_DIR: 'memory://' }))
    expect(warning).toMatch(/^DATABASE_URL is not set: this service runs on an embedded database of its own in DATA_DIR, against a real platform\. Several replicas must share one DATABASE_URL/)
    expect(embeddedDatabaseWarning(parseConfig({ ...production, PARTNER_ENV: 'live', DATA_DIR: 'memory://' }))).toBe(warning)
    for (const env of [
      { DATA_DIR: 'memory://' },
      { ...production, PARTNER_API_BASE_URL: 'http://127.0.0.1:4010', DATA_DIR: 'memory://' },
      { ...production, PARTNER_API_BASE_URL: 'http://sandbox:4010', DATA_DIR: 'memory://' },
      { ...production, ...POSTGRES },
      { ...production, DATABASE_EMBEDDED: 'true', DATA_DIR: 'memory://' },
    ]) {
      expect(embeddedDatabaseWarning(parseConfig(env)), JSON.stringify(env)).toBeUndefined()
    }
  })

  it('takes loopback and compose’s sandbox service as a local sandbox, anything else as a real platform', () => {
    for (const url of ['http://127.0.0.1:4010', 'http://127.0.0.2', 'http://localhost:4010', 'http://[::1]:4010', 'http://sandbox:4010', 'http://api.localhost'])
      expect(isLocalSandboxUrl(url), url).toBe(true)
    for (const url of ['https://platform.example', 'https://sandbox.platform.example', 'http://10.0.0.5:4010', 'http://127.0.0.1.nip.io'])
      expect(isLocalSandboxUrl(url), url).toBe(false)
  })
})

describe('a key pair half given under PARTNER_ENV’s prefix', () => {
  it('is refused naming the half missing, never completed from PARTNER_API_* (another key’s)', () => {
    const live = { ...production, ...POSTGRES, PARTNER_ENV: 'live', PARTNER_LIVE_API_BASE_URL: 'https://live.platform.example/' }
    expect(problemsOf({ ...live, PARTNER_LIVE_API_KEY_ID: 'pk_live_1' })).toEqual([
      'PARTNER_LIVE_API_SECRET: required when PARTNER_LIVE_API_KEY_ID is set: PARTNER_ENV=live takes the key id and the secret from the same prefix, ' +
        "never one of them from PARTNER_API_SECRET (another key's: the platform would refuse every call 401)",
    ])
    expect(problemsOf({ ...live, PARTNER_LIVE_API_SECRET: 'the-live-secret-of-enough-length-00' })).toEqual([
      'PARTNER_LIVE_API_KEY_ID: required when PARTNER_LIVE_API_SECRET is set: PARTNER_ENV=live takes the key id and the secret from the same prefix, ' +
        "never one of them from PARTNER_API_KEY_ID (another key's: the platform would refuse every call 401)",
    ])
    // neither unprefixed half there: said once, by the one missing
    const { PARTNER_API_SECRET: _secret, ...withoutSecret } = live
    expect(problemsOf({ ...withoutSecret, PARTNER_LIVE_API_KEY_ID: 'pk_live_1' })).toHaveLength(1)
    expect(problemsOf({ ...production, PARTNER_SANDBOX_API_KEY_ID: 'pk_sandbox_2' })[0]).toMatch(/^PARTNER_SANDBOX_API_SECRET: required when PARTNER_SANDBOX_API_KEY_ID is set: PARTNER_ENV=sandbox/)
    // whole, it is used
    expect(parseConfig({ ...live, PARTNER_LIVE_API_KEY_ID: 'pk_live_1', PARTNER_LIVE_API_SECRET: 'the-live-secret-of-enough-length-00' }).partner).toMatchObject({
      keyId: 'pk_live_1',
      secret: 'the-live-secret-of-enough-length-00',
    })
  })
})

describe('a secret this repository publishes', () => {
  const why =
    "is a placeholder this repository publishes (compose.yaml's, the demo's), which anyone can sign with; give the platform's own " +
    "(under docker compose, a misspelled variable name in .env leaves compose.yaml's placeholder in force)"

  it('is refused against a real platform or under PARTNER_ENV=live, by the name of the variable holding it', () => {
    for (const secret of PUBLISHED_SECRETS) {
      expect(problemsOf({ ...production, ...POSTGRES, WEBHOOK_SECRETS: secret }), secret).toEqual([`WEBHOOK_SECRETS: ${why}`])
      expect(problemsOf({ ...production, ...POSTGRES, PARTNER_API_SECRET: secret }), secret).toEqual([`PARTNER_API_SECRET: ${why}`])
    }
    // compose's replicas with a live .env whose WEBHOOK_SECRETS is misspelled: its placeholder stays
    const composeLive = {
      ...POSTGRES,
      PARTNER_ENV: 'live',
      PARTNER_API_BASE_URL: 'http://sandbox:4010',
      PARTNER_API_KEY_ID: 'pk_compose_sandbox',
      PARTNER_API_SECRET: 'compose-sandbox-api-secret-not-for-production',
      WEBHOOK_SECRETS: 'compose-sandbox-webhook-secret-not-for-production',
      PARTNER_LIVE_API_BASE_URL: 'https://platform.example/',
      PARTNER_LIVE_API_KEY_ID: 'pk_live_1',
      PARTNER_LIVE_API_SECRET: 'the-live-secret-of-enough-length-00',
      WEBHOOK_SECRET: 'the-live-webhook-secret-000000000000',
    }
    expect(problemsOf(composeLive)).toEqual([`WEBHOOK_SECRETS: ${why}`])
    expect(problemsOf({ ...production, ...POSTGRES, WEBHOOK_SECRETS: `${WEBHOOK_SECRET},${PUBLISHED_SECRETS[1]}` })).toEqual([`WEBHOOK_SECRETS: secret #2 ${why}`])
    expect(problemsOf({ ...production, ...POSTGRES, ADMIN_TOKEN: PUBLISHED_SECRETS[0]! })).toEqual([`ADMIN_TOKEN: ${why}`])
  })

  it('is taken against a sandbox on this machine or compose’s, where it is meant', () => {
    for (const baseUrl of ['http://sandbox:4010', 'http://127.0.0.1:4010']) {
      const config = parseConfig({
        ...POSTGRES,
        PARTNER_API_BASE_URL: baseUrl,
        PARTNER_API_KEY_ID: 'pk_compose_sandbox',
        PARTNER_API_SECRET: 'compose-sandbox-api-secret-not-for-production',
        WEBHOOK_SECRETS: 'compose-sandbox-webhook-secret-not-for-production',
      })
      expect(config.webhook.secrets).toEqual(['compose-sandbox-webhook-secret-not-for-production'])
    }
  })
})

describe('a configuration error', () => {
  it('ends its first line in the code [config_invalid], each problem on a line of its own', () => {
    let caught: unknown
    try {
      parseConfig({ PORT: 'eighty', LOG_LEVEL: 'loud' })
    } catch (error) {
      caught = error
    }
    expect(caught).toBeInstanceOf(ConfigError)
    expect((caught as ConfigError).code).toBe('config_invalid')
    expect((caught as ConfigError).message.split('\n')).toEqual([
      'Invalid configuration [config_invalid]',
      '  - PORT: must be a whole number in decimal digits (0-9)',
      expect.stringMatching(/^ {2}- LOG_LEVEL: /),
    ])
  })
})
