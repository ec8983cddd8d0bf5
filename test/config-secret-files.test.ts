// Secrets read from files: NAME_FILE names a file whose content is NAME's value, as Docker secrets, Kubernetes secret
// volumes and systemd credentials hand secrets over (and as the official Postgres image reads POSTGRES_PASSWORD_FILE).
// The value read gets every check the variable's own gets; a file that cannot be used is said by variable, path and
// reason, never by its content.
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import {
  ConfigError,
  configSecrets,
  parseConfig,
  PUBLISHED_SECRETS,
  READ_VARIABLES,
  runningServiceLookup,
  SECRET_FILE_VARIABLES,
  unreadVariablesOf,
} from '../src/config.js'
import { problemsOf } from './helpers/test-config.js'
import { MAX_SECRET_FILE_BYTES } from '../src/secret-files.js'

const WEBHOOK_SECRET = 'a-webhook-secret-of-enough-length-000'
const API_SECRET = 'an-api-secret-of-enough-length-0000'
/** A production configuration: a real platform, its key pair and webhook secret, a throwaway database. */
const production = {
  PARTNER_API_BASE_URL: 'https://platform.example/',
  PARTNER_API_KEY_ID: 'pk_1',
  PARTNER_API_SECRET: API_SECRET,
  WEBHOOK_SECRETS: WEBHOOK_SECRET,
  DATA_DIR: 'memory://',
}

const directory = mkdtempSync(path.join(tmpdir(), 'secret-files-'))
afterAll(() => rmSync(directory, { recursive: true, force: true }))
let files = 0
/** A new file holding `content` (made with mode 0600, as a secret's). */
function secretFile(content: string | Buffer): string {
  const file = path.join(directory, `secret-${++files}`)
  writeFileSync(file, content, { mode: 0o600 })
  return file
}

/** `production` with NAME given as NAME_FILE instead, the file holding `content`. */
function fromFile(name: string, content: string, env: Record<string, string> = production): Record<string, string> {
  const { [name]: _, ...rest } = env
  return { ...rest, [`${name}_FILE`]: secretFile(content) }
}

describe('NAME_FILE', () => {
  it('gives every secret the value its variable would, the file made with echo or on Windows', () => {
    const forwardSecret = `whsec_${Buffer.alloc(32, 7).toString('base64')}`
    const given: Record<string, string> = {
      ...production,
      WEBHOOK_SECRETS: `${WEBHOOK_SECRET},another-webhook-secret-of-length-0`,
      DATABASE_URL: 'postgres://partner:db%23password@db.internal:5432/escrow',
      DATABASE_LISTEN_URL: 'postgres://partner:db%23password@db-direct.internal:5432/escrow',
      FORWARD_URL: 'https://user:forward-password@receiver.example/hooks?token=abc',
      FORWARD_SECRET: forwardSecret,
      ADMIN_TOKEN: 'an-admin-token-of-enough-length-000',
      SANDBOX_CONTROL_TOKEN: 'a-control-token-of-enough-length-00',
      AMQP_URL: 'amqp://partner:amqp-password@broker.internal:5672/vhost',
    }
    const expected = parseConfig(given)
    const inFiles: Record<string, string> = { ...given }
    for (const [index, name] of ['WEBHOOK_SECRETS', 'PARTNER_API_SECRET', 'DATABASE_URL', 'DATABASE_LISTEN_URL', 'FORWARD_URL', 'FORWARD_SECRET', 'ADMIN_TOKEN', 'SANDBOX_CONTROL_TOKEN', 'AMQP_URL'].entries()) {
      delete inFiles[name]
      // a line feed, a CRLF (a file saved on Windows), or none
      inFiles[`${name}_FILE`] = secretFile(`${given[name]}${['\n', '\r\n', ''][index % 3]}`)
    }
    const config = parseConfig(inFiles)
    expect({ ...config, unreadVariables: [] }).toEqual({ ...expected, unreadVariables: [] })
    // and the log redaction knows them
    expect(configSecrets(config)).toEqual(configSecrets(expected))
    expect(config.unreadVariables).toEqual([])
  })

  it('gives PARTNER_ENV’s key pair its secret, PARTNER_LIVE_API_SECRET_FILE under live', () => {
    const liveSecret = 'the-live-api-secret-of-enough-length'
    const live = {
      ...production,
      PARTNER_ENV: 'live',
      DATABASE_URL: 'postgres://db.internal/escrow',
      PARTNER_LIVE_API_BASE_URL: 'https://live.platform.example/',
      PARTNER_LIVE_API_KEY_ID: 'pk_live_1',
      PARTNER_LIVE_API_SECRET_FILE: secretFile(`${liveSecret}\n`),
    }
    expect(parseConfig(live).partner).toMatchObject({ keyId: 'pk_live_1', secret: liveSecret })
    const sandbox = { ...production, PARTNER_SANDBOX_API_KEY_ID: 'pk_sandbox_2', PARTNER_SANDBOX_API_SECRET_FILE: secretFile('the-sandbox-secret-of-enough-length\n') }
    expect(parseConfig(sandbox).partner).toMatchObject({ keyId: 'pk_sandbox_2', secret: 'the-sandbox-secret-of-enough-length' })
    // the key id without its secret is still half a pair, and a file completes it as the variable would
    const { PARTNER_LIVE_API_SECRET_FILE: _, ...half } = live
    expect(problemsOf(half)[0]).toMatch(/^PARTNER_LIVE_API_SECRET: required when PARTNER_LIVE_API_KEY_ID is set/)
  })

  it('removes one line ending alone: a second, or a line after the value, is refused by the file', () => {
    for (const content of [`${WEBHOOK_SECRET}\n\n`, `${WEBHOOK_SECRET}\nsecond-line\n`, `${WEBHOOK_SECRET}\r\n\r\n`]) {
      const env = fromFile('WEBHOOK_SECRETS', content)
      const [problem] = problemsOf(env)
      expect(problem).toMatch(new RegExp(`^WEBHOOK_SECRETS \\(from WEBHOOK_SECRETS_FILE=${env.WEBHOOK_SECRETS_FILE}\\): holds a (control character|carriage return)`))
      expect(problem).toContain('the file must hold the value alone, with at most one line ending after it')
      expect(problem).not.toContain(WEBHOOK_SECRET)
    }
    // a space is kept, and refused as in the variable
    expect(problemsOf(fromFile('PARTNER_API_SECRET', `${API_SECRET} \n`))).toEqual([
      expect.stringMatching(/^PARTNER_API_SECRET \(from PARTNER_API_SECRET_FILE=.*\): begins or ends with a space, which is kept as part of the value: remove it$/),
    ])
    // quotes are kept, as docker's --env-file keeps them
    expect(problemsOf(fromFile('ADMIN_TOKEN', `"an-admin-token-of-enough-length-000"\n`, production))).toEqual([
      expect.stringMatching(/^ADMIN_TOKEN \(from ADMIN_TOKEN_FILE=.*\): is wrapped in quotes, which are kept as part of the value: remove them from the file$/),
    ])
  })

  it('is refused beside NAME, naming both, and never reads the file then', () => {
    const env = { ...production, WEBHOOK_SECRETS_FILE: path.join(directory, 'never-made') }
    expect(problemsOf(env)).toEqual([
      'WEBHOOK_SECRETS and WEBHOOK_SECRETS_FILE: both are set; give the value one way, in WEBHOOK_SECRETS or in the file WEBHOOK_SECRETS_FILE names, and unset the ' +
        "other (under docker compose, compose.yaml's own `WEBHOOK_SECRETS: ${WEBHOOK_SECRETS:-…}` sets it: remove that line there)",
    ])
    expect(problemsOf({ ...production, ADMIN_TOKEN: 'an-admin-token-of-enough-length-000', ADMIN_TOKEN_FILE: secretFile('another-admin-token-of-length-000\n') })).toEqual([
      'ADMIN_TOKEN and ADMIN_TOKEN_FILE: both are set; give the value one way, in ADMIN_TOKEN or in the file ADMIN_TOKEN_FILE names, and unset the other',
    ])
    // one set to the empty string sets nothing, as everywhere: compose's `NAME: ${NAME:-}`
    expect(parseConfig({ ...fromFile('WEBHOOK_SECRETS', `${WEBHOOK_SECRET}\n`), WEBHOOK_SECRETS: '' }).webhook.secrets).toEqual([WEBHOOK_SECRET])
    expect(parseConfig({ ...production, WEBHOOK_SECRETS_FILE: '' }).webhook.secrets).toEqual([WEBHOOK_SECRET])
  })

  it('names the variable, the path and the reason of a file that cannot be used, never its content', () => {
    const notUtf8 = secretFile(Buffer.from([0x73, 0x65, 0x63, 0xe9, 0x74, 0x0a]))
    const empty = secretFile('')
    const lineEnding = secretFile('\n')
    const withBom = secretFile(`\uFEFF${WEBHOOK_SECRET}\n`)
    const large = secretFile(`${'x'.repeat(MAX_SECRET_FILE_BYTES)}\n`)
    const folder = path.join(directory, 'a-directory')
    mkdirSync(folder)
    const missing = path.join(directory, 'not-there')
    const underFile = path.join(secretFile('a file'), 'secret')
    const cases: [string, string][] = [
      [missing, 'does not exist'],
      [underFile, 'does not exist (a part of its path is a file, not a directory)'],
      [folder, 'is a directory, not a file'],
      [notUtf8, 'is not UTF-8 text: save it in UTF-8'],
      [empty, 'is empty'],
      [lineEnding, 'holds nothing but a line ending'],
      [withBom, 'begins with a byte-order mark (BOM), which would be read as part of the value: save it as UTF-8 without a BOM'],
      [large, 'is larger than 64 KiB: a secret file holds the value alone'],
      // a device read without end, were it read whole
      ['/dev/zero', 'is larger than 64 KiB: a secret file holds the value alone'],
    ]
    const { WEBHOOK_SECRETS: _, ...rest } = production
    for (const [file, reason] of cases) {
      expect(problemsOf({ ...rest, WEBHOOK_SECRETS_FILE: file }), file).toEqual([`WEBHOOK_SECRETS_FILE: the file ${file} ${reason}`])
    }
    // the whole message: the content of none of them
    const message = (() => {
      try {
        parseConfig({ ...rest, WEBHOOK_SECRETS_FILE: withBom })
      } catch (error) {
        return (error as Error).message
      }
    })()
    expect(message).toMatch(/^Invalid configuration \[config_invalid\]\n {2}- WEBHOOK_SECRETS_FILE: /)
    expect(message).not.toContain(WEBHOOK_SECRET)
  })

  it('says every file that cannot be used at once, before anything else, and writes nothing in local mode', () => {
    const dataDir = path.join(directory, 'local-data')
    const problems = problemsOf({ DATA_DIR: dataDir, WEBHOOK_SECRETS_FILE: path.join(directory, 'gone-1'), ADMIN_TOKEN_FILE: path.join(directory, 'gone-2'), PORT: 'eighty' })
    expect(problems).toEqual([
      `WEBHOOK_SECRETS_FILE: the file ${path.join(directory, 'gone-1')} does not exist`,
      `ADMIN_TOKEN_FILE: the file ${path.join(directory, 'gone-2')} does not exist`,
    ])
    // local mode would have generated a webhook secret in DATA_DIR in the file's stead
    expect(existsSync(dataDir)).toBe(false)
  })

  it('refuses a path an env file slipped a carriage return or a space into, as the variable’s own value', () => {
    const file = secretFile(`${WEBHOOK_SECRET}\n`)
    const { WEBHOOK_SECRETS: _, ...rest } = production
    expect(problemsOf({ ...rest, WEBHOOK_SECRETS_FILE: `${file}\r` })).toEqual(['WEBHOOK_SECRETS_FILE: holds a carriage return (an env file saved with Windows line endings?)'])
    expect(problemsOf({ ...rest, WEBHOOK_SECRETS_FILE: `${file} ` })).toEqual(['WEBHOOK_SECRETS_FILE: begins or ends with a space, which is kept as part of the value: remove it'])
  })

  it('shows a path’s control characters escaped, on the message’s one line', () => {
    const { WEBHOOK_SECRETS: _, ...rest } = production
    const odd = path.join(directory, 'odd\u001b[2Jname')
    expect(problemsOf({ ...rest, WEBHOOK_SECRETS_FILE: odd })).toEqual(['WEBHOOK_SECRETS_FILE: holds a control character (a tab, a line break)'])
    const bidi = path.join(directory, 'odd\u202ename')
    expect(problemsOf({ ...rest, WEBHOOK_SECRETS_FILE: bidi })).toEqual([`WEBHOOK_SECRETS_FILE: the file ${path.join(directory, 'odd\\u202ename')} does not exist`])
  })
})

describe('the value a file gives', () => {
  it('gets every check of the variable’s: length, form, published secrets, a token shared with another role', () => {
    expect(problemsOf(fromFile('WEBHOOK_SECRETS', 'short\n'))).toEqual([
      expect.stringMatching(/^WEBHOOK_SECRETS \(from WEBHOOK_SECRETS_FILE=.*secret-\d+\): secret #1 is shorter than 24 characters$/),
    ])
    expect(problemsOf(fromFile('PARTNER_API_SECRET', 'short\n'))).toEqual([
      expect.stringMatching(/^PARTNER_API_SECRET \(from PARTNER_API_SECRET_FILE=.*\): is shorter than 24 characters$/),
    ])
    const live = { ...production, PARTNER_ENV: 'live', DATABASE_URL: 'postgres://db.internal/escrow', PARTNER_LIVE_API_KEY_ID: 'pk_live_1' }
    expect(problemsOf({ ...live, PARTNER_LIVE_API_SECRET_FILE: secretFile('short\n') })).toEqual([
      expect.stringMatching(/^PARTNER_LIVE_API_SECRET \(from PARTNER_LIVE_API_SECRET_FILE=.*\): is shorter than 24 characters$/),
    ])
    expect(problemsOf(fromFile('WEBHOOK_SECRETS', `${PUBLISHED_SECRETS[1]}\n`))).toEqual([
      expect.stringMatching(/^WEBHOOK_SECRETS \(from WEBHOOK_SECRETS_FILE=.*\): is a placeholder this repository publishes/),
    ])
    expect(problemsOf({ ...production, ADMIN_TOKEN_FILE: secretFile(`${WEBHOOK_SECRET}\n`) })).toEqual([
      expect.stringMatching(/^ADMIN_TOKEN \(from ADMIN_TOKEN_FILE=.*\): is the same as WEBHOOK_SECRETS; /),
    ])
    expect(problemsOf({ ...production, FORWARD_URL: 'https://receiver.example/', FORWARD_SECRET_FILE: secretFile('not-a-whsec-secret\n') })).toEqual([
      expect.stringMatching(/^FORWARD_SECRET \(from FORWARD_SECRET_FILE=.*\): the secret does not start with whsec_ \(each is whsec_ followed by the base64/),
    ])
    const url = 'postgres://partner:pass#word@db.internal/escrow'
    const problems = problemsOf({ ...production, DATABASE_URL_FILE: secretFile(`${url}\n`) })
    expect(problems).toEqual([expect.stringMatching(/^DATABASE_URL \(from DATABASE_URL_FILE=.*\): is not a URL node-postgres can read/)])
    expect(problems.join('\n')).not.toContain('pass#word')
    expect(problemsOf({ ...production, AMQP_URL_FILE: secretFile('http://user:amqp-pass@broker\n') })).toEqual([
      expect.stringMatching(/^AMQP_URL \(from AMQP_URL_FILE=.*\): must be an amqp:\/\/ or amqps:\/\/ URL/),
    ])
    // and what follows from it: a FORWARD_SECRET in a file without FORWARD_URL
    expect(problemsOf({ ...production, FORWARD_SECRET_FILE: secretFile(`whsec_${Buffer.alloc(32, 1).toString('base64')}\n`) })).toEqual([
      expect.stringMatching(/^FORWARD_SECRET \(from FORWARD_SECRET_FILE=.*\): is set but FORWARD_URL is not/),
    ])
  })
})

describe('the names', () => {
  it('are read: neither warned of as unread nor taken for a near miss, and a near miss of one is named with it', () => {
    for (const name of SECRET_FILE_VARIABLES) expect(READ_VARIABLES).toContain(`${name}_FILE`)
    expect(READ_VARIABLES).toEqual(expect.arrayContaining(['SANDBOX_WEBHOOK_SECRET_FILE', 'SANDBOX_API_SECRET_FILE']))
    expect(unreadVariablesOf({ WEBHOOK_SECRETS_FILE: '/run/secrets/webhook', PARTNER_LIVE_API_SECRET_FILE: '/run/secrets/api' })).toEqual([])
    expect(unreadVariablesOf({ WEBHOOK_SECRET_FILE: '/run/secrets/webhook', ADMIN_TOKEN_FIlE: '/x', AMQP_URL_FILES: '/y' })).toEqual([
      { name: 'ADMIN_TOKEN_FIlE', nearest: 'ADMIN_TOKEN_FILE' },
      { name: 'AMQP_URL_FILES', nearest: 'AMQP_URL_FILE' },
      { name: 'WEBHOOK_SECRET_FILE', nearest: 'WEBHOOK_SECRETS_FILE' },
    ])
  })

  it('a near miss of DATABASE_URL_FILE is refused while no DATABASE_URL is given, as one of DATABASE_URL', () => {
    expect(problemsOf({ ...production, DATABSE_URL_FILE: '/run/secrets/database-url' })).toEqual([
      'DATABSE_URL_FILE: is not a variable the service reads: did you mean DATABASE_URL_FILE? Without DATABASE_URL the service would run on ' +
        'an embedded database of its own in DATA_DIR (each replica on its own); rename it to DATABASE_URL_FILE, or unset it',
    ])
    expect(parseConfig({ ...production, DATABASE_URL_FILE: secretFile('postgres://db.internal/escrow\n'), DATABASE_URL_FIEL: '/x' }).unreadVariables).toEqual([
      { name: 'DATABASE_URL_FIEL', nearest: 'DATABASE_URL_FILE' },
    ])
  })
})

describe('a command looking for the service running from DATA_DIR', () => {
  it('reads DATABASE_URL_FILE as the service would, and refuses one it cannot read', () => {
    const url = 'postgres://partner:secret@db.internal/escrow'
    expect(runningServiceLookup({ DATA_DIR: directory, DATABASE_URL_FILE: secretFile(`${url}\n`) })).toEqual({ dataDir: directory, databaseUrl: url, mode: 'local' })
    expect(() => runningServiceLookup({ DATA_DIR: directory, DATABASE_URL_FILE: path.join(directory, 'nowhere') })).toThrow(ConfigError)
  })
})

describe('a file readable by other users', () => {
  it('is read without a warning (Docker and Kubernetes mount secrets 0444 and 0644 by default)', () => {
    const file = secretFile(`${WEBHOOK_SECRET}\n`)
    chmodSync(file, 0o644)
    const { WEBHOOK_SECRETS: _, ...rest } = production
    expect(parseConfig({ ...rest, WEBHOOK_SECRETS_FILE: file }).webhook.secrets).toEqual([WEBHOOK_SECRET])
  })
})
