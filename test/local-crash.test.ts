// The compiled `serve` on its embedded database (PGlite in DATA_DIR, no Postgres) killed with SIGKILL while
// deliveries come in, then started again on the same directory: every delivery it answered 200 before the kill
// is stored (sent again, it is answered as a duplicate), and it takes new ones. What README.md promises of a
// crash in local mode ("what was committed is in DATA_DIR"), seen from outside.
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { randomUUID } from 'node:crypto'
import { afterAll, describe, expect, it } from 'vitest'
import { receiverEnv, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { postDelivery, tradePayload } from './helpers/webhook-delivery.js'

const SENDERS = 8
// deliveries answered 200 before the kill
const BEFORE_KILL = 400

describe('the compiled serve on PGlite, killed mid-ingest (SIGKILL)', () => {
  const dataDir = migratedDataDir('local-crash-')
  const children: ChildProcess[] = []
  afterAll(() => {
    for (const child of children) child.kill('SIGKILL')
  })

  async function start() {
    const child = spawnCli(['serve'], receiverEnv(dataDir))
    children.push(child)
    const { url } = await waitForLogLine(child, 'service listening')
    return { child, url: String(url) }
  }

  // a delivery for an order the service does not have (stored, parked until the order exists)
  const delivery = (index: number) => ({ id: `crash-${randomUUID()}`, body: JSON.stringify(tradePayload(`crash-${index}`, 'funded')) })

  it('keeps every delivery it answered 200, and starts again on the same directory', async () => {
    const first = await start()
    const answered: { id: string; body: string }[] = []
    let sent = 0
    let killed = false
    const exited = once(first.child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
    // senders keep going until the kill cuts their connections
    const senders = Array.from({ length: SENDERS }, async () => {
      while (!killed) {
        const next = delivery(sent++)
        try {
          const { status } = await postDelivery(first.url, next)
          if (status === 200) answered.push(next)
        } catch {
          return // the process is gone
        }
        if (answered.length >= BEFORE_KILL && !killed) {
          killed = true
          first.child.kill('SIGKILL')
        }
      }
    })
    await Promise.all(senders)
    expect(await exited).toEqual([null, 'SIGKILL'])

    const second = await start()
    const again = []
    for (const each of answered) again.push(await postDelivery(second.url, each))
    expect(again.filter(({ status, answer }) => status !== 200 || answer.duplicate !== true)).toEqual([])
    expect(await postDelivery(second.url, delivery(sent + 1))).toEqual({ status: 200, answer: { received: true } })
    console.warn(`PGlite, SIGKILL mid-ingest: ${answered.length} deliveries answered 200 of ${sent} sent before the kill; every one a duplicate after the restart`)
    const stopped = once(second.child, 'exit')
    second.child.kill('SIGTERM')
    expect((await stopped)[0]).toBe(0)
  }, 300_000)
})
