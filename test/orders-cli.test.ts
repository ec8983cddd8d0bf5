import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createApp } from '../src/http/app.js'
import { runCommand } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const config = testConfig()

describe('orders and deliveries commands', () => {
  let database: TestDatabase
  const run = (...args: string[]) => runCommand(args, database.db, config)

  beforeAll(async () => {
    database = await createTestDatabase()
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
    await sendWebhook(app, { body: tradePayload('cli-1', 'funded'), deliveryId: 'dlv-cli-1' })
    await sendWebhook(app, { body: '{"event":"seller.verified","seller_id":"s"}', deliveryId: 'dlv-cli-seller' })
  })
  afterAll(async () => {
    await database.close()
  })

  it('creates an order and applies the webhook parked for it', async () => {
    const result = await run('orders', 'create', '--external-reference', 'cli-1', '--json')
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toMatchObject({ externalReference: 'cli-1', tradeStatus: 'funded', appliedDeliveries: 1 })
  })

  it("says what became of each parked webhook it applies: a trade already another order's is a trade_mismatch, not a status", async () => {
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
    // cli-1's trade, named by a webhook for cli-4: linking it here too would give one trade two orders
    await sendWebhook(app, { body: tradePayload('cli-4', 'funded', 'trd_cli-1'), deliveryId: 'dlv-cli-4-other-trade' })
    const mismatch = await run('orders', 'create', '--external-reference', 'cli-4')
    expect(mismatch).toEqual({
      code: 0,
      stdout: expect.stringMatching(/^created order cli-4 \(id \d+\)\nparked webhook dlv-cli-4-other-trade: trade_mismatch\n$/),
      stderr: '',
    })
    expect(JSON.parse((await run('orders', 'show', 'cli-4', '--json')).stdout)).toMatchObject({ tradeStatus: null, history: [] })

    await sendWebhook(app, { body: tradePayload('cli-5', 'funded', 'trd_cli-1'), deliveryId: 'dlv-cli-5-other-trade' })
    await sendWebhook(app, { body: tradePayload('cli-5', 'funded'), deliveryId: 'dlv-cli-5' })
    const both = await run('orders', 'create', '--external-reference', 'cli-5', '--json')
    expect(both.code).toBe(0)
    expect(JSON.parse(both.stdout)).toMatchObject({
      tradeStatus: 'funded',
      appliedDeliveries: 2,
      parkedDeliveries: [
        { deliveryId: 'dlv-cli-5-other-trade', outcome: 'trade_mismatch', toStatus: null },
        { deliveryId: 'dlv-cli-5', outcome: 'applied', toStatus: 'funded' },
      ],
    })

    await sendWebhook(app, { body: tradePayload('cli-6', 'funded'), deliveryId: 'dlv-cli-6' })
    const applied = await run('orders', 'create', '--external-reference', 'cli-6')
    expect(applied.stdout).toMatch(/^created order cli-6 \(id \d+\)\nparked webhook dlv-cli-6: applied \(order status funded\)\n$/)
    // none parked: the one line
    expect((await run('orders', 'create', '--external-reference', 'cli-7')).stdout).toMatch(/^created order cli-7 \(id \d+\)\n$/)
  })

  it('refuses with exit 2 a reference no webhook could carry: over 200 characters, empty, or holding a NUL or a lone surrogate', async () => {
    for (const reference of ['r'.repeat(201), '', 'order\u0000-1', 'order-\ud800']) {
      const result = await run('orders', 'create', '--external-reference', reference)
      expect(result.code).toBe(2)
      expect(result.stderr).toBe(
        'Invalid order: external_reference: must be 1 to 200 characters without a NUL or a lone surrogate, as every webhook for the order carries it [invalid_arguments]\n',
      )
    }
    expect((await run('orders', 'create', '--external-reference', 'r'.repeat(200))).code).toBe(0)
    const orders = JSON.parse((await run('orders', 'list', '--json')).stdout) as { externalReference: string }[]
    expect(orders.map((order) => order.externalReference.length)).not.toContain(201)
  })

  it('refuses a second order with the same reference with exit 1 and its code, with --json too', async () => {
    for (const json of [[], ['--json']]) {
      expect(await run('orders', 'create', '--external-reference', 'cli-1', ...json)).toEqual({
        code: 1,
        stdout: '',
        stderr: 'An order with external reference cli-1 already exists [order_exists]\n',
      })
    }
  })

  it('shows an order with its history, as JSON and as text', async () => {
    const json = await run('orders', 'show', 'cli-1', '--json')
    expect(json.code).toBe(0)
    expect(JSON.parse(json.stdout)).toMatchObject({
      tradeStatus: 'funded',
      tradeId: 'trd_cli-1',
      history: [{ fromStatus: null, toStatus: 'funded', source: 'webhook', deliveryId: 'dlv-cli-1' }],
    })
    const text = await run('orders', 'show', 'cli-1')
    expect(text.stdout).toContain('status     funded (by webhook)')
    expect(text.stdout).toMatch(/funded\s+webhook\s+dlv-cli-1/)
  })

  // found in review: a create marked and not yet sent is stored with a negative trade_create_wait_ms, and --json
  // printed that number as it was (`"tradeCreateWaitMs": -20000`), where the text says `pending (marked, not sent)`
  it('says a pending create marked and not sent in a field of its own in --json, with no negative whole time', async () => {
    const marks = [
      { reference: 'cli-mark-unsent', waitMs: -20_000, text: 'pending (marked, not sent)', sent: false },
      { reference: 'cli-mark-sent', waitMs: 20_000, text: 'pending', sent: true },
    ]
    for (const mark of marks) {
      expect((await run('orders', 'create', '--external-reference', mark.reference)).code).toBe(0)
      await database.db
        .updateTable('orders')
        .set({ tradeCreateState: 'pending', tradeCreateWaitMs: mark.waitMs })
        .where('externalReference', '=', mark.reference)
        .execute()
      const text = await run('orders', 'show', mark.reference)
      expect(text.stdout).toMatch(new RegExp(`\ncreate +${mark.text.replace(/[()]/g, '\\$&')}\n`))
      const json = await run('orders', 'show', mark.reference, '--json')
      expect(json.code).toBe(0)
      expect(JSON.parse(json.stdout)).toMatchObject({ tradeCreateState: 'pending', tradeCreateSent: mark.sent, tradeCreateWaitMs: 20_000 })
      expect(json.stdout).not.toMatch(/-20000/)
    }
    const listed = JSON.parse((await run('orders', 'list', '--json')).stdout) as Record<string, unknown>[]
    expect(listed.find((order) => order.externalReference === 'cli-mark-unsent')).toMatchObject({ tradeCreateSent: false, tradeCreateWaitMs: 20_000 })
    expect(listed.find((order) => order.externalReference === 'cli-1')).toMatchObject({ tradeCreateSent: null })
  })

  it('exits 1 for an unknown order and 2 for bad arguments', async () => {
    for (const json of [[], ['--json']]) {
      expect(await run('orders', 'show', 'nope', ...json)).toEqual({
        code: 1,
        stdout: '',
        stderr: 'No order with external reference nope [order_not_found]\n',
      })
    }
    const bad = await run('orders', 'list', '--limit', '-3')
    expect(bad.code).toBe(2)
    expect(bad.stderr).toContain('must be a whole number from 1 to 10000')
    expect((await run('orders', 'create')).code).toBe(2)
  })

  it('refuses with exit 2 a --limit past the largest exact integer, before the database sees it', async () => {
    for (const [command, limit] of [['orders', '1e300'], ['deliveries', '1e19'], ['orders', '9007199254740993']] as const) {
      const result = await run(command, 'list', '--limit', limit)
      expect(result.code).toBe(2)
      expect(result.stderr).toContain(`argument '${limit}' is invalid. must be a whole number from 1 to 10000`)
      expect(result.stderr).not.toContain('bigint')
    }
  })

  it('takes a whole-number option in decimal digits alone: 0x10, 1e2, +5, 5.0 or a space around it is refused with exit 2', async () => {
    for (const value of ['0x10', '0b11', '1e2', '+5', '5.0', ' 5']) {
      for (const args of [
        ['orders', 'list', '--limit', value],
        ['deliveries', 'list', '--limit', value],
        ['reactions', 'list', '--limit', value],
        ['demo', '--trades', value],
      ]) {
        const result = await run(...args)
        expect({ code: result.code, stdout: result.stdout }, args.join(' ')).toEqual({ code: 2, stdout: '' })
        expect(result.stderr).toContain(`argument '${value}' is invalid. must be a whole number from 1 to`)
      }
      const seed = await run('demo', '--seed', value)
      expect([seed.code, seed.stdout]).toEqual([2, ''])
      expect(seed.stderr).toContain(`argument '${value}' is invalid. must be a whole number`)
      for (const option of ['--seed', '--retry-base-delay-ms', '--delay-ms']) {
        const sandbox = await run('sandbox', option, value)
        expect([sandbox.code, sandbox.stdout], `sandbox ${option} ${value}`).toEqual([2, ''])
        expect(sandbox.stderr).toContain(`argument '${value}' is invalid. must be a whole number`)
      }
    }
    expect((await run('orders', 'list', '--limit', '016')).code).toBe(0)
  })

  it('refuses a sandbox wait past the timers\' limit, which would end after 1 ms, with exit 2', async () => {
    for (const option of ['--retry-base-delay-ms', '--attempt-timeout-ms', '--refund-delay-ms', '--delay-ms']) {
      const sandbox = await run('sandbox', option, String(2 ** 31))
      expect([sandbox.code, sandbox.stdout], `sandbox ${option}`).toEqual([2, ''])
      expect(sandbox.stderr).toContain(`argument '${2 ** 31}' is invalid. must be at most ${2 ** 31 - 1} ms`)
    }
  })

  it('lists at most 10,000 rows at once: a larger --limit is refused with exit 2, as the listing is held whole in memory', async () => {
    for (const command of ['orders', 'deliveries', 'reactions']) {
      const result = await run(command, 'list', '--limit', '10001')
      expect(result.code).toBe(2)
      expect(result.stderr).toContain(`argument '10001' is invalid. must be a whole number from 1 to 10000`)
      expect((await run(command, 'list', '--limit', '10000')).code).toBe(0)
    }
  })

  it('lists orders and deliveries, filtered by outcome', async () => {
    const orders = JSON.parse((await run('orders', 'list', '--json')).stdout)
    expect(orders.map((order: { externalReference: string }) => order.externalReference)).toContain('cli-1')
    const ignored = JSON.parse((await run('deliveries', 'list', '--outcome', 'ignored', '--json')).stdout)
    expect(ignored.map((delivery: { deliveryId: string }) => delivery.deliveryId)).toEqual(['dlv-cli-seller'])
    expect((await run('deliveries', 'list', '--outcome', 'nonsense')).code).toBe(2)
  })

  it('shows one delivery with its raw body', async () => {
    const result = await run('deliveries', 'show', 'dlv-cli-1', '--json')
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toMatchObject({
      deliveryId: 'dlv-cli-1',
      outcome: 'applied',
      rawBody: JSON.stringify(tradePayload('cli-1', 'funded')),
    })
    expect((await run('deliveries', 'show', 'dlv-none')).code).toBe(1)
  })

  it('exits 1 for an unknown delivery, its line ending in [delivery_not_found]', async () => {
    for (const command of ['show', 'reapply']) {
      expect(await run('deliveries', command, 'dlv-none')).toEqual({ code: 1, stdout: '', stderr: 'No delivery dlv-none [delivery_not_found]\n' })
      expect(await run('deliveries', command, 'dlv-cli-1', '--body-sha256', 'ffff', '--json')).toEqual({
        code: 1,
        stdout: '',
        stderr: 'No delivery dlv-cli-1 with body SHA-256 ffff… [delivery_not_found]\n',
      })
    }
  })

  it('reapplies a stored delivery: a no-op when its effect is already there, refused for non-trade events', async () => {
    const before = JSON.parse((await run('deliveries', 'show', 'dlv-cli-1', '--json')).stdout)
    expect(before).toMatchObject({ outcome: 'applied', appliedAt: expect.any(String) })
    const again = await run('deliveries', 'reapply', 'dlv-cli-1', '--json')
    expect(again.code).toBe(0)
    expect(JSON.parse(again.stdout)).toMatchObject({ outcome: 'duplicate_effect' })
    // the row still says it moved its order, and when: a re-apply that changed nothing does not rewrite that
    const after = JSON.parse((await run('deliveries', 'show', 'dlv-cli-1', '--json')).stdout)
    expect([after.outcome, after.appliedAt]).toEqual(['applied', before.appliedAt])
    const seller = await run('deliveries', 'reapply', 'dlv-cli-seller')
    expect([seller.code, seller.stdout]).toEqual([1, ''])
    expect(seller.stderr).toMatch(
      /^Delivery dlv-cli-seller is a [a-z_.]+ event, and no event handler takes it \(registerEventHandlers, src\/webhooks\/partner-event-handlers\.ts\): only trade events and the events a handler takes have an effect to re-run \[not_a_trade_event\]\n$/,
    )
  })

  // it was refused as `[not_a_trade_event]`, a trade event whose payload failed the checks, and `show` never said why
  describe('a delivery stored as invalid', () => {
    // a trade event that contradicts itself, its event holding an escape sequence: text from outside, shown escaped
    const contradicting = '{"event":"trade.released\\u001b[2J","trade_id":"trd_cli-inv","status":"funded","external_reference":"cli-inv"}'
    const shownEvent = 'trade.released\\u001b[2J'

    beforeAll(async () => {
      const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
      await sendWebhook(app, { body: contradicting, deliveryId: 'dlv-cli-invalid' })
      await sendWebhook(app, { body: { ...tradePayload('cli-inv', 'funded'), trade_id: '' }, deliveryId: 'dlv-cli-invalid-field' })
      await sendWebhook(app, { body: '{"trade_id":"trd_cli-inv","trade_id":"trd_other","status":"funded","external_reference":"cli-inv"}', deliveryId: 'dlv-cli-invalid-key' })
    })

    it('reapply: exit 1, [invalid_delivery], saying it was stored as invalid and why, nothing reapplied', async () => {
      const result = await run('deliveries', 'reapply', 'dlv-cli-invalid')
      expect(result).toEqual({
        code: 1,
        stdout: '',
        stderr:
          `Delivery dlv-cli-invalid (${shownEvent}) was stored as invalid: its event ${shownEvent} is not trade.{status} of its status. ` +
          "Nothing of an invalid payload is applied, so there is no effect to re-run: the trade's status comes with the platform's next delivery, " +
          "or its order's next poll [invalid_delivery]\n",
      })
      expect(JSON.parse((await run('deliveries', 'show', 'dlv-cli-invalid', '--json')).stdout)).toMatchObject({ outcome: 'invalid', appliedAt: null })
    })

    it('show: says why in text and in --json (invalidReason), the outsider text escaped in text', async () => {
      const text = await run('deliveries', 'show', 'dlv-cli-invalid')
      expect(text.code).toBe(0)
      expect(text.stdout).toContain(`\ninvalidReason      its event ${shownEvent} is not trade.{status} of its status\nrawBody `)
      expect(text.stdout).not.toContain('\u001b')
      const json = JSON.parse((await run('deliveries', 'show', 'dlv-cli-invalid', '--json')).stdout)
      expect(json.invalidReason).toBe('its event trade.released\u001b[2J is not trade.{status} of its status')
      expect(JSON.parse((await run('deliveries', 'show', 'dlv-cli-invalid-field', '--json')).stdout)).toMatchObject({
        outcome: 'invalid',
        invalidReason: 'missing or not a non-empty string (≤ 200 characters, no NUL or lone surrogate): trade_id',
      })
      expect(JSON.parse((await run('deliveries', 'show', 'dlv-cli-invalid-key', '--json')).stdout).invalidReason).toBe('duplicate key "trade_id"')
      // a delivery that is not invalid has no reason to give
      expect(JSON.parse((await run('deliveries', 'show', 'dlv-cli-1', '--json')).stdout)).not.toHaveProperty('invalidReason')
    })

    it('show, once the raw body is pruned: the reason is not known, and says so', async () => {
      await database.db.updateTable('webhookDeliveries').set({ rawBody: null }).where('deliveryId', '=', 'dlv-cli-invalid-key').execute()
      expect(JSON.parse((await run('deliveries', 'show', 'dlv-cli-invalid-key', '--json')).stdout)).toMatchObject({ invalidReason: null })
      expect((await run('deliveries', 'show', 'dlv-cli-invalid-key')).stdout).toContain('\ninvalidReason      (not known: the raw body it is read from was pruned)\n')
      expect((await run('deliveries', 'reapply', 'dlv-cli-invalid-key')).stderr).toMatch(
        /^Delivery dlv-cli-invalid-key \(trade\.funded\) was stored as invalid \(why is not known: its raw body was pruned\)\. .* \[invalid_delivery\]\n$/,
      )
    })
  })

  // it re-ran the first body found, saying nothing of the others
  it('refuses to pick one of the bodies of a reused delivery id: exit 2, nothing reapplied, until --body-sha256 names one', async () => {
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
    await sendWebhook(app, { body: tradePayload('cli-reused', 'funded'), deliveryId: 'dlv-cli-reused' })
    await sendWebhook(app, { body: tradePayload('cli-reused', 'delivered'), deliveryId: 'dlv-cli-reused' })
    const refused = await run('deliveries', 'reapply', 'dlv-cli-reused')
    expect(refused).toEqual({
      code: 2,
      stdout: '',
      stderr:
        'Delivery dlv-cli-reused was reused: 2 bodies are stored under it; pick one with --body-sha256 (`deliveries list` shows ' +
        'each body hash); nothing was reapplied [invalid_arguments]\n',
    })
    const listed = JSON.parse((await run('deliveries', 'list', '--json')).stdout) as { deliveryId: string; bodySha256: string; observedStatus: string }[]
    const funded = listed.find((delivery) => delivery.deliveryId === 'dlv-cli-reused' && delivery.observedStatus === 'funded')!
    const picked = await run('deliveries', 'reapply', 'dlv-cli-reused', '--body-sha256', funded.bodySha256.slice(0, 12), '--json')
    expect(picked.code).toBe(0)
    expect(JSON.parse(picked.stdout)).toMatchObject({ deliveryId: 'dlv-cli-reused', outcome: 'unmatched' })
  })

  it("reapplies all or nothing: when the delivery's new outcome cannot be written, the order does not move either", async () => {
    const app = createApp({ config, db: database.db, logger: testLogger(), clock: systemClock })
    await sendWebhook(app, { body: tradePayload('cli-3', 'funded'), deliveryId: 'dlv-cli-3' })
    // an order created behind the service's back, so the delivery stays parked for a reapply
    await sql`insert into orders (external_reference) values ('cli-3')`.execute(database.db)
    await sql`create function refuse_dlv_cli_3() returns trigger language plpgsql as $$
      begin
        if new.delivery_id = 'dlv-cli-3' then raise exception 'refused by the test'; end if;
        return new;
      end $$`.execute(database.db)
    await sql`create trigger refuse_dlv_cli_3 before update on webhook_deliveries
      for each row execute function refuse_dlv_cli_3()`.execute(database.db)
    try {
      const failed = await run('deliveries', 'reapply', 'dlv-cli-3')
      expect(failed.code).toBe(1)
      expect(failed.stderr).toContain('refused by the test')
      const order = JSON.parse((await run('orders', 'show', 'cli-3', '--json')).stdout)
      expect(order).toMatchObject({ tradeStatus: null, history: [] })
      const delivery = JSON.parse((await run('deliveries', 'show', 'dlv-cli-3', '--json')).stdout)
      expect(delivery).toMatchObject({ outcome: 'unmatched' })
    } finally {
      await sql`drop trigger refuse_dlv_cli_3 on webhook_deliveries`.execute(database.db)
      await sql`drop function refuse_dlv_cli_3()`.execute(database.db)
    }
    const reapplied = await run('deliveries', 'reapply', 'dlv-cli-3', '--json')
    expect(JSON.parse(reapplied.stdout)).toMatchObject({ outcome: 'applied', toStatus: 'funded' })
    expect(JSON.parse((await run('deliveries', 'show', 'dlv-cli-3', '--json')).stdout)).toMatchObject({ outcome: 'applied' })
  })
})
