// The data directory's free space, read every interval: under the minimum the guard is low (deliveries and
// /readyz answer 503: webhooks-contract and disk-full tests), and it says so once per change, not per reading.
import { describe, expect, it } from 'vitest'
import { watchStorage } from '../src/db/storage-guard.js'
import { logLines, testLogger } from './helpers/log-sink.js'

const MB = 1024 * 1024

// a reading at a time: each call waits for the test to give the next value
function readings() {
  const queue: ((value: number | Error) => void)[] = []
  const calls: string[] = []
  return {
    calls,
    read: (directory: string) => {
      calls.push(directory)
      return new Promise<number>((resolve, reject) => {
        queue.push((value) => (value instanceof Error ? reject(value) : resolve(value)))
      })
    },
    async give(value: number | Error) {
      for (let waited = 0; queue.length === 0; waited += 1) {
        if (waited > 1_000) throw new Error('no reading was asked for')
        await new Promise((resolve) => setTimeout(resolve, 1))
      }
      queue.shift()!(value)
      // let the guard take it in
      await new Promise((resolve) => setTimeout(resolve, 5))
    },
  }
}

const linesWith = (message: string) => logLines.filter((line) => line.includes(message))

describe('watchStorage', () => {
  it('turns low under the minimum and back at or over it, logging each change once', async () => {
    const source = readings()
    const guard = watchStorage({ directory: '/data', minFreeBytes: 100 * MB, logger: testLogger(), intervalMs: 1, readFreeBytes: source.read })
    try {
      expect(guard.low).toBe(false)
      expect(guard.freeBytes).toBeUndefined()
      await source.give(500 * MB)
      expect(guard).toMatchObject({ low: false, freeBytes: 500 * MB })
      await source.give(99 * MB)
      expect(guard.low).toBe(true)
      await source.give(50 * MB)
      expect(guard).toMatchObject({ low: true, freeBytes: 50 * MB })
      await source.give(100 * MB)
      expect(guard.low).toBe(false)
      expect(source.calls.every((directory) => directory === '/data')).toBe(true)
      expect(linesWith('the data directory is almost full')).toHaveLength(1)
      expect(JSON.parse(linesWith('the data directory is almost full')[0]!)).toMatchObject({ level: 50, freeMb: 99, minFreeMb: 100, dataDir: '/data' })
      expect(linesWith('the data directory has space again')).toHaveLength(1)
    } finally {
      guard.stop()
    }
  })

  it('keeps its last state while the free space cannot be read, and warns once', async () => {
    const source = readings()
    const guard = watchStorage({ directory: '/gone', minFreeBytes: 100 * MB, logger: testLogger(), intervalMs: 1, readFreeBytes: source.read })
    try {
      await source.give(10 * MB)
      expect(guard.low).toBe(true)
      await source.give(Object.assign(new Error('gone'), { code: 'ENOENT' }))
      await source.give(Object.assign(new Error('gone'), { code: 'ENOENT' }))
      expect(guard.freeBytes).toBeUndefined()
      // the last reading stands until one succeeds
      expect(guard.low).toBe(true)
      expect(linesWith("cannot read the data directory's free space").filter((line) => line.includes('/gone'))).toHaveLength(1)
    } finally {
      guard.stop()
    }
  })
})
