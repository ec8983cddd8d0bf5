// Text from outside shown by the CLI: a webhook's fields and raw body, the platform's trade record. A
// terminal acts on control codes (ESC sequences retitle the window, clear the screen, recolour or hide
// text; a carriage return or a line feed forges a line), so none reaches the output as it is.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { sql } from 'kysely'
import { systemClock } from '../src/clock.js'
import { createApp } from '../src/http/app.js'
import { runCommand, runCommandWith } from './helpers/cli-in-process.js'
import { childEnv } from './helpers/cli-process.js'
import { testLogger } from './helpers/log-sink.js'
import { tradeRecord } from './helpers/partner-api-fixtures.js'
import { type RecordingServer, startRecordingServer } from './helpers/partner-api-recording-server.js'
import { TEST_API_SECRET, testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook } from './helpers/webhook-delivery.js'
import { DELIVERY_ID_RULE } from '../src/webhooks/delivery-id.js'

// every control a terminal acts on, but the line feed and tab our own output is laid out with
// eslint-disable-next-line no-control-regex
const TERMINAL_CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/

// an OSC that retitles the window, a CSI that clears the screen, its one-byte C1 form, a carriage return
// and a line feed followed by what would read as a row or a field of its own
const STATUS = 'funded\u001b]0;owned\u0007\u001b[2J\u009b31m'
const REFERENCE = 'esc-1\rforged-order  released\nforged-row  released'
const TRADE_REFERENCE = 'TRD-1\u0085\u007fforged'

// what reorders the text after it (RLO, LRI, PDI, RLM), shows nothing (zero-width space, BOM) or breaks a line
// where a viewer honours it (the line separator)
const SPOOFED_REFERENCE = 'invoice\u202efdp.exe'
const SPOOFED_TRADE_REFERENCE = 'TRD\u2066\u200b-1\u2069\u200f\ufeff\u2028x'
const INVISIBLE = /[\u061c\u200b-\u200f\u202a-\u202e\u2028\u2029\u2060\u2066-\u2069\ufeff]/

function expectNoControl(output: string) {
  expect(output).not.toMatch(TERMINAL_CONTROL)
  expect(output.split('\n').some((line) => line.startsWith('forged'))).toBe(false)
}

describe('the CLI shows text from outside without its control codes', () => {
  let database: TestDatabase
  let platform: RecordingServer
  const config = testConfig()
  const run = (...args: string[]) => runCommand(args, database.db, config)

  beforeAll(async () => {
    database = await createTestDatabase()
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
    const body = JSON.stringify({ trade_id: 'trd_esc-1', reference: TRADE_REFERENCE, status: STATUS, external_reference: REFERENCE })
    const stored = await sendWebhook(app, { body, deliveryId: 'dlv-esc-1' })
    expect(stored.status).toBe(200)
    // the order is made for the parked delivery, which is then applied to it
    expect((await run('orders', 'create', '--external-reference', REFERENCE)).code).toBe(0)
  })
  afterAll(async () => {
    await platform?.close()
    await database.close()
  })

  it('an argument refused by the parser is quoted with its controls shown', async () => {
    // the operator's own, but a pasted id can carry an escape: commander's message quoted it raw
    const result = await run('reactions', 'show', '2\u001b[31m3\r4')
    expect(result.code).toBe(2)
    expect(result.stderr).toContain("command-argument value '2\\u001b[31m3\\u000d4' is invalid for argument 'id'")
    expect(result.stderr).not.toMatch(TERMINAL_CONTROL)

    // a line feed too: the message is one line, then commander's own hint
    const fed = await run('reactions', 'show', '2\nforged-row\t3')
    expect(fed.code).toBe(2)
    expect(fed.stderr.split('\n')[0]).toBe(
      "error: command-argument value '2\\u000aforged-row\\u00093' is invalid for argument 'id'. must be a job id (a positive whole number) [invalid_arguments]",
    )
    expect(fed.stderr.split('\n').some((line) => line.startsWith('forged'))).toBe(false)

    // an unknown command's line feed, beside commander's suggestion, which keeps its own line
    const unknown = await run('order\n')
    expect(unknown.code).toBe(2)
    expect(unknown.stderr.split('\n').slice(0, 2)).toEqual(["error: unknown command 'order\\u000a' [unknown_command]", '(Did you mean orders?)'])
  })

  it('a refused argument is quoted shortened, and a URL in it without its password', async () => {
    const long = `${'7'.repeat(10_000)}x`
    // commander's refusal, and a command's own that quotes the value
    for (const args of [['reactions', 'show', long], ['webhook', 'send', '--file', 'body.json', `--url=ftp://${'r'.repeat(9_995)}`]]) {
      const refused = await run(...args)
      expect(refused.code).toBe(2)
      expect(refused.stderr.length).toBeLessThan(1_000)
      expect(refused.stderr).toContain('… (10,001 characters)')
    }
    const url = await run('reactions', 'show', 'https://operator:hunter2@gw.example/x')
    expect(url.code).toBe(2)
    expect(url.stderr).toContain("value 'https://operator:***@gw.example/x' is invalid")
    expect(url.stderr).not.toContain('hunter2')
    // a command's own refusal that quotes one (exit 1), and a password holding a raw @
    // (not `orders show`: a reference past 200 characters is refused as no order's, exit 2, without quoting it)
    // (a delivery id past 200 characters is refused as the receiver refuses it, exit 2, without quoting it)
    const tooLong = await run('deliveries', 'show', `${'b'.repeat(10_000)}`)
    expect(tooLong).toMatchObject({ code: 2, stderr: `Invalid delivery id: must be ${DELIVERY_ID_RULE}, as the receiver takes it [invalid_arguments]\n` })
    const delivery = await run('deliveries', 'show', 'https://user:Tr0ub4dor@3xyz@x/')
    expect(delivery.code).toBe(1)
    expect(delivery.stderr).toContain('https://user:***@x/')
    expect(delivery.stderr).not.toContain('3xyz')
  })

  it('orders list and show: every control shown as \\uXXXX, no forged line', async () => {
    const list = await run('orders', 'list')
    expect(list.code).toBe(0)
    expectNoControl(list.stdout)
    expect(list.stdout).toContain('esc-1\\u000dforged-order  released\\u000aforged-row  released')

    const show = await run('orders', 'show', REFERENCE)
    expect(show.code).toBe(0)
    expectNoControl(show.stdout)
    // a status the service does not know is stored with the delivery, not applied to the order
    expect(show.stdout).toContain('trade      trd_esc-1 TRD-1\\u0085\\u007fforged')

    const missing = await run('orders', 'show', 'nope\u001b[2J')
    expect(missing.code).toBe(1)
    expect(missing.stderr).toBe('No order with external reference nope\\u001b[2J [order_not_found]\n')
  })

  it('a one-line message quoting a reference or an id shows its line feed and tab too: no forged line', async () => {
    // printed through the output that keeps line feeds and tabs on purpose (a result laid out in lines, as the
    // service forwards it): the value in the line is escaped whole where the line is made
    const reference = 'lf-1\nforged  released\tx'
    const shown = 'lf-1\\u000aforged  released\\u0009x'
    const created = await run('orders', 'create', '--external-reference', reference)
    const { id } = JSON.parse((await run('orders', 'show', reference, '--json')).stdout) as { id: number }
    expect({ code: created.code, stdout: created.stdout }).toEqual({ code: 0, stdout: `created order ${shown} (id ${id})\n` })

    const requeued = await run('reconcile', '--requeue', reference)
    expect({ code: requeued.code, stdout: requeued.stdout }).toEqual({
      code: 0,
      stdout: `${shown}: attention cleared; not polled (no trade id or a terminal status)\n`,
    })

    const noTrade = await run('trades', 'get', reference)
    expect({ code: noTrade.code, stderr: noTrade.stderr }).toEqual({
      code: 1,
      stderr: `Order ${shown} has no trade yet (trade create state: none) [no_trade]\n`,
    })

    // a delivery id with a line feed is none the receiver takes: refused before it is looked up, and not quoted
    const noDelivery = await run('deliveries', 'reapply', 'dlv-1\nforged  applied')
    expect({ code: noDelivery.code, stderr: noDelivery.stderr }).toEqual({
      code: 2,
      stderr: `Invalid delivery id: must be ${DELIVERY_ID_RULE}, as the receiver takes it [invalid_arguments]\n`,
    })

    const badMilestone = await run('trades', 'open', 'lf-2', '--title', 't', '--amount', '1.00', '--currency', 'EUR', '--milestone', 'frame\nforged')
    expect({ code: badMilestone.code, stderr: badMilestone.stderr }).toEqual({
      code: 2,
      stderr: '--milestone must be "title:amount", e.g. "Frame:70.00"; got "frame\\u000aforged" [invalid_arguments]\n',
    })
  })

  it('deliveries list and show, the raw body included', async () => {
    const list = await run('deliveries', 'list')
    expectNoControl(list.stdout)
    expect(list.stdout).toContain('trade.funded\\u001b]0;owned\\u0007\\u001b[2J\\u009b31m')

    const show = await run('deliveries', 'show', 'dlv-esc-1')
    expect(show.code).toBe(0)
    expectNoControl(show.stdout)
    // the body as received: JSON escapes the C0 controls itself; DEL and the C1 controls it leaves are shown
    expect(show.stdout).toContain('"reference":"TRD-1\\u0085\\u007fforged"')
  })

  it('--json keeps the values exact: the escapes are JSON’s own', async () => {
    const show = await run('orders', 'show', REFERENCE, '--json')
    expectNoControl(show.stdout)
    expect(JSON.parse(show.stdout)).toMatchObject({ externalReference: REFERENCE, tradeReference: TRADE_REFERENCE })
    const delivery = await run('deliveries', 'show', 'dlv-esc-1', '--json')
    expectNoControl(delivery.stdout)
    expect(JSON.parse(delivery.stdout)).toMatchObject({ eventType: `trade.${STATUS}`, externalReference: REFERENCE })
  })

  it('bidirectional and invisible characters shown as \\uXXXX: a reference cannot read reversed or look like another', async () => {
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
    const body = JSON.stringify({ trade_id: 'trd_bidi-1', reference: SPOOFED_TRADE_REFERENCE, status: 'funded', external_reference: SPOOFED_REFERENCE })
    expect((await sendWebhook(app, { body, deliveryId: 'dlv-bidi-1' })).status).toBe(200)
    expect((await run('orders', 'create', '--external-reference', SPOOFED_REFERENCE)).code).toBe(0)

    const outputs = [
      await run('orders', 'list'),
      await run('orders', 'show', SPOOFED_REFERENCE),
      await run('deliveries', 'list'),
      await run('deliveries', 'show', 'dlv-bidi-1'),
    ]
    for (const { code, stdout } of outputs) {
      expect(code).toBe(0)
      expect(stdout).not.toMatch(INVISIBLE)
      expect(stdout).toContain('invoice\\u202efdp.exe')
    }
    expect(outputs[1]!.stdout).toContain('TRD\\u2066\\u200b-1\\u2069\\u200f\\ufeff\\u2028x')

    const json = await run('orders', 'show', SPOOFED_REFERENCE, '--json')
    expect(json.stdout).not.toMatch(INVISIBLE)
    expect(JSON.parse(json.stdout)).toMatchObject({ externalReference: SPOOFED_REFERENCE, tradeReference: SPOOFED_TRADE_REFERENCE })
  })

  it('trades get: the platform’s record', async () => {
    platform = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({
        status: 200,
        body: tradeRecord({
          trade_id: 'trd_esc-1',
          reference: TRADE_REFERENCE,
          status: STATUS,
          external_reference: REFERENCE,
          milestones: [{ milestone_id: 'm_1', title: 'frame\nforged-milestone', amount: '1.00', status: 'pending' }],
        }),
      }),
    })
    const context = { config: testConfig({ PARTNER_API_BASE_URL: platform.url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
    const get = await runCommandWith(['trades', 'get', REFERENCE], context)
    expect(get.code).toBe(0)
    expectNoControl(get.stdout)
    expect(get.stdout).toContain('milestone m_1 frame\\u000aforged-milestone 1.00: pending')
  })

  it('a refusal of the platform: its message and fields shortened for a person, each on its own line', async () => {
    const fields = Array.from({ length: 300 }, (_, i) => ({ field: `field_${i}`, message: `${'m'.repeat(2_000)}${i}` }))
    fields[0] = { field: 'currency', message: 'unknown\nforged-line: the platform accepted it' }
    const refusing = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({
        status: 422,
        body: { error: { code: 'validation_failed', message: `${'w'.repeat(200_000)}END`, fields } },
      }),
    })
    try {
      const context = { config: testConfig({ PARTNER_API_BASE_URL: refusing.url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
      for (const args of [['trades', 'fund', REFERENCE], ['trades', 'fund', REFERENCE, '--json']]) {
        const refused = await runCommandWith(args, context)
        expect(refused.code).toBe(1)
        expect(refused.stdout).toBe('')
        const lines = refused.stderr.split('\n')
        expect(lines[0]).toMatch(/^The platform refused \(422 validation_failed\): w{500}… \(200,003 characters\) \[invalid_request\]$/)
        expect(lines[1]).toBe('  currency: unknown\\u000aforged-line: the platform accepted it')
        expect(lines[2]).toMatch(/^ {2}field_1: m{500}… \(2,001 characters\)$/)
        expect(lines).toHaveLength(1 + 20 + 1 + 1)
        expect(lines[21]).toBe('  … and 280 more fields')
        expect(refused.stderr.length).toBeLessThan(20_000)
        expectNoControl(refused.stderr)
      }
    } finally {
      await refusing.close()
    }
  })

  it('a refusal whose fields are not a list of fields: the status and code, and what there is to show', async () => {
    const refusing = await startRecordingServer({
      secret: TEST_API_SECRET,
      answer: () => ({ status: 422, body: { error: { code: 'validation_failed', message: 42, fields: ['currency\nforged', { field: 7 }] } } }),
    })
    try {
      const context = { config: testConfig({ PARTNER_API_BASE_URL: refusing.url }), logger: testLogger([TEST_API_SECRET]), db: database.db }
      const refused = await runCommandWith(['trades', 'fund', REFERENCE], context)
      expect(refused.code).toBe(1)
      expect(refused.stderr).toBe('The platform refused (422 http_422) [invalid_request]\n  currency\\u000aforged\n  7: ?\n')
      const notAList = await startRecordingServer({
        secret: TEST_API_SECRET,
        answer: () => ({ status: 422, body: { error: { code: 'validation_failed', message: 'no', fields: 'currency' } } }),
      })
      try {
        const other = await runCommandWith(['trades', 'fund', REFERENCE], { ...context, config: testConfig({ PARTNER_API_BASE_URL: notAList.url }) })
        expect(other.stderr).toBe('The platform refused (422 validation_failed): no [invalid_request]\n')
      } finally {
        await notAList.close()
      }
    } finally {
      await refusing.close()
    }
  })

  // found from outside: a database refusal other than an outage (a trigger of a DBA's quoting the row, a revoked
  // permission) was printed as the database's words alone, with no code, a webhook's values and line feeds raw
  it("a database's refusal: its words escaped, with its SQLSTATE and a code", async () => {
    const reference = 'trigger-ref\u001b]0;PWN\u0007\r\nforged-row  released'
    await sql`create function refuse_orders() returns trigger language plpgsql as $$
      begin raise exception 'refused ext=%', new.external_reference; end $$`.execute(database.db)
    await sql`create trigger refuse_orders before insert on orders for each row execute function refuse_orders()`.execute(database.db)
    try {
      const result = await run('orders', 'create', '--external-reference', reference)
      expect(result.code).toBe(1)
      expectNoControl(result.stderr)
      expect(result.stderr).toBe(
        'The database refused the command: refused ext=trigger-ref\\u001b]0;PWN\\u0007\\u000d\\u000aforged-row  released (SQLSTATE P0001) [database_error]\n',
      )
    } finally {
      await sql`drop trigger refuse_orders on orders`.execute(database.db)
      await sql`drop function refuse_orders()`.execute(database.db)
    }
  })
})

describe('the readable log lines (LOG_PRETTY) show text from outside without its control codes', () => {
  it('in a field, and in an error’s message and stack, which pino-pretty prints as they are', async () => {
    const script = [
      "import { createLogger, exitProcess, flushLogger } from './src/logger.ts'",
      'const logger = createLogger({ level: "info", pretty: true })',
      `const error = new Error(${JSON.stringify(`the platform said: ${STATUS}`)})`,
      `logger.warn({ eventType: ${JSON.stringify(`trade.${STATUS}`)}, err: error }, 'webhook payload invalid')`,
      'await flushLogger(logger, 10_000)',
      'exitProcess(logger, 0)',
    ].join('\n')
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], {
      cwd: path.resolve(import.meta.dirname, '..'),
      env: childEnv({}),
      stdio: ['ignore', 'pipe', 'inherit'],
    })
    let stdout = ''
    child.stdout.on('data', (chunk) => {
      stdout += chunk
    })
    const [code] = await once(child, 'close')
    expect(code).toBe(0)
    expect(stdout).toContain('WARN: webhook payload invalid')
    expect(stdout).not.toMatch(TERMINAL_CONTROL)
    // the stack as it is, but for its controls; the message as JSON, its backslashes escaped once more
    expect(stdout).toContain('Error: the platform said: funded\\u001b]0;owned\\u0007\\u001b[2J\\u009b31m\n')
    expect(stdout).toContain('"message": "the platform said: funded\\\\u001b]0;owned\\\\u0007\\\\u001b[2J\\\\u009b31m"')
  })

})
