// A log line a fault repeats for every request (every delivery refused in an outage): one a second at most,
// and every one accounted for, written or counted in a written one's `suppressed`.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import { systemClock } from '../src/clock.js'
import { openDatabase } from '../src/db/open-database.js'
import { createApp } from '../src/http/app.js'
import { limitLines, limitLinesBy } from '../src/limit-lines.js'
import { taggedLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { pgliteTemplate } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

describe('limitLines', () => {
  beforeEach(() => {
    vi.useFakeTimers()
  })
  afterEach(() => {
    vi.useRealTimers()
  })

  it('writes the first of each second at once and the last of the rest at its end, with how many it stands for', () => {
    const written: { n: number; suppressed?: number }[] = []
    const line = limitLines((fields: { n: number }) => written.push(fields))
    line({ n: 1 })
    expect(written).toEqual([{ n: 1 }])
    for (let n = 2; n <= 10; n += 1) line({ n })
    expect(written).toHaveLength(1)
    vi.advanceTimersByTime(1_000)
    expect(written).toEqual([{ n: 1 }, { n: 10, suppressed: 8 }])
    // the interval began again with that line: one more within it waits for its end
    line({ n: 11 })
    expect(written).toHaveLength(2)
    vi.advanceTimersByTime(1_000)
    expect(written.at(-1)).toEqual({ n: 11 })
    // after a quiet interval the next is written at once
    vi.advanceTimersByTime(5_000)
    line({ n: 12 })
    expect(written.at(-1)).toEqual({ n: 12 })
    const accounted = written.reduce((sum, fields) => sum + 1 + (fields.suppressed ?? 0), 0)
    expect(accounted).toBe(12)
  })

  it('writes the line held back at a flush, and nothing at the end of its second', () => {
    const written: { n: number; suppressed?: number }[] = []
    const line = limitLines((fields: { n: number }) => written.push(fields))
    line.flush()
    expect(written).toEqual([])
    for (let n = 1; n <= 4; n += 1) line({ n })
    line.flush()
    expect(written).toEqual([{ n: 1 }, { n: 4, suppressed: 2 }])
    vi.advanceTimersByTime(5_000)
    expect(written).toHaveLength(2)
  })
})

describe('limitLinesBy', () => {
  beforeEach(() => {
    vi.useFakeTimers()
  })
  afterEach(() => {
    vi.useRealTimers()
  })

  it('limits each key on its own: the first line of a key is written at once whatever the others do', () => {
    const written: { key: string; n: number; suppressed?: number }[] = []
    const line = limitLinesBy((fields: { key: string; n: number }) => fields.key, (fields) => written.push(fields), { forgetPast: 2 })
    for (let n = 1; n <= 5; n += 1) line({ key: 'a', n })
    line({ key: 'b', n: 6 })
    expect(written).toEqual([
      { key: 'a', n: 1 },
      { key: 'b', n: 6 },
    ])
    line({ key: 'b', n: 7 })
    vi.advanceTimersByTime(1_000)
    expect(written.slice(2)).toEqual([
      { key: 'a', n: 5, suppressed: 3 },
      { key: 'b', n: 7 },
    ])
    // quiet keys are forgotten once more than `forgetPast` are kept; their counts were written before
    vi.advanceTimersByTime(5_000)
    line({ key: 'c', n: 8 })
    line({ key: 'a', n: 9 })
    expect(written.slice(4)).toEqual([
      { key: 'c', n: 8 },
      { key: 'a', n: 9 },
    ])
    expect(written.reduce((sum, fields) => sum + 1 + (fields.suppressed ?? 0), 0)).toBe(9)
  })

  it('flushes every key: each held line is written at once, the quiet keys write nothing', () => {
    const written: { key: string; n: number; suppressed?: number }[] = []
    const line = limitLinesBy((fields: { key: string; n: number }) => fields.key, (fields) => written.push(fields))
    for (let n = 1; n <= 3; n += 1) line({ key: 'a', n })
    line({ key: 'b', n: 4 })
    line.flush()
    expect(written).toEqual([
      { key: 'a', n: 1 },
      { key: 'b', n: 4 },
      { key: 'a', n: 3, suppressed: 1 },
    ])
    vi.advanceTimersByTime(5_000)
    expect(written).toHaveLength(3)
  })
})

describe('the webhook endpoint with its database gone', () => {
  it('answers every delivery 503 and writes "webhook not stored" once a second, counting the rest', async () => {
    const config = testConfig()
    const database = openDatabase({ dataDir: 'memory://', pgliteTemplate: pgliteTemplate(false) })
    await database.close()
    // the app's own lines: another file's in the same worker are not its (log-sink.ts, taggedLogger), and a limited
    // line's summary comes up to a second later
    const own = taggedLogger(config.webhook.secrets)
    const app = createApp({ config, db: database.db, logger: own.logger, clock: systemClock })
    const before = own.lines().length
    const started = Date.now()
    const answers = await Promise.all(
      Array.from({ length: 40 }, (_, index) => sendWebhook(app, { body: tradePayload(`gone-${index}`, 'funded'), deliveryId: `gone-${index}` })),
    )
    const elapsedS = (Date.now() - started) / 1_000
    expect(answers.map((answer) => [answer.status, answer.body.error?.code])).toEqual(Array(40).fill([503, 'database_unavailable']))
    // the last of them is written at the end of its second
    await new Promise((resolve) => setTimeout(resolve, 1_100))
    const lines = own
      .lines()
      .slice(before)
      .map((line) => JSON.parse(line) as { msg: string; deliveryId?: string; suppressed?: number })
      .filter((line) => line.msg === 'webhook not stored')
    expect(lines.every((line) => line.deliveryId?.startsWith('gone-'))).toBe(true)
    expect(lines.reduce((sum, line) => sum + 1 + (line.suppressed ?? 0), 0)).toBe(40)
    expect(lines.length).toBeLessThanOrEqual(2 + Math.ceil(elapsedS))
  })
})

describe('the webhook endpoint refusing signatures', () => {
  it('answers every delivery with a wrong signature 401 and writes "webhook signature rejected" once a second, counting the rest', async () => {
    const config = testConfig()
    const database = openDatabase({ dataDir: 'memory://', pgliteTemplate: pgliteTemplate(false) })
    try {
      const own = taggedLogger(config.webhook.secrets)
      const app = createApp({ config, db: database.db, logger: own.logger, clock: systemClock })
      const before = own.lines().length
      const started = Date.now()
      // anyone who can reach the URL can send these: the log must not grow with them
      const answers = await Promise.all(
        Array.from({ length: 40 }, (_, index) => sendWebhook(app, { body: tradePayload(`forged-${index}`, 'funded'), deliveryId: `forged-${index}`, secret: 'not-the-secret-0123456789abcdef' })),
      )
      const elapsedS = (Date.now() - started) / 1_000
      expect(answers.map((answer) => [answer.status, answer.body.error?.code])).toEqual(Array(40).fill([401, 'invalid_signature']))
      // the last of them is written at the end of its second
      await new Promise((resolve) => setTimeout(resolve, 1_100))
      const lines = own
        .lines()
        .slice(before)
        .map((line) => JSON.parse(line) as { msg: string; deliveryId?: string; suppressed?: number })
        .filter((line) => line.msg === 'webhook signature rejected')
      expect(lines.every((line) => line.deliveryId?.startsWith('forged-'))).toBe(true)
      expect(lines.reduce((sum, line) => sum + 1 + (line.suppressed ?? 0), 0)).toBe(40)
      expect(lines.length).toBeLessThanOrEqual(2 + Math.ceil(elapsedS))
    } finally {
      await database.close()
    }
  })
})
