// The reorder fault holds an event so that its trade's next one overtakes it. An event with no next one (the last of
// its trade, or every event at a rate of 1) used to be held for ever: never sent, and absent from the delivery log.
// Now it goes out when its hold ends, and the log shows it as held while it waits.
import { afterEach, describe, expect, it } from 'vitest'
import { createSandbox, type Sandbox } from '../src/sandbox/create-sandbox.js'
import type { DeliveryAttempt } from '../src/sandbox/webhook-dispatcher.js'
import { rememberSecret, testLogger } from './helpers/log-sink.js'
import { sandboxClient } from './helpers/sandbox-client.js'
import { startRecordingReceiver } from './helpers/sandbox-receiver.js'

const keyId = 'pk_sandbox_reorder'
const apiSecret = 'sandbox-reorder-api-secret-0123456789'
const webhookSecret = 'sandbox-reorder-webhook-secret-01234'
const controlToken = 'sandbox-reorder-control-token-0123456789'
rememberSecret(apiSecret, webhookSecret, controlToken)

const trade = (reference: string) => ({ title: 'Reorder', amount: '10.00', currency: 'EUR', seller_id: 's-1', external_reference: reference })

async function deliveries(base: string): Promise<DeliveryAttempt[]> {
  const response = await fetch(`${base}/sandbox/deliveries`, { headers: { authorization: `Bearer ${controlToken}` } })
  expect(response.status).toBe(200)
  return (await response.json()) as DeliveryAttempt[]
}

async function waitFor(condition: () => boolean | Promise<boolean>, ms: number): Promise<void> {
  const until = Date.now() + ms
  while (!(await condition())) {
    if (Date.now() > until) throw new Error(`not within ${ms} ms`)
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
}

describe('the reorder fault’s hold', () => {
  let sandbox: Sandbox | undefined
  let receiver: Awaited<ReturnType<typeof startRecordingReceiver>> | undefined
  afterEach(async () => {
    await sandbox?.close()
    await receiver?.close()
  })

  async function start(faults: { reorderRate: number; seed: number }, reorderHoldMs?: number) {
    receiver = await startRecordingReceiver(webhookSecret)
    sandbox = createSandbox({
      keyId,
      apiSecret,
      webhookSecret,
      controlToken,
      webhookUrl: receiver.url,
      faults,
      ...(reorderHoldMs === undefined ? {} : { reorderHoldMs }),
      logger: testLogger(),
    })
    const base = await sandbox.listen(0)
    return { base, client: sandboxClient(base, { keyId, secret: apiSecret }), received: receiver.received }
  }

  it('at a rate of 1, shows each event as held, then sends it when its hold ends', async () => {
    // a hold long enough that the event is still held when the log is read, on a loaded machine too
    const { base, client, received } = await start({ reorderRate: 1, seed: 1 }, 2_000)
    const started = Date.now()
    const { trade_id: tradeId } = await client.createTrade(trade('reorder-all-1'))
    const [held] = await deliveries(base)
    expect(held).toMatchObject({ tradeId, status: 'created', attempt: 0, deliveryId: null, result: 'held' })
    expect(received).toEqual([])

    await waitFor(() => received.length === 1, 60_000)
    expect(Date.now() - started).toBeGreaterThanOrEqual(1_950)
    expect(received[0]!.body).toMatchObject({ trade_id: tradeId, status: 'created' })
    expect((await deliveries(base)).map((entry) => [entry.status, entry.attempt, entry.result])).toEqual([
      ['created', 0, 'held'],
      ['created', 1, 'delivered'],
    ])
  })

  it('sends the last event of every trade, whether a later one overtook those before it or not', async () => {
    // the reviewer's run: ten trades to released at a rate of 0.3, seed 5 (three released events held, never sent)
    const { base, client, received } = await start({ reorderRate: 0.3, seed: 5 }, 500)
    const statuses = ['created', 'funded', 'delivered', 'released']
    const tradeIds: string[] = []
    for (let i = 0; i < 10; i++) {
      const { trade_id: tradeId } = await client.createTrade(trade(`reorder-some-${i}`))
      tradeIds.push(tradeId)
      await client.fundTrade(tradeId)
      await client.deliverTrade(tradeId)
      await client.releaseTrade(tradeId)
    }
    await waitFor(() => received.length === 40, 60_000)
    const sent = (tradeId: string) =>
      received
        .filter((webhook) => webhook.body.trade_id === tradeId)
        .map((webhook) => String(webhook.body.status))
        .toSorted()
    for (const tradeId of tradeIds) expect(sent(tradeId)).toEqual(statuses.toSorted())
    const log = await deliveries(base)
    const held = log.filter((entry) => entry.result === 'held')
    // the fault did hold some events, the last of a trade among them
    expect(held.length).toBeGreaterThan(0)
    expect(held.some((entry) => entry.status === 'released')).toBe(true)
    // each held event was delivered later on
    for (const entry of held) expect(log.some((later) => later.eventId === entry.eventId && later.result === 'delivered')).toBe(true)
  })

  it('holds an event for 3 s at most by default', async () => {
    const { client, received } = await start({ reorderRate: 1, seed: 1 })
    const started = Date.now()
    await client.createTrade(trade('reorder-default-1'))
    await waitFor(() => received.length === 1, 60_000)
    expect(Date.now() - started).toBeGreaterThanOrEqual(2_900)
  })
})
