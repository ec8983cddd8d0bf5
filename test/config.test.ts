import { mkdtempSync, readdirSync, readFileSync, statSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { configSecrets, OPERATOR_LISTENER_PATHS, parseConfig } from '../src/config.js'
import { problemsOf } from './helpers/test-config.js'
import { CONSOLE_PATH } from '../src/console/console-views.js'
import { LOCAL_CLI_PATH } from '../src/local/running-service.js'
import { createLogger } from '../src/logger.js'

const LONG_SECRET = 'a-webhook-secret-of-enough-length-000'
// PARTNER_ENV=live runs on Postgres (or DATABASE_EMBEDDED=true): parseConfig only reads the URL
const LIVE_DATABASE = { DATABASE_URL: 'postgres://db/escrow' }
const remoteEnv = {
  PARTNER_API_BASE_URL: 'https://platform.example/',
  PARTNER_API_KEY_ID: 'pk_live_1',
  PARTNER_API_SECRET: 'an-api-secret-of-enough-length-0000',
  WEBHOOK_SECRETS: LONG_SECRET,
}

describe('configuration', () => {
  it('refuses what an env file slips into a value (a carriage return, a control character, quotes), naming the variable and never the value', () => {
    const secret = 'an-api-secret-of-enough-length-0000'
    const problems = problemsOf({
      ...remoteEnv,
      PARTNER_API_SECRET: `${secret}\r`,
      WEBHOOK_SECRETS: `"${LONG_SECRET}"`,
      PARTNER_LIVE_API_KEY_ID: "'pk_live_2'",
      DATABASE_URL: 'postgres://db/escrow\r',
      LOG_LEVEL: 'info\t',
    })
    expect(problems).toEqual([
      'DATABASE_URL: holds a carriage return (an env file saved with Windows line endings?)',
      'LOG_LEVEL: holds a control character (a tab, a line break)',
      'WEBHOOK_SECRETS: is wrapped in quotes, which are kept as part of the value (docker run --env-file and systemd keep them): remove them',
      'PARTNER_API_SECRET: holds a carriage return (an env file saved with Windows line endings?)',
      "PARTNER_LIVE_API_KEY_ID: is wrapped in quotes, which are kept as part of the value (docker run --env-file and systemd keep them): remove them",
    ])
    expect(problems.join('\n')).not.toContain(secret)
    // found from outside: a quote opened and never closed (an env file's typo) was taken, and every platform call then refused 401
    const halfQuoted = problemsOf({ ...remoteEnv, PARTNER_API_SECRET: `"${secret}`, WEBHOOK_SECRETS: `'"${LONG_SECRET}`, ADMIN_TOKEN: `'${secret}` })
    expect(halfQuoted).toEqual(
      ['WEBHOOK_SECRETS', 'PARTNER_API_SECRET', 'ADMIN_TOKEN'].map(
        (name) => `${name}: begins with a quote that is never closed, which is kept as part of the value: remove it`,
      ),
    )
    expect(halfQuoted.join('\n')).not.toContain(secret)
    // the same values without what slipped in are taken
    expect(parseConfig({ ...remoteEnv, PARTNER_API_SECRET: secret, WEBHOOK_SECRETS: LONG_SECRET }).partner.secret).toBe(secret)
  })

  // found from outside: a secret with a trailing space started cleanly and every platform call was then refused 401;
  // a DATA_DIR with one opened a new, empty database; a file saved with a BOM lost its first variable
  it('refuses a value that begins or ends with a space, and a variable whose name carries a byte-order mark', () => {
    const secret = 'an-api-secret-of-enough-length-0000'
    const problems = problemsOf({ ...remoteEnv, PARTNER_API_SECRET: `${secret} `, DATA_DIR: ' ', ADMIN_TOKEN: ' an-admin-token-of-enough-length-000' })
    expect(problems).toEqual([
      'DATA_DIR: begins or ends with a space, which is kept as part of the value: remove it',
      'PARTNER_API_SECRET: begins or ends with a space, which is kept as part of the value: remove it',
      'ADMIN_TOKEN: begins or ends with a space, which is kept as part of the value: remove it',
    ])
    // beside a variable refused for what it is, named once each
    expect(problemsOf({ ...remoteEnv, PORT: 'eighty', DATA_DIR: '/data ' })).toEqual([
      'PORT: must be a whole number in decimal digits (0-9)',
      'DATA_DIR: begins or ends with a space, which is kept as part of the value: remove it',
    ])
    expect(problemsOf({ ...remoteEnv, '\uFEFFDATABASE_URL': 'postgres://db/escrow' })).toEqual([
      'DATABASE_URL: is not set: the env file it is in starts with a byte-order mark (BOM), which is read as part of its first variable\'s name; save the file as UTF-8 without a BOM',
    ])
    expect(problems.join('\n')).not.toContain(secret)
    // a path's rule said whole: these start with / too
    for (const path of ['/wébhook', '/a?b=1', '/a#b']) {
      expect(problemsOf({ ...remoteEnv, WEBHOOK_PATH: path }), path).toEqual([
        'WEBHOOK_PATH: must be a path starting with / and holding only ASCII letters, digits, _, -, . and / (no query, fragment or space)',
      ])
    }
    // a list's entries are trimmed: a space there means nothing
    expect(parseConfig({ ...remoteEnv, WEBHOOK_SECRETS: ` ${LONG_SECRET} , `, FORWARD_EVENTS: ' trade.funded ' }).webhook.secrets).toEqual([LONG_SECRET])
  })

  it('names every bad variable in one error', () => {
    const problems = problemsOf({
      PORT: 'eighty',
      POLL_CONCURRENCY: '0',
      WEBHOOK_BODY_LIMIT: 'huge',
      PARTNER_ENV: 'staging',
      LOG_LEVEL: 'loud',
      DATABASE_URL: 'mysql://nope',
      WEBHOOK_BATCH_MAX: '0',
      WEBHOOK_BATCH_STATEMENTS: '0',
      WEBHOOK_SEEN_CACHE: '-1',
    })
    for (const name of [
      'WEBHOOK_BATCH_MAX',
      'WEBHOOK_BATCH_STATEMENTS',
      'WEBHOOK_SEEN_CACHE',
      'PORT',
      'POLL_CONCURRENCY',
      'WEBHOOK_BODY_LIMIT',
      'PARTNER_ENV',
      'LOG_LEVEL',
      'DATABASE_URL',
    ]) {
      expect(
        problems.some((problem) => problem.startsWith(`${name}:`)),
        `${name} is named`,
      ).toBe(true)
    }
  })

  it('starts in local mode with no environment at all, generating its secrets once in DATA_DIR', () => {
    const dataDir = mkdtempSync(path.join(tmpdir(), 'config-'))
    const first = parseConfig({ DATA_DIR: dataDir })
    // found from outside: every later start wrote (and removed) a file it did not need, and on a full disk exited on a
    // bare ENOSPC, leaving the file behind: the secrets are read without a write into DATA_DIR
    const written = statSync(dataDir, { bigint: true }).mtimeNs
    const second = parseConfig({ DATA_DIR: dataDir })
    expect(statSync(dataDir, { bigint: true }).mtimeNs).toBe(written)
    expect(readdirSync(dataDir)).toEqual(['local-secrets.json'])

    expect(first.partner.mode).toBe('local')
    expect(first.port).toBe(3000)
    expect(first.host).toBe('127.0.0.1')
    expect(first.webhook.path).toBe('/webhooks/partner')
    expect(first.webhook.bodyLimitBytes).toBe(256 * 1024)
    expect(first.localSecretsFile).toBe(path.join(dataDir, 'local-secrets.json'))
    expect(first.webhook.secrets[0]!.length).toBeGreaterThanOrEqual(32)
    expect(second.webhook.secrets).toEqual(first.webhook.secrets)
    expect(second.partner.secret).toBe(first.partner.secret)
    expect(statSync(first.localSecretsFile!).mode & 0o777).toBe(0o600)
    expect(JSON.parse(readFileSync(first.localSecretsFile!, 'utf8')).webhookSecret).toBe(
      first.webhook.secrets[0],
    )
  })

  it('keeps an in-memory database\'s local secrets in memory: no file, no `memory:` directory', () => {
    const cwd = process.cwd()
    const workingDir = mkdtempSync(path.join(tmpdir(), 'config-memory-'))
    process.chdir(workingDir)
    try {
      const config = parseConfig({ DATA_DIR: 'memory://' })
      expect(config.partner.mode).toBe('local')
      expect(config.localSecretsFile).toBeUndefined()
      expect(config.adminTokenFrom).toBe('this-process')
      expect(config.webhook.secrets[0]!.length).toBeGreaterThanOrEqual(32)
      expect(readdirSync(workingDir)).toEqual([])
    } finally {
      process.chdir(cwd)
    }
  })

  it('requires every secret once a real platform is configured', () => {
    const problems = problemsOf({ PARTNER_API_BASE_URL: 'https://platform.example/' })
    expect(problems).toEqual([
      'WEBHOOK_SECRETS: required when PARTNER_API_BASE_URL is set',
      'PARTNER_API_KEY_ID: required when PARTNER_API_BASE_URL is set',
      'PARTNER_API_SECRET: required when PARTNER_API_BASE_URL is set',
    ])
  })

  // the local banner prints the sandbox as …/api/partner/v1/: pasted whole, every call went to
  // /api/partner/v1/api/partner/v1/… and was refused 404
  it('refuses a base URL that already ends in /api/partner/v1, naming the one to give', () => {
    for (const [given, root] of [
      ['http://127.0.0.1:4110/api/partner/v1/', 'http://127.0.0.1:4110'],
      ['https://gw.example/partner/api/partner/v1', 'https://gw.example/partner'],
      // closing slashes doubled: the guard passed it, and calls went to /api/partner/v1/api/partner/v1/…
      ['http://127.0.0.1:4110/api/partner/v1//', 'http://127.0.0.1:4110'],
      ['http://127.0.0.1:4110/api//partner/v1', 'http://127.0.0.1:4110'],
      ['https://gw.example/partner/API/Partner/V1', 'https://gw.example/partner'],
    ]) {
      expect(problemsOf({ ...remoteEnv, PARTNER_API_BASE_URL: given! })).toEqual([
        `PARTNER_API_BASE_URL: give the platform's base URL without /api/partner/v1 (the client adds it): ${root}`,
      ])
    }
    // a prefix of the platform's own is kept
    expect(parseConfig({ ...remoteEnv, PARTNER_API_BASE_URL: 'https://gw.example/partner/' }).partner.baseUrl).toBe('https://gw.example/partner/')
  })

  // the URL parser takes port 0 (and :00): every call went out to nothing and failed as the platform unreachable
  it('refuses a PARTNER_API_BASE_URL of port 0, naming the form and never the URL', () => {
    for (const given of ['http://127.0.0.1:0', 'https://gw.example:00/partner/']) {
      expect(problemsOf({ ...remoteEnv, PARTNER_API_BASE_URL: given }), given).toEqual([
        "PARTNER_API_BASE_URL: must not have port 0, where nothing can be reached; give the platform's port (or none: 80, 443)",
      ])
    }
    expect(parseConfig({ ...remoteEnv, PARTNER_API_BASE_URL: 'http://127.0.0.1:10' }).partner.baseUrl).toBe('http://127.0.0.1:10')
  })

  // the client sends to the origin and path alone: a user and password, a query string and a fragment were dropped
  // without a word, and a refusal quoted the URL with its password
  it('refuses a base URL with a user or password, a query string or a fragment, never quoting it', () => {
    const password = 'S3cr3tPassw0rd'
    const problems = problemsOf({ ...remoteEnv, PARTNER_API_BASE_URL: `http://alice:${password}@127.0.0.1:4110/api/partner/v1/` })
    expect(problems).toEqual([
      'PARTNER_API_BASE_URL: must not hold a user or password (requests are signed with PARTNER_API_SECRET; they would not be sent)',
      "PARTNER_API_BASE_URL: give the platform's base URL without /api/partner/v1 (the client adds it): http://127.0.0.1:4110",
    ])
    for (const given of ['https://gw.example/gw?tenant=abc', 'https://gw.example/gw#frag', 'https://gw.example/gw?']) {
      expect(problemsOf({ ...remoteEnv, PARTNER_API_BASE_URL: given }), given).toEqual([
        "PARTNER_API_BASE_URL: must not have a query string or fragment (the client sends to the base URL's path alone)",
      ])
    }
  })

  it('refuses an empty or short webhook secret and a short API secret', () => {
    expect(problemsOf({ ...remoteEnv, WEBHOOK_SECRETS: `${LONG_SECRET},short` })).toEqual([
      'WEBHOOK_SECRETS: secret #2 is shorter than 24 characters',
    ])
    expect(problemsOf({ ...remoteEnv, WEBHOOK_SECRETS: ' , ' })).toContain(
      'WEBHOOK_SECRETS: is set but holds no secret',
    )
    expect(problemsOf({ ...remoteEnv, PARTNER_API_SECRET: 'tiny' })).toEqual([
      'PARTNER_API_SECRET: is shorter than 24 characters',
    ])
    // named as set: PARTNER_ENV picked the live pair, and the generic secret beside it is fine
    expect(problemsOf({ ...remoteEnv, ...LIVE_DATABASE, PARTNER_ENV: 'live', PARTNER_LIVE_API_KEY_ID: 'pk_live', PARTNER_LIVE_API_SECRET: 'short' })).toEqual([
      'PARTNER_LIVE_API_SECRET: is shorter than 24 characters',
    ])
    expect(problemsOf({ ...remoteEnv, PARTNER_SANDBOX_API_KEY_ID: 'pk_sandbox_2', PARTNER_SANDBOX_API_SECRET: 'short' })).toEqual([
      'PARTNER_SANDBOX_API_SECRET: is shorter than 24 characters',
    ])
    expect(problemsOf({ ...remoteEnv, PARTNER_SANDBOX_API_BASE_URL: 'not a url' })[0]).toMatch(/^PARTNER_SANDBOX_API_BASE_URL: /)
  })

  // found from outside: a console token that was also the webhook secret was taken without a word
  it("refuses an ADMIN_TOKEN that is also another role's secret, naming the role and never the value", () => {
    const token = 'one-secret-for-everything-000000'
    const forward = `whsec_${Buffer.alloc(32, 7).toString('base64')}`
    expect(problemsOf({ ...remoteEnv, WEBHOOK_SECRETS: `${LONG_SECRET},${token}`, ADMIN_TOKEN: token })).toEqual([
      "ADMIN_TOKEN: is the same as WEBHOOK_SECRETS (secret #2); the console's token must be a secret of its own (whoever logs in would hold that one too)",
    ])
    const problems = problemsOf({ ...remoteEnv, PARTNER_API_SECRET: token, SANDBOX_CONTROL_TOKEN: token, ADMIN_TOKEN: token })
    expect(problems).toEqual([
      "ADMIN_TOKEN: is the same as PARTNER_API_SECRET; the console's token must be a secret of its own (whoever logs in would hold that one too)",
      "ADMIN_TOKEN: is the same as SANDBOX_CONTROL_TOKEN; the console's token must be a secret of its own (whoever logs in would hold that one too)",
    ])
    expect(problems.join('\n')).not.toContain(token)
    expect(problemsOf({ ...remoteEnv, FORWARD_URL: 'http://127.0.0.1:9/in', FORWARD_SECRET: forward, ADMIN_TOKEN: forward })).toEqual([
      "ADMIN_TOKEN: is the same as FORWARD_SECRET; the console's token must be a secret of its own (whoever logs in would hold that one too)",
    ])
    expect(parseConfig({ ...remoteEnv, ADMIN_TOKEN: token }).adminToken).toBe(token)
  })

  it('never runs live without a platform URL', () => {
    expect(problemsOf({ PARTNER_ENV: 'live' })).toContain(
      'PARTNER_API_BASE_URL: required when PARTNER_ENV=live (live never runs the sandbox)',
    )
  })

  it('lets PARTNER_ENV pick the key pair of its environment', () => {
    const env = {
      ...remoteEnv,
      ...LIVE_DATABASE,
      PARTNER_SANDBOX_API_KEY_ID: 'pk_sandbox_9',
      PARTNER_SANDBOX_API_SECRET: 'the-sandbox-secret-of-enough-length',
      PARTNER_LIVE_API_KEY_ID: 'pk_live_9',
      PARTNER_LIVE_API_SECRET: 'the-live-secret-of-enough-length-00',
    }
    expect(parseConfig({ ...env, PARTNER_ENV: 'live' }).partner).toMatchObject({
      env: 'live',
      keyId: 'pk_live_9',
      secret: 'the-live-secret-of-enough-length-00',
    })
    expect(parseConfig({ ...env, PARTNER_ENV: 'sandbox' }).partner).toMatchObject({
      env: 'sandbox',
      keyId: 'pk_sandbox_9',
      secret: 'the-sandbox-secret-of-enough-length',
    })
    // neither prefixed variable: the unprefixed pair
    expect(parseConfig(remoteEnv).partner).toMatchObject({ keyId: remoteEnv.PARTNER_API_KEY_ID, secret: remoteEnv.PARTNER_API_SECRET })
  })

  it('parses rotated secrets, sizes and switches, and freezes the result', () => {
    const config = parseConfig({
      ...remoteEnv,
      WEBHOOK_SECRETS: `${LONG_SECRET}, ${LONG_SECRET}-next`,
      WEBHOOK_BODY_LIMIT: '1mb',
      POLL_ENABLED: 'false',
      PORT: '8080',
    })
    expect(config.webhook.secrets).toEqual([LONG_SECRET, `${LONG_SECRET}-next`])
    expect(config.webhook.bodyLimitBytes).toBe(1024 * 1024)
    expect(config.poll.enabled).toBe(false)
    expect(config.port).toBe(8080)
    expect(Object.isFrozen(config.webhook.secrets)).toBe(true)
    // group commit: two statements write deliveries at once, on Postgres as on PGlite (one connection, where a
    // second statement waits on its thread while the first one's deliveries are answered); never more than the pool
    expect(config.webhook.batchStatements).toBe(2)
    const postgres = { ...remoteEnv, DATABASE_URL: 'postgres://db/x' }
    expect(parseConfig({ ...postgres, DATABASE_POOL_SIZE: '10' }).webhook).toMatchObject({ batchMax: 100, batchStatements: 2, seenCacheSize: 100_000 })
    expect(parseConfig({ ...postgres, DATABASE_POOL_SIZE: '10', WEBHOOK_BATCH_STATEMENTS: '5' }).webhook.batchStatements).toBe(5)
    expect(parseConfig({ ...postgres, DATABASE_POOL_SIZE: '3', WEBHOOK_BATCH_STATEMENTS: '5' }).webhook.batchStatements).toBe(3)
    expect(parseConfig({ ...postgres, DATABASE_POOL_SIZE: '1' }).webhook.batchStatements).toBe(1)
    expect(parseConfig({ ...remoteEnv, WEBHOOK_BATCH_STATEMENTS: '3' }).webhook.batchStatements).toBe(3)
    expect(() => {
      ;(config as { port: number }).port = 1
    }).toThrow(TypeError)
  })

  it('reads a port or a count in decimal digits alone: 0x10, 0b11, 0o7, 1e3, +80, 80.0 or a space are refused, naming the variable', () => {
    const whole = [
      'PORT',
      'ADMIN_PORT',
      'SANDBOX_PORT',
      'MAX_CONNECTIONS',
      'DATABASE_POOL_SIZE',
      'DATABASE_STATEMENT_TIMEOUT_MS',
      'SHUTDOWN_TIMEOUT_MS',
      'SHUTDOWN_DRAIN_DELAY_MS',
      'WEBHOOK_BATCH_MAX',
      'WEBHOOK_BATCH_STATEMENTS',
      'WEBHOOK_SEEN_CACHE',
      'PARTNER_API_TIMEOUT_MS',
      'POLL_INTERVAL_S',
      'POLL_CONCURRENCY',
      'POLL_BATCH_SIZE',
      'POLL_LEASE_S',
      'EXPECTED_WEBHOOK_S',
      'STALE_AFTER_S',
      'REACTION_MAX_ATTEMPTS',
      'REACTION_CONCURRENCY',
      'REACTION_LEASE_S',
      'REACTION_BACKOFF_BASE_S',
      'REACTION_BACKOFF_CAP_S',
      'REACTION_HELD_BACK_WARN_S',
      'FORWARD_TIMEOUT_MS',
      'AMQP_TIMEOUT_MS',
      'RETENTION_DAYS',
      'DELIVERY_RETENTION_DAYS',
      'PRUNE_INTERVAL_S',
      'PRUNE_BATCH_SIZE',
    ]
    for (const name of whole) {
      for (const value of ['0x10', '0X64', '0b11', '0o7', '1e3', '+80', '-0', '80.0', ' 80', '80 ', 'Infinity']) {
        expect(problemsOf({ ...remoteEnv, [name]: value }), `${name}=${JSON.stringify(value)}`).toEqual([
          `${name}: must be a whole number in decimal digits (0-9)`,
        ])
      }
    }
    // decimal digits are read as before, a leading zero included
    const config = parseConfig({ ...remoteEnv, PORT: '16', ADMIN_PORT: '0080', SANDBOX_PORT: '4011', POLL_CONCURRENCY: '12' })
    expect([config.port, config.admin.port, config.sandbox.port, config.poll.concurrency]).toEqual([16, 80, 4011, 12])
    // past 2^53 a number is no longer exact
    expect(problemsOf({ ...remoteEnv, SHUTDOWN_TIMEOUT_MS: '9007199254740993' }).map((problem) => problem.split(':')[0])).toEqual([
      'SHUTDOWN_TIMEOUT_MS',
    ])
  })

  it('reads SANDBOX_MILESTONE_ANSWER as trade (the default) or milestone, and refuses any other value naming it', () => {
    expect(parseConfig(remoteEnv).sandbox.milestoneAnswer).toBe('trade')
    expect(parseConfig({ ...remoteEnv, SANDBOX_MILESTONE_ANSWER: 'milestone' }).sandbox.milestoneAnswer).toBe('milestone')
    expect(parseConfig({ ...remoteEnv, SANDBOX_MILESTONE_ANSWER: 'trade' }).sandbox.milestoneAnswer).toBe('trade')
    // empty, as every variable: unset (an env file's `SANDBOX_MILESTONE_ANSWER=`)
    expect(parseConfig({ ...remoteEnv, SANDBOX_MILESTONE_ANSWER: '' }).sandbox.milestoneAnswer).toBe('trade')
    for (const value of ['both', 'Milestone', 'milestones', ' milestone']) {
      expect(problemsOf({ ...remoteEnv, SANDBOX_MILESTONE_ANSWER: value }), JSON.stringify(value)).toEqual([
        'SANDBOX_MILESTONE_ANSWER: must be trade (a milestone deliver or release answers the trade record) or milestone (the milestone record)',
      ])
    }
  })

  it('puts the operator listener on 127.0.0.1:3001 by default and caps the public one', () => {
    const config = parseConfig(remoteEnv)
    expect(config.admin).toEqual({ port: 3001, host: '127.0.0.1', allowedHosts: [] })
    expect(config.limits).toEqual({ maxConnections: 1_000, maxInflightBodyBytes: 16 * 1024 * 1024, slowBodyMs: 1_000 })
    expect(config.sandbox.controlToken).toBeUndefined()
    const set = parseConfig({
      ...remoteEnv,
      ADMIN_PORT: '0',
      ADMIN_HOST: '10.0.0.5',
      ADMIN_ALLOWED_HOSTS: ' Receiver,metrics.internal,,receiver ',
      MAX_CONNECTIONS: '50',
      MAX_INFLIGHT_BODY_BYTES: '4mb',
      SLOW_BODY_MS: '0',
    })
    expect(set.admin).toEqual({ port: 0, host: '10.0.0.5', allowedHosts: ['receiver', 'metrics.internal'] })
    expect(parseConfig({ ...remoteEnv, ADMIN_ALLOWED_HOSTS: '*' }).admin.allowedHosts).toEqual(['*'])
    expect(problemsOf({ ...remoteEnv, ADMIN_ALLOWED_HOSTS: 'receiver:3001,http://ops.example,ok.example,-bad' })).toEqual([
      'ADMIN_ALLOWED_HOSTS: "receiver:3001" is not a host name (a comma-separated list of names such as metrics.internal, without port or scheme, or * for any)',
      'ADMIN_ALLOWED_HOSTS: "http://ops.example" is not a host name (a comma-separated list of names such as metrics.internal, without port or scheme, or * for any)',
      'ADMIN_ALLOWED_HOSTS: "-bad" is not a host name (a comma-separated list of names such as metrics.internal, without port or scheme, or * for any)',
    ])
    expect(set.limits).toEqual({ maxConnections: 50, maxInflightBodyBytes: 4 * 1024 * 1024, slowBodyMs: 0 })
    const problems = problemsOf({
      ...remoteEnv,
      ADMIN_PORT: '70000',
      MAX_CONNECTIONS: '0',
      SLOW_BODY_MS: '600001',
    })
    for (const name of ['ADMIN_PORT', 'MAX_CONNECTIONS', 'SLOW_BODY_MS']) {
      expect(problems.some((problem) => problem.startsWith(`${name}:`)), `${name} is named`).toBe(true)
    }
    expect(problemsOf({ ...remoteEnv, SANDBOX_CONTROL_TOKEN: 'short' })).toEqual([
      'SANDBOX_CONTROL_TOKEN: is shorter than 24 characters',
    ])
    // one largest body must fit in the budget
    expect(problemsOf({ ...remoteEnv, MAX_INFLIGHT_BODY_BYTES: '100kb' })).toEqual([
      'MAX_INFLIGHT_BODY_BYTES: must be at least WEBHOOK_BODY_LIMIT (one largest body must fit)',
    ])
  })

  it('guards the data directory with 128 MB free and bounds the log buffer at 16 MB by default; 0 turns the guard off', () => {
    const config = parseConfig(remoteEnv)
    expect([config.dataDirMinFreeBytes, config.logBufferLimitBytes]).toEqual([128 * 1024 * 1024, 16 * 1024 * 1024])
    const set = parseConfig({ ...remoteEnv, DATA_DIR_MIN_FREE: '1gb', LOG_BUFFER_LIMIT: '256kb' })
    expect([set.dataDirMinFreeBytes, set.logBufferLimitBytes]).toEqual([1024 * 1024 * 1024, 256 * 1024])
    expect(parseConfig({ ...remoteEnv, DATA_DIR_MIN_FREE: '0' }).dataDirMinFreeBytes).toBe(0)
    expect(problemsOf({ ...remoteEnv, DATA_DIR_MIN_FREE: 'lots', LOG_BUFFER_LIMIT: '0' })).toEqual([
      'DATA_DIR_MIN_FREE: must be a size in decimal digits (0-9) with an optional unit b, kb, mb or gb, such as 256kb (or 0)',
      'LOG_BUFFER_LIMIT: must be more than 0 (a size such as 256kb)',
    ])
  })
  it("gives the embedded database a max_wal_size of 128 MB by default (DATA_DIR_MAX_WAL), never under Postgres's 32 MB", () => {
    expect(parseConfig(remoteEnv).dataDirMaxWalBytes).toBe(128 * 1024 * 1024)
    expect(parseConfig({ ...remoteEnv, DATA_DIR_MAX_WAL: '32mb' }).dataDirMaxWalBytes).toBe(32 * 1024 * 1024)
    expect(problemsOf({ ...remoteEnv, DATA_DIR_MAX_WAL: '16mb' })).toEqual(['DATA_DIR_MAX_WAL: must be at least 32mb (two write-ahead log segments)'])
    expect(problemsOf({ ...remoteEnv, DATA_DIR_MAX_WAL: 'lots' })).toEqual([
      'DATA_DIR_MAX_WAL: must be a size in decimal digits (0-9) with an optional unit b, kb, mb or gb, such as 256kb',
    ])
  })
  it('reads at most 1 MiB of a platform answer by default (PARTNER_API_ANSWER_LIMIT), never an unbounded one', () => {
    expect(parseConfig(remoteEnv).partner.maxAnswerBytes).toBe(1024 * 1024)
    expect(parseConfig({ ...remoteEnv, PARTNER_API_ANSWER_LIMIT: '8mb' }).partner.maxAnswerBytes).toBe(8 * 1024 * 1024)
    expect(problemsOf({ ...remoteEnv, PARTNER_API_ANSWER_LIMIT: '0' })).toEqual([
      'PARTNER_API_ANSWER_LIMIT: must be more than 0 (a size such as 256kb)',
    ])
  })

  it('takes a size as decimal digits with an optional unit b, kb, mb or gb in either case; 0x10, 1e3, 12abc or 1.5mb exits naming the variable, where the part that looked like a number was read', () => {
    const sizes = ['MAX_INFLIGHT_BODY_BYTES', 'DATA_DIR_MIN_FREE', 'LOG_BUFFER_LIMIT', 'WEBHOOK_BODY_LIMIT', 'PARTNER_API_ANSWER_LIMIT']
    for (const name of sizes) {
      const form = `${name}: must be a size in decimal digits (0-9) with an optional unit b, kb, mb or gb, such as 256kb${name === 'DATA_DIR_MIN_FREE' ? ' (or 0)' : ''}`
      for (const value of ['0x10', '1e3', '12abc', '1.5mb', '1,024', '+1kb', '-1kb', ' 1kb', '1kb ', '1 kb', '1tb', 'kb', 'Infinity']) {
        expect(problemsOf({ ...remoteEnv, WEBHOOK_BODY_LIMIT: '1kb', [name]: value }), `${name}=${JSON.stringify(value)}`).toEqual([form])
      }
    }
    // DATA_DIR_MIN_FREE=0x10 was read as 0, the guard off
    expect(problemsOf({ ...remoteEnv, DATA_DIR_MIN_FREE: '0x10' })).toHaveLength(1)
    // digits alone are bytes; the units are 1024-based, as before
    const config = parseConfig({
      ...remoteEnv,
      DATA_DIR_MIN_FREE: '16384',
      LOG_BUFFER_LIMIT: '16383b',
      WEBHOOK_BODY_LIMIT: '512kb',
      MAX_INFLIGHT_BODY_BYTES: '2gb',
      PARTNER_API_ANSWER_LIMIT: '0008mb',
    })
    expect([
      config.dataDirMinFreeBytes,
      config.logBufferLimitBytes,
      config.webhook.bodyLimitBytes,
      config.limits.maxInflightBodyBytes,
      config.partner.maxAnswerBytes,
    ]).toEqual([16_384, 16_383, 512 * 1024, 2 * 1024 ** 3, 8 * 1024 ** 2])
    // a unit in capitals, as written before this check, reads the same
    expect(parseConfig({ ...remoteEnv, WEBHOOK_BODY_LIMIT: '1MB', LOG_BUFFER_LIMIT: '64Kb' })).toMatchObject({
      webhook: { bodyLimitBytes: 1024 ** 2 },
      logBufferLimitBytes: 64 * 1024,
    })
  })


  it('takes DATABASE_LISTEN_URL beside DATABASE_URL only, as a postgres URL', () => {
    const pooled = 'postgres://app@pooler:6432/escrow'
    const direct = 'postgres://app@db:5432/escrow'
    expect(parseConfig({ ...remoteEnv, DATABASE_URL: pooled, DATABASE_LISTEN_URL: direct })).toMatchObject({
      databaseUrl: pooled,
      databaseListenUrl: direct,
    })
    expect(parseConfig({ ...remoteEnv, DATABASE_URL: pooled }).databaseListenUrl).toBeUndefined()
    expect(problemsOf({ ...remoteEnv, DATABASE_LISTEN_URL: direct })).toEqual([
      'DATABASE_LISTEN_URL: is set but DATABASE_URL is not (it is the direct connection beside a pooled DATABASE_URL)',
    ])
    expect(problemsOf({ ...remoteEnv, DATABASE_URL: pooled, DATABASE_LISTEN_URL: 'db:5432' })).toEqual([
      'DATABASE_LISTEN_URL: must be a postgres:// or postgresql:// URL',
    ])
  })

  // node-postgres failed such a URL at the first connection with "Invalid URL", and took an unknown sslmode as TLS
  it('refuses a database URL node-postgres cannot read, or an sslmode it does not know, without printing the password', () => {
    const unreadable =
      'is not a URL node-postgres can read: percent-encode the user and the password where they hold one of : / ? # [ ] @ % ' +
      '(encodeURIComponent; `#` is %23), and give a port from 1 to 65535'
    for (const url of ['postgres://app:s3cr#t@db:5432/escrow', 'postgres://app:s3cret@db:99999/escrow', 'postgres://app:s3cr#t@[db/escrow']) {
      const problems = problemsOf({ ...remoteEnv, DATABASE_URL: url })
      expect(problems).toEqual([`DATABASE_URL: ${unreadable}`])
      expect(problems.join('\n')).not.toContain('s3cr')
      expect(problemsOf({ ...remoteEnv, DATABASE_URL: 'postgres://app@db/escrow', DATABASE_LISTEN_URL: url })).toEqual([
        `DATABASE_LISTEN_URL: ${unreadable}`,
      ])
    }
    expect(problemsOf({ ...remoteEnv, DATABASE_URL: 'postgres://app:s3cret@db/escrow?sslmode=verfy-full' })).toEqual([
      'DATABASE_URL: its sslmode is none of disable, prefer, require, verify-ca, verify-full, no-verify (verify-full with sslrootcert=… to verify the server)',
    ])
    // what node-postgres reads: an encoded password, a space it encodes itself, the forms of a Unix socket, each mode
    for (const url of [
      'postgres://app:s3cr%23t@db:5432/escrow',
      'postgres://app:my pass@db/escrow',
      'postgres://app@/escrow?host=/var/run/postgresql',
      'postgres:///escrow?host=/var/run/postgresql',
      'postgresql://app@db/escrow?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem',
      'postgresql://app@db/escrow?sslmode=disable',
    ])
      expect(parseConfig({ ...remoteEnv, DATABASE_URL: url }).databaseUrl).toBe(url)
  })

  it('leases a claimed order for POLL_LEASE_S, refusing one shorter than one poll can last and a window to start polls in, naming why', () => {
    // 300 s by default: one poll lasts up to 235 s (4 × 10 s attempts, 3 × 60 s Retry-After waits, a 14 + 1 s write-back),
    // and a cycle needs 30 s more to start its polls in
    expect(parseConfig(remoteEnv).poll.leaseS).toBe(300)
    expect(parseConfig({ ...remoteEnv, POLL_LEASE_S: '900' }).poll.leaseS).toBe(900)
    expect(parseConfig({ ...remoteEnv, POLL_LEASE_S: '265' }).poll.leaseS).toBe(265)
    expect(problemsOf({ ...remoteEnv, POLL_LEASE_S: '264' })).toEqual([
      "POLL_LEASE_S: must be at least 265: the longest one claimed order's poll can last (its GET's 4 attempts of " +
        'PARTNER_API_TIMEOUT_MS=10000 with a Retry-After of up to 60 s waited out between them, then its write-back under ' +
        'DATABASE_STATEMENT_TIMEOUT_MS=14000), and 30 s to start polls in: a cycle starts no poll with less than the longest ' +
        'poll left of its lease, which could otherwise run out under it (another replica claims the order and polls it again, ' +
        'and the first answer is thrown away)',
    ])
    // the bound follows both timeouts: 4 × 60 s + 3 × 60 s + 2 s + 1 s, and 30 s
    expect(problemsOf({ ...remoteEnv, POLL_LEASE_S: '452', PARTNER_API_TIMEOUT_MS: '60000', DATABASE_STATEMENT_TIMEOUT_MS: '2000' })[0]).toMatch(
      /^POLL_LEASE_S: must be at least 453: /,
    )
    expect(parseConfig({ ...remoteEnv, POLL_LEASE_S: '453', PARTNER_API_TIMEOUT_MS: '60000', DATABASE_STATEMENT_TIMEOUT_MS: '2000' }).poll.leaseS).toBe(453)
    // unset, the lease is never shorter than that: 465 s where PARTNER_API_TIMEOUT_MS=60000
    expect(parseConfig({ ...remoteEnv, PARTNER_API_TIMEOUT_MS: '60000' }).poll.leaseS).toBe(465)
    // a whole number of seconds up to a day, named when it is not
    for (const value of ['0', '86401', '300s', '-300']) {
      expect(problemsOf({ ...remoteEnv, POLL_LEASE_S: value }).map((problem) => problem.split(':')[0]), value).toEqual(['POLL_LEASE_S'])
    }
    expect(parseConfig({ ...remoteEnv, POLL_LEASE_S: '86400' }).poll.leaseS).toBe(86_400)
  })

  it('takes DATABASE_STATEMENT_TIMEOUT_MS from 100 ms to an hour, 14 s by default', () => {
    expect(parseConfig(remoteEnv).databaseStatementTimeoutMs).toBe(14_000)
    expect(parseConfig({ ...remoteEnv, DATABASE_STATEMENT_TIMEOUT_MS: '2500' }).databaseStatementTimeoutMs).toBe(2_500)
    expect(problemsOf({ ...remoteEnv, DATABASE_STATEMENT_TIMEOUT_MS: '50' }).map((problem) => problem.split(':')[0])).toEqual([
      'DATABASE_STATEMENT_TIMEOUT_MS',
    ])
    expect(problemsOf({ ...remoteEnv, DATABASE_STATEMENT_TIMEOUT_MS: '14s' }).map((problem) => problem.split(':')[0])).toEqual([
      'DATABASE_STATEMENT_TIMEOUT_MS',
    ])
  })

  describe('reactions and the forwarder', () => {
    const forwardSecret = `whsec_${Buffer.alloc(32, 9).toString('base64')}`

    it('has reaction defaults and no forwarder unless FORWARD_URL is set', () => {
      const config = parseConfig(remoteEnv)
      expect(config.reactions).toEqual({ maxAttempts: 50, concurrency: 32, leaseS: 300, backoff: { baseS: 5, capS: 3_600 }, heldBackWarnS: 60 })
      expect(config.forward).toBeUndefined()
      expect(
        parseConfig({
          ...remoteEnv,
          REACTION_MAX_ATTEMPTS: '3',
          REACTION_CONCURRENCY: '2',
          REACTION_LEASE_S: '30',
          REACTION_BACKOFF_BASE_S: '60',
          REACTION_BACKOFF_CAP_S: '600',
          REACTION_HELD_BACK_WARN_S: '5',
        }).reactions,
      ).toEqual({
        maxAttempts: 3,
        concurrency: 2,
        leaseS: 30,
        backoff: { baseS: 60, capS: 600 },
        heldBackWarnS: 5,
      })
      // a cap under the base would make every wait the cap
      expect(problemsOf({ ...remoteEnv, REACTION_BACKOFF_BASE_S: '600', REACTION_BACKOFF_CAP_S: '60' })).toEqual([
        'REACTION_BACKOFF_CAP_S: must be at least REACTION_BACKOFF_BASE_S (60 < 600)',
      ])
      expect(parseConfig({ ...remoteEnv, REACTION_BACKOFF_BASE_S: '600' }).reactions.backoff).toEqual({ baseS: 600, capS: 3_600 })
      expect(problemsOf({ ...remoteEnv, REACTION_LEASE_S: '0' }).some((problem) => problem.startsWith('REACTION_LEASE_S:'))).toBe(true)
      // 0 would say every hold at once, and again on every look
      expect(problemsOf({ ...remoteEnv, REACTION_HELD_BACK_WARN_S: '0' }).some((problem) => problem.startsWith('REACTION_HELD_BACK_WARN_S:'))).toBe(true)
    })

    it('refuses a webhook or metrics path that its listener already serves', () => {
      // the lists are the routes themselves
      expect(OPERATOR_LISTENER_PATHS).toEqual(['/', CONSOLE_PATH, LOCAL_CLI_PATH])
      for (const value of ['/', '/healthz', '/READYZ/']) {
        expect(problemsOf({ ...remoteEnv, WEBHOOK_PATH: value }), value).toEqual([expect.stringMatching(/^WEBHOOK_PATH: .* is the listener's own/)])
      }
      for (const value of ['/console', '/console/', '/Console/metrics', '/_local/cli', '//']) {
        expect(problemsOf({ ...remoteEnv, METRICS_PATH: value }), value).toEqual([expect.stringMatching(/^METRICS_PATH: .* is the listener's own/)])
      }
      expect(problemsOf({ ...remoteEnv, METRICS_PATH: '/console' })).toEqual(["METRICS_PATH: /console is the listener's own /console; choose another path"])
      // beside them, or on the other listener, a path is free
      expect(parseConfig({ ...remoteEnv, WEBHOOK_PATH: '/healthz-hooks', METRICS_PATH: '/readyz' }).metrics.path).toBe('/readyz')
      expect(parseConfig({ ...remoteEnv, WEBHOOK_PATH: '/console', METRICS_PATH: '/consoles' }).webhook.path).toBe('/console')
    })

    it('refuses a time no timer or database column can hold, naming the variable', () => {
      // Node takes a timer past 2^31 - 1 ms as 1 ms: the poller ran every millisecond, every platform call timed out
      // at once; the database's integer seconds overflowed in every webhook's statement
      const bounds = {
        PARTNER_API_TIMEOUT_MS: 2_147_483_647,
        FORWARD_TIMEOUT_MS: 2_147_483_647,
        AMQP_TIMEOUT_MS: 2_147_483_647,
        SHUTDOWN_TIMEOUT_MS: 86_400_000,
        // with its jitter of a quarter, the longest wait is 1.25 intervals
        POLL_INTERVAL_S: 1_717_986,
        EXPECTED_WEBHOOK_S: 2_147_483_647,
        STALE_AFTER_S: 2_147_483_647,
      }
      for (const [name, max] of Object.entries(bounds)) {
        expect(() => parseConfig({ ...remoteEnv, [name]: String(max) }), name).not.toThrow()
        const problems = problemsOf({ ...remoteEnv, [name]: String(max + 1) })
        expect(problems, name).toHaveLength(1)
        expect(problems[0], name).toMatch(new RegExp(`^${name}: .*${max}`))
      }
    })

    it('reads ORDER_REFERENCE_PATTERN as a whole-reference regular expression, and refuses one that is not', () => {
      expect(parseConfig(remoteEnv).orders.referencePattern).toBeUndefined()
      const pattern = parseConfig({ ...remoteEnv, ORDER_REFERENCE_PATTERN: 'ORD-[0-9]+|INV-[0-9]+' }).orders.referencePattern!
      // the whole reference, each alternative included
      expect(['ORD-1', 'INV-22', 'XORD-1', 'ORD-1x', 'ORD-', 'INV-2 '].map((reference) => pattern.test(reference))).toEqual([
        true, true, false, false, false, false,
      ])
      // with the u flag: `.` takes one character, an emoji included
      expect(parseConfig({ ...remoteEnv, ORDER_REFERENCE_PATTERN: 'x.' }).orders.referencePattern!.test('x😀')).toBe(true)
      expect(problemsOf({ ...remoteEnv, ORDER_REFERENCE_PATTERN: 'ORD-(' })).toEqual([
        'ORDER_REFERENCE_PATTERN: is not a regular expression (Invalid regular expression: /^(?:ORD-()$/u: Unterminated group)',
      ])
      // set empty, as every variable: unset
      expect(parseConfig({ ...remoteEnv, ORDER_REFERENCE_PATTERN: '' }).orders.referencePattern).toBeUndefined()
    })

    it('has retention defaults and refuses a delivery retention shorter than the body retention', () => {
      expect(parseConfig(remoteEnv).retention).toEqual({ bodyDays: 30, deliveryDays: 90, intervalS: 3_600, batchSize: 1_000 })
      expect(
        parseConfig({ ...remoteEnv, RETENTION_DAYS: '7', DELIVERY_RETENTION_DAYS: '7', PRUNE_INTERVAL_S: '60', PRUNE_BATCH_SIZE: '500' })
          .retention,
      ).toEqual({ bodyDays: 7, deliveryDays: 7, intervalS: 60, batchSize: 500 })
      expect(problemsOf({ ...remoteEnv, RETENTION_DAYS: '60', DELIVERY_RETENTION_DAYS: '30' })).toEqual([
        'DELIVERY_RETENTION_DAYS: must be at least RETENTION_DAYS (30 < 60): a delivery row outlives its body',
      ])
      for (const [name, value] of [
        ['RETENTION_DAYS', '0'],
        ['RETENTION_DAYS', '1.5'],
        ['DELIVERY_RETENTION_DAYS', '-90'],
        ['DELIVERY_RETENTION_DAYS', 'ninety'],
        ['PRUNE_INTERVAL_S', '0'],
        ['PRUNE_BATCH_SIZE', '0'],
      ] as const) {
        expect(problemsOf({ ...remoteEnv, [name]: value }).some((problem) => problem.startsWith(`${name}:`)), `${name}=${value}`).toBe(true)
      }
    })

    it('refuses a FORWARD_TIMEOUT_MS or AMQP_TIMEOUT_MS longer than a call may run under REACTION_LEASE_S', () => {
      const forwarding = { ...remoteEnv, FORWARD_URL: 'https://erp.internal/hooks/escrow', FORWARD_SECRET: forwardSecret }
      // a 10 s lease: a call still running 1 s before its end is stopped, so 9 s is the most a call gets
      expect(problemsOf({ ...forwarding, REACTION_LEASE_S: '10', FORWARD_TIMEOUT_MS: '120000' })).toEqual([
        'FORWARD_TIMEOUT_MS: must be at most 9000 (REACTION_LEASE_S=10 less the 1000 ms before its end at which a call still running is stopped): a longer call is cut off every time and its event ends failed',
      ])
      expect(parseConfig({ ...forwarding, REACTION_LEASE_S: '10', FORWARD_TIMEOUT_MS: '9000' }).forward?.timeoutMs).toBe(9_000)
      // the default lease (300 s, stopped 5 s before its end)
      expect(problemsOf({ ...forwarding, FORWARD_TIMEOUT_MS: '295001' })).toHaveLength(1)
      expect(problemsOf({ ...remoteEnv, AMQP_URL: 'amqp://broker.internal', AMQP_TIMEOUT_MS: '600000' })[0]).toMatch(/^AMQP_TIMEOUT_MS: must be at most 295000 /)
      // a timeout of a handler not configured is not checked
      expect(parseConfig({ ...remoteEnv, REACTION_LEASE_S: '10', FORWARD_TIMEOUT_MS: '60000', AMQP_TIMEOUT_MS: '60000' }).reactions.leaseS).toBe(10)
    })

    const AMQP_OPTIONS_READ = 'heartbeat, channelMax, frameMax, maxFrameSize, locale'
    // amqplib reads these from the query string with parseInt: heartbeat=abc started cleanly, then failed every
    // publish as the broker unreachable ("Field 'heartbeat' is the wrong type"), retried for a day
    it("refuses AMQP_URL query options amqplib could not send, naming the option and never the URL", () => {
      const broker = 'amqp://partner:amqp-Passw0rd@broker.internal:5672/%2f'
      const refused: Record<string, string> = {
        'heartbeat=abc': 'AMQP_URL: its query option heartbeat must be a whole number of seconds from 0 to 65535 (0: no heartbeats)',
        'heartbeat=': 'AMQP_URL: its query option heartbeat must be a whole number of seconds from 0 to 65535 (0: no heartbeats)',
        'heartbeat=10s': 'AMQP_URL: its query option heartbeat must be a whole number of seconds from 0 to 65535 (0: no heartbeats)',
        'heartbeat=65536': 'AMQP_URL: its query option heartbeat must be a whole number of seconds from 0 to 65535 (0: no heartbeats)',
        'channelMax=-1': "AMQP_URL: its query option channelMax must be a whole number from 0 to 65535 (0: the broker's limit)",
        'frameMax=100': "AMQP_URL: its query option frameMax must be a whole number of bytes, 0 (the broker's limit) or from 4096 to 4294967295",
        'frameMax=4294967296': "AMQP_URL: its query option frameMax must be a whole number of bytes, 0 (the broker's limit) or from 4096 to 4294967295",
        'maxFrameSize=12': 'AMQP_URL: its query option maxFrameSize must be a whole number of bytes, 0 (no limit) or at least 4096',
        [`locale=${'x'.repeat(256)}`]: 'AMQP_URL: its query option locale must be at most 255 bytes',
        // the first of a repeated option is the one amqplib reads
        'heartbeat=x&heartbeat=10': 'AMQP_URL: its query option heartbeat must be a whole number of seconds from 0 to 65535 (0: no heartbeats)',
        'Heartbeat=10': 'AMQP_URL: its query option Heartbeat is not read; the name is heartbeat (letter case counts)',
        // a name amqplib does not read at all did nothing, the operator believing it set: named, never its value
        'heartbeet=10': `AMQP_URL: its query option heartbeet is not one amqplib reads; the options it reads are ${AMQP_OPTIONS_READ}`,
        'prefetch=5': `AMQP_URL: its query option prefetch is not one amqplib reads; the options it reads are ${AMQP_OPTIONS_READ}`,
        'connection_attempts=3': `AMQP_URL: its query option connection_attempts is not one amqplib reads; the options it reads are ${AMQP_OPTIONS_READ}`,
        'heartbeat=30&x%20y=amqp-Passw0rd': `AMQP_URL: its query option "x y" is not one amqplib reads; the options it reads are ${AMQP_OPTIONS_READ}`,
      }
      for (const [query, problem] of Object.entries(refused)) {
        expect(problemsOf({ ...remoteEnv, AMQP_URL: `${broker}?${query}` }), query).toEqual([problem])
      }
      // the whole refusal, as start-up prints it, holds neither the URL's password nor an option's value
      let said = ''
      try {
        parseConfig({ ...remoteEnv, AMQP_URL: `${broker}?prefetch=amqp-Passw0rd` })
      } catch (error) {
        said = (error as Error).message
      }
      expect(said).toMatch(/^Invalid configuration \[config_invalid\]/)
      expect(said).toContain('its query option prefetch is not one amqplib reads')
      expect(said).not.toContain('amqp-Passw0rd')
      const taken = ['heartbeat=30', 'heartbeat=0&channelMax=2047&frameMax=131072&maxFrameSize=0&locale=en_US', 'frameMax=0', 'locale=']
      for (const query of taken) {
        expect(parseConfig({ ...remoteEnv, AMQP_URL: `${broker}?${query}` }).amqp?.url, query).toBe(`${broker}?${query}`)
      }
    })

    it('parses FORWARD_URL, FORWARD_SECRET and FORWARD_TIMEOUT_MS', () => {
      const env = { ...remoteEnv, FORWARD_URL: 'https://erp.internal/hooks/escrow', FORWARD_SECRET: forwardSecret }
      expect(parseConfig(env).forward).toEqual({
        url: 'https://erp.internal/hooks/escrow',
        secret: forwardSecret,
        timeoutMs: 10_000,
        events: ['trade.*'],
      })
      expect(parseConfig({ ...env, FORWARD_TIMEOUT_MS: '2500' }).forward?.timeoutMs).toBe(2500)
    })

    it('refuses a forward URL that is not http(s), a missing or malformed secret, and bad numbers', () => {
      expect(problemsOf({ ...remoteEnv, FORWARD_URL: 'https://erp.internal/hook' })).toEqual([
        'FORWARD_SECRET: required when FORWARD_URL is set',
      ])
      expect(problemsOf({ ...remoteEnv, FORWARD_SECRET: forwardSecret })).toEqual([
        'FORWARD_SECRET: is set but FORWARD_URL is not (set both to forward, or neither)',
      ])
      // each case said apart (one message said the same of all), naming the secret's fault, never its value
      const tail = ' (each is whsec_ followed by the base64 of at least 24 random bytes); make one with: echo "whsec_$(openssl rand -base64 32)"'
      const key = Buffer.alloc(32, 0xfb) // its base64 holds + and /
      const malformed: [string, string][] = [
        [LONG_SECRET, 'does not start with whsec_'],
        [`WHSEC_${key.toString('base64')}`, 'does not start with whsec_'],
        [`whsec_${Buffer.alloc(16, 9).toString('base64')}`, 'is too short: its base64 holds 16 bytes, and at least 24 are needed'],
        ['whsec_', 'is too short: its base64 holds 0 bytes, and at least 24 are needed'],
        [`whsec_${key.toString('base64url')}`, 'is URL-safe base64 after whsec_ (- or _): write it in standard base64 (+ and /)'],
        [`whsec_${Buffer.alloc(25, 9).toString('base64').replace(/=+$/, '')}`, 'lacks its base64 padding after whsec_ (= or ==)'],
        ['whsec_this.is.not.base64.but.is.long.enough.to.pass.a.length.check', 'is not base64 after whsec_ (standard base64: A-Z a-z 0-9 + /, = padded)'],
        [`whsec_${key.toString('base64')}!`, 'is not base64 after whsec_ (standard base64: A-Z a-z 0-9 + /, = padded)'],
      ]
      for (const [secret, fault] of malformed) {
        const problems = problemsOf({ ...remoteEnv, FORWARD_URL: 'https://erp.internal/hook', FORWARD_SECRET: secret })
        expect(problems, secret).toEqual([`FORWARD_SECRET: the secret ${fault}${tail}`])
        if (secret.length > 'whsec_'.length + 8) expect(problems.join('\n')).not.toContain(secret.slice('whsec_'.length, 'whsec_'.length + 12))
      }
      expect(problemsOf({ ...remoteEnv, FORWARD_URL: 'https://erp.internal/hook', FORWARD_SECRET: ' , ' })).toEqual([
        'FORWARD_SECRET: is set but holds no secret (each is whsec_ followed by the base64 of at least 24 random bytes); make one with: echo "whsec_$(openssl rand -base64 32)"',
      ])
      const problems = problemsOf({
        ...remoteEnv,
        FORWARD_URL: 'ftp://erp.internal/hook',
        FORWARD_SECRET: forwardSecret,
        FORWARD_TIMEOUT_MS: '0',
        REACTION_MAX_ATTEMPTS: 'many',
        REACTION_CONCURRENCY: '0',
      })
      for (const name of ['FORWARD_URL', 'FORWARD_TIMEOUT_MS', 'REACTION_MAX_ATTEMPTS', 'REACTION_CONCURRENCY']) {
        expect(problems.some((problem) => problem.startsWith(`${name}:`)), `${name} is named`).toBe(true)
      }
      expect(problems.join('\n')).not.toContain(forwardSecret.slice('whsec_'.length))
    })

    // the forwarder sends to the parsed URL's path and query: a fragment was dropped, `/x y` sent to /x%20y and
    // `/\evil` to //evil, without a word
    it('refuses a FORWARD_URL the forwarder would send to another path or query than written, naming it and never the URL', () => {
      const base = 'http://escrow:s3cr3t-password@127.0.0.1:4500'
      const token = '?token=t0ken-of-the-receiver'
      const refusals = {
        fragment: [`${base}/h${token}#frag`, `${base}/h#`],
        whitespace: [`${base}/x y`, `${base}/x${token} `, `${base}/x\u00a0y`],
        backslash: [`${base}/\\evil`, `${base}\\evil`],
        path: [`${base}/a/../b`, `${base}/a/%2e%2e/b`, `${base}/caf\u00e9`, `${base}/a"b`, `${base}/a<b>`, `${base}/a{b}`, `${base}/a\`b`],
        query: [`${base}/h?a="b"`, `${base}/h?a='b'`, `${base}/h?a=caf\u00e9`, `${base}/h?`],
      }
      const messages = {
        fragment: 'FORWARD_URL: must not have a fragment (#…), which is never sent; a # in the user, password, path or query is written %23',
        whitespace: 'FORWARD_URL: must not hold a space or other whitespace; write it percent-encoded, as it is to be sent (a space is %20)',
        backslash: 'FORWARD_URL: must not hold a backslash, which the URL parser reads as / (…/\\evil is sent to //evil); write / or %5C',
        path:
          'FORWARD_URL: its path would be sent other than written: the URL parser resolves . and .. segments (%2e too) and ' +
          'percent-encodes characters such as é " < > ` { }; write the path as it is to be sent',
        query:
          "FORWARD_URL: its query string would be sent other than written: the URL parser percent-encodes characters such as é \" ' < > " +
          'and drops a ? with nothing after it; write the query as it is to be sent',
      }
      for (const [kind, urls] of Object.entries(refusals) as [keyof typeof refusals, string[]][]) {
        for (const url of urls) {
          const problems = problemsOf({ ...remoteEnv, FORWARD_URL: url, FORWARD_SECRET: forwardSecret })
          expect(problems, url).toEqual([messages[kind]])
          for (const secret of ['s3cr3t-password', 't0ken-of-the-receiver', '127.0.0.1']) expect(problems[0], url).not.toContain(secret)
        }
      }
    })

    // the URL parser takes port 0: every call failed as the receiver unreachable and was retried; amqplib read an
    // AMQP_URL's port 0 as none and connected to 5672
    it('refuses port 0 in FORWARD_URL and AMQP_URL, naming the form and never the URL', () => {
      for (const url of ['http://127.0.0.1:0/x', 'https://user:forward-Passw0rd@erp.internal:00/hook']) {
        const problems = problemsOf({ ...remoteEnv, FORWARD_URL: url, FORWARD_SECRET: forwardSecret })
        expect(problems, url).toEqual(["FORWARD_URL: must not have port 0, where nothing can be reached; give the receiver's port (or none: 80, 443)"])
      }
      for (const url of ['amqp://127.0.0.1:0', 'amqps://partner:amqp-Passw0rd@broker.internal:0/vhost']) {
        expect(problemsOf({ ...remoteEnv, AMQP_URL: url }), url).toEqual(["AMQP_URL: must not have port 0; give the broker's port (or none: 5672, 5671 for amqps://)"])
      }
      expect(parseConfig({ ...remoteEnv, FORWARD_URL: 'http://127.0.0.1:10/x', FORWARD_SECRET: forwardSecret }).forward?.url).toBe('http://127.0.0.1:10/x')
    })

    it('takes a FORWARD_URL written as it is sent: a query string (a receiver token), a user and password, percent-encoding, capitals', () => {
      for (const url of [
        'https://erp.internal/hooks/escrow?token=t0ken&x=%22a%20b%22',
        'http://escrow:p%40ss%23word@127.0.0.1:4500/hooks/escrow',
        'HTTPS://ERP.internal:443/Hooks/caf%C3%A9',
        // ^ is left out: Node 24's parser percent-encodes it in a path (Node 20's does not), and the check asks the running parser
        'http://[::1]:4500/a|b/c/%zz',
        // no path: sent to /, as curl does
        'https://erp.internal',
        'https://erp.internal?token=t0ken',
      ]) {
        expect(parseConfig({ ...remoteEnv, FORWARD_URL: url, FORWARD_SECRET: forwardSecret }).forward?.url, url).toBe(url)
      }
    })

    it('says a number outside its range as every other message does: must be at least, must be at most', () => {
      const forwarding = { ...remoteEnv, FORWARD_URL: 'https://erp.internal/hook', FORWARD_SECRET: forwardSecret }
      const amqp = { ...remoteEnv, AMQP_URL: 'amqp://broker.internal' }
      for (const [env, name, value, problem] of [
        [remoteEnv, 'REACTION_MAX_ATTEMPTS', '0', 'must be at least 1'],
        [remoteEnv, 'REACTION_MAX_ATTEMPTS', '1001', 'must be at most 1000'],
        // past Number's precision, as past the bound
        [remoteEnv, 'REACTION_MAX_ATTEMPTS', '99999999999999999999', 'must be at most 1000'],
        [remoteEnv, 'REACTION_LEASE_S', '0', 'must be at least 1'],
        [remoteEnv, 'REACTION_CONCURRENCY', '0', 'must be at least 1'],
        [remoteEnv, 'REACTION_CONCURRENCY', '257', 'must be at most 256'],
        [forwarding, 'FORWARD_TIMEOUT_MS', '0', 'must be at least 1'],
        [amqp, 'AMQP_TIMEOUT_MS', '0', 'must be at least 1'],
        [remoteEnv, 'DATABASE_STATEMENT_TIMEOUT_MS', '99', 'must be at least 100'],
        [remoteEnv, 'SLOW_BODY_MS', '600001', 'must be at most 600000'],
        [remoteEnv, 'PORT', '65536', 'must be at most 65535'],
      ] as const) {
        expect(problemsOf({ ...env, [name]: value }), `${name}=${value}`).toEqual([`${name}: ${problem}`])
      }
      // the bounds themselves are taken
      expect(parseConfig({ ...remoteEnv, REACTION_MAX_ATTEMPTS: '1000', DATABASE_STATEMENT_TIMEOUT_MS: '100', SLOW_BODY_MS: '0' }).reactions.maxAttempts).toBe(1000)
    })

    it('takes several forward secrets for a rotation, each checked and each among the secrets no log line may show', () => {
      const next = `whsec_${Buffer.alloc(32, 7).toString('base64')}`
      const config = parseConfig({ ...remoteEnv, FORWARD_URL: 'http://127.0.0.1:9/hook', FORWARD_SECRET: `${forwardSecret} ${next}` })
      expect(configSecrets(config)).toEqual(expect.arrayContaining([forwardSecret.slice('whsec_'.length), next.slice('whsec_'.length)]))
      // each bad one by its place among them
      const short = `whsec_${Buffer.alloc(16, 9).toString('base64')}`
      const problems = problemsOf({ ...remoteEnv, FORWARD_URL: 'http://127.0.0.1:9/hook', FORWARD_SECRET: `${forwardSecret},${short} x-secret-value` })
      expect(problems).toHaveLength(2)
      expect(problems[0]).toMatch(/^FORWARD_SECRET: secret #2 of 3 is too short: its base64 holds 16 bytes, and at least 24 are needed \(each is /)
      expect(problems[1]).toMatch(/^FORWARD_SECRET: secret #3 of 3 does not start with whsec_ \(each is /)
      expect(problems.join('\n')).not.toContain('x-secret-value')
    })

    it('counts the forward secret among the secrets no log line may show', () => {
      const config = parseConfig({ ...remoteEnv, FORWARD_URL: 'http://127.0.0.1:9/hook', FORWARD_SECRET: forwardSecret })
      const lines: string[] = []
      const logger = createLogger({
        level: 'info',
        secrets: configSecrets(config),
        destination: { write: (line: string) => lines.push(line) },
      })
      logger.info({ careless: forwardSecret }, `a careless line with ${forwardSecret.slice('whsec_'.length)}`)
      expect(lines).toHaveLength(1)
      expect(lines[0]).not.toContain(forwardSecret.slice('whsec_'.length))
      expect(lines[0]).toContain('[redacted]')
    })

    // compose's RabbitMQ password is `partner`: censored wherever it appeared, it blanked `partner-escrow` and
    // `/webhooks/partner` in every line, and so told the reader what it was
    it('censors a short URL password where a URL holds it, and leaves the word elsewhere', () => {
      const url = 'http://escrow:partner@127.0.0.1:28010/hooks/escrow'
      const config = parseConfig({ ...remoteEnv, FORWARD_URL: url, FORWARD_SECRET: forwardSecret })
      expect(configSecrets(config)).toContain(':partner@')
      expect(configSecrets(config)).not.toContain('partner')
      const lines: string[] = []
      const logger = createLogger({ level: 'info', secrets: configSecrets(config), destination: { write: (line: string) => lines.push(line) } })
      logger.info({ webhookPath: '/webhooks/partner', careless: url }, 'partner api client ready')
      const line = JSON.parse(lines[0]!) as Record<string, unknown>
      expect(line).toMatchObject({ service: 'partner-escrow', webhookPath: '/webhooks/partner', msg: 'partner api client ready' })
      expect(line.careless).toBe('http://escrow[redacted]127.0.0.1:28010/hooks/escrow')
    })

    it('counts the password of FORWARD_URL, as written and decoded, among the secrets no log line may show', () => {
      const url = 'https://escrow:p%40ss-word-of-the-receiver@erp.internal/hooks/escrow'
      const config = parseConfig({ ...remoteEnv, FORWARD_URL: url, FORWARD_SECRET: forwardSecret })
      expect(configSecrets(config)).toEqual(expect.arrayContaining(['p%40ss-word-of-the-receiver', 'p@ss-word-of-the-receiver']))
    })
  })

  describe('the event types of the built-in handlers (AMQP_EVENTS, FORWARD_EVENTS)', () => {
    const forwardSecret = `whsec_${Buffer.alloc(32, 9).toString('base64')}`
    const both = {
      ...remoteEnv,
      AMQP_URL: 'amqp://127.0.0.1',
      FORWARD_URL: 'https://erp.internal/hook',
      FORWARD_SECRET: forwardSecret,
    }

    it('takes a comma-separated list of trade.<status> and trade.*, trimmed and without repeats; empty is the default', () => {
      const config = parseConfig({ ...both, AMQP_EVENTS: ' trade.funded, trade.released,,trade.funded ', FORWARD_EVENTS: 'trade.*' })
      expect(config.amqp?.events).toEqual(['trade.funded', 'trade.released'])
      expect(config.forward?.events).toEqual(['trade.*'])
      expect(Object.isFrozen(config.amqp?.events)).toBe(true)
      const unset = parseConfig({ ...both, AMQP_EVENTS: '', FORWARD_EVENTS: '' })
      expect([unset.amqp?.events, unset.forward?.events]).toEqual([['trade.*'], ['trade.*']])
    })

    it('refuses a list naming no type, a pattern of another form and a status the table does not know, naming the variable', () => {
      expect(problemsOf({ ...both, AMQP_EVENTS: ' , ' })).toEqual([
        'AMQP_EVENTS: is set but names no event type (a comma-separated list of trade.<status>, or trade.* for every event)',
      ])
      for (const pattern of ['funded', 'trade.Funded', 'trade.fund*', 'trade.#', '*', 'order.funded']) {
        expect(problemsOf({ ...both, FORWARD_EVENTS: `trade.funded,${pattern}` }), pattern).toEqual([
          `FORWARD_EVENTS: ${JSON.stringify(pattern)} is not an event type pattern (a comma-separated list of trade.<status>, or trade.* for every event)`,
        ])
      }
      expect(problemsOf({ ...both, AMQP_EVENTS: 'trade.shipped', FORWARD_EVENTS: 'trade.paid' })).toEqual([
        'FORWARD_EVENTS: "trade.paid" matches no event type; the types are trade.created, trade.funded, trade.delivered, trade.disputed, trade.cancelled, trade.refunded, trade.released, trade.resolved',
        'AMQP_EVENTS: "trade.shipped" matches no event type; the types are trade.created, trade.funded, trade.delivered, trade.disputed, trade.cancelled, trade.refunded, trade.released, trade.resolved',
      ])
      // validated while the handler is off too: a later AMQP_URL must not meet a bad list
      expect(problemsOf({ ...remoteEnv, AMQP_EVENTS: 'trade.shipped' })[0]).toMatch(/^AMQP_EVENTS: "trade.shipped" matches no event type/)
    })
  })

  describe('the RabbitMQ publisher', () => {
    const amqpUrl = 'amqps://escrow:p%40ss-word-of-the-broker@mq.internal:5671/partner'

    it('is off unless AMQP_URL is set; AMQP_EXCHANGE defaults to partner-escrow', () => {
      expect(parseConfig(remoteEnv).amqp).toBeUndefined()
      expect(parseConfig({ ...remoteEnv, AMQP_URL: amqpUrl }).amqp).toEqual({
        url: amqpUrl,
        exchange: 'partner-escrow',
        timeoutMs: 10_000,
        events: ['trade.*'],
      })
      const custom = parseConfig({
        ...remoteEnv,
        AMQP_URL: 'amqp://127.0.0.1',
        AMQP_EXCHANGE: 'erp.orders:escrow',
        AMQP_TIMEOUT_MS: '2500',
      })
      expect(custom.amqp).toEqual({ url: 'amqp://127.0.0.1', exchange: 'erp.orders:escrow', timeoutMs: 2500, events: ['trade.*'] })
    })

    it('refuses a URL that is not amqp(s), a bad exchange name and a bad timeout, never echoing the URL', () => {
      for (const url of ['https://escrow:p%40ss-word-of-the-broker@mq.internal', 'amqp//escrow:p%40ss-word-of-the-broker', 'not a url']) {
        const problems = problemsOf({ ...remoteEnv, AMQP_URL: url })
        expect(problems).toEqual([
          'AMQP_URL: must be an amqp:// or amqps:// URL (amqp://user:password@host:5672/vhost)',
        ])
        expect(problems.join('\n')).not.toContain('p%40ss')
      }
      for (const exchange of ['amq.topic', 'with space', 'x'.repeat(256)]) {
        const problems = problemsOf({ ...remoteEnv, AMQP_URL: amqpUrl, AMQP_EXCHANGE: exchange })
        expect(problems).toHaveLength(1)
        expect(problems[0]).toMatch(/^AMQP_EXCHANGE: /)
      }
      expect(problemsOf({ ...remoteEnv, AMQP_URL: amqpUrl, AMQP_TIMEOUT_MS: '0' })[0]).toMatch(/^AMQP_TIMEOUT_MS: /)
    })

    it('counts the URL password, as written and decoded, among the secrets no log line may show', () => {
      const config = parseConfig({ ...remoteEnv, AMQP_URL: amqpUrl })
      expect(configSecrets(config)).toEqual(expect.arrayContaining(['p%40ss-word-of-the-broker', 'p@ss-word-of-the-broker']))
      const lines: string[] = []
      const logger = createLogger({
        level: 'info',
        secrets: configSecrets(config),
        destination: { write: (line: string) => lines.push(line) },
      })
      logger.info({ careless: amqpUrl }, 'a careless line with p@ss-word-of-the-broker')
      expect(lines[0]).not.toContain('ss-word-of-the-broker')
      expect(configSecrets(parseConfig({ ...remoteEnv, AMQP_URL: 'amqp://mq.internal' }))).toEqual(
        configSecrets(parseConfig(remoteEnv)),
      )
    })
  })
})
