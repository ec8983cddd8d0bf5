// The compiled `serve` whose stdout reader stops reading without going away (`npm start | less` left on one
// page, a stuck log shipper): what stdout holds in memory is bounded by LOG_BUFFER_LIMIT, the lines past it are
// dropped and counted (log_lines_dropped_total), and once the reader reads again one warning says how many.
// Before, every line was kept: 75 MB more resident after 417,000 deliveries, without end.
import { randomUUID } from 'node:crypto'
import { afterAll, describe, expect, it } from 'vitest'
import type { ChildProcess } from 'node:child_process'
import { freePort, receiverEnv, spawnCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const DELIVERIES = 6_000
const SENDERS = 8

describe('the compiled serve when its stdout is not read', () => {
  const kills: (() => void)[] = []
  afterAll(() => {
    for (const kill of kills) kill()
  })

  it.each([
    ['JSON lines', 'false'],
    ['LOG_PRETTY lines', 'true'],
  ])('holds at most LOG_BUFFER_LIMIT, counts the lines it drops, and says how many once read again (%s)', async (_lines, logPretty) => {
    const adminPort = await freePort()
    const env = { ...receiverEnv(migratedDataDir('stdout-stalled-')), ADMIN_PORT: String(adminPort) }
    const child = spawnCli(['serve'], { ...env, LOG_BUFFER_LIMIT: '256kb', LOG_PRETTY: logPretty })
    kills.push(() => child.kill('SIGKILL'))
    const url = await Promise.race([
      listeningUrl(child),
      new Promise<never>((_, reject) => setTimeout(() => reject(new Error('serve did not say it listens within 120 s')), 120_000).unref()),
    ])
    // the reader stops: the pipe fills (64 kB), then the service holds what it writes
    child.stdout!.pause()

    // one stored delivery, then the same again: a duplicate is answered from memory and logged, at full speed
    const body = JSON.stringify(tradePayload(`stalled-${randomUUID()}`, 'funded'))
    const id = `stalled-${randomUUID()}`
    const send = async () => {
      const response = await fetch(`${url}/webhooks/partner`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-partner-delivery-id': id, 'x-partner-signature': signBody(body) },
        body,
      })
      await response.arrayBuffer()
      return response.status
    }
    expect(await send()).toBe(200)
    let sent = 1
    await Promise.all(
      Array.from({ length: SENDERS }, async () => {
        while (sent < DELIVERIES) {
          sent += 1
          expect(await send()).toBe(200)
        }
      }),
    )

    // read again, up to the warning
    let output = ''
    child.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString()
    })
    child.stdout!.resume()
    for (let waited = 0; !output.includes('log lines dropped'); waited += 1) {
      if (waited > 600) throw new Error('no "log lines dropped" line within 60 s')
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    const lines = output.split('\n')
    // {"lines":N} in a JSON line and at the end of a LOG_PRETTY one
    const reported = lines
      .filter((line) => line.includes('log lines dropped'))
      .reduce((sum, line) => sum + Number(/"lines":(\d+)/.exec(line)![1]), 0)
    const metrics = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text()
    const dropped = Number(/^log_lines_dropped_total (\d+)$/m.exec(metrics)?.[1])
    // 256 kB held and 64 kB in the pipe of about 1.2 MB logged: most lines were dropped
    expect(dropped).toBeGreaterThan(DELIVERIES / 2)
    expect(reported).toBe(dropped)
    // every delivery's line was written or counted
    const received = lines.filter((line) => /"msg":"webhook received"|INFO: webhook received/.test(line)).length
    expect(received + dropped).toBe(DELIVERIES)
    expect(received).toBeGreaterThan(0)
  })
})

// the public listener's URL from the line that says so, JSON or LOG_PRETTY (its fields as JSON at the end)
function listeningUrl(child: ChildProcess): Promise<string> {
  return new Promise((resolve, reject) => {
    let output = ''
    const onData = (chunk: Buffer) => {
      output += chunk.toString()
      const line = output.split('\n').find((candidate) => candidate.includes('service listening') && candidate.endsWith('}'))
      const found = line && /"url":"([^"]+)"/.exec(line)
      if (!found) return
      child.stdout!.off('data', onData)
      resolve(found[1]!)
    }
    child.stdout!.on('data', onData)
    child.once('exit', (code) => reject(new Error(`serve exited with ${code} before listening:\n${output}`)))
  })
}
