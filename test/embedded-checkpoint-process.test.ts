// The compiled `serve` on embedded PGlite on disk keeps its write-ahead log (DATA_DIR/pglite/pg_wal) bounded: PGlite
// runs Postgres without a checkpointer, and the database's thread checkpoints by Postgres's rule from max_wal_size
// (src/db/pglite-worker.mjs). Here max_wal_size is its least, 32 MB (DATA_DIR_MAX_WAL), and the deliveries carry
// large bodies, so that a few seconds of them write several times that. Without the checkpoints pg_wal grew by every
// byte written. And a checkpoint loses nothing committed: the process killed (SIGKILL) after the checkpoints and
// started again has every delivery it answered 200.
import type { ChildProcess } from 'node:child_process'
import { randomBytes, randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { readdirSync, statSync } from 'node:fs'
import path from 'node:path'
import { afterAll, describe, expect, it, vi } from 'vitest'
import { receiverEnv, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { postDelivery, tradePayload } from './helpers/webhook-delivery.js'

const MB = 1024 * 1024
// DATA_DIR_MAX_WAL: a checkpoint once the log is a 16-MB segment past the last one's redo point
const MAX_WAL_MB = 32
// what a checkpoint leaves (measured: 32 MB after every round): the segment being written and one kept for recycling
// (min_wal_size 32 MB), and a segment of slack; without the checkpoints, 64 MB after the first round and more after
// every other
const BOUND_MB = MAX_WAL_MB + 16
// each round writes 24 MB of bodies (they do not compress), past a checkpoint's threshold; three of them 72 MB (without
// the checkpoints pg_wal passed the bound in the first; six rounds, as before 2026-12-06, cost twice the CPU)
const ROUNDS = 3
const PER_ROUND = 120
const BODY_NOTE_BYTES = 200 * 1024

describe('the compiled serve on embedded PGlite on disk, a long ingest', () => {
  const dataDir = migratedDataDir('checkpoint-')
  const wal = path.join(dataDir, 'pglite', 'pg_wal')
  const children: ChildProcess[] = []
  afterAll(() => {
    for (const child of children) child.kill('SIGKILL')
  })

  const walMb = () => {
    let total = 0
    for (const name of readdirSync(wal)) {
      try {
        total += statSync(path.join(wal, name)).size
      } catch {
        // removed meanwhile by a checkpoint
      }
    }
    return total / MB
  }

  async function start() {
    const child = spawnCli(['serve'], { ...receiverEnv(dataDir), DATA_DIR_MAX_WAL: `${MAX_WAL_MB}mb`, WEBHOOK_BODY_LIMIT: '256kb' })
    children.push(child)
    const { url } = await waitForLogLine(child, 'service listening')
    return { child, url: String(url) }
  }

  // a delivery for an order the service does not have (stored, parked), its body made large by a field the
  // service does not read; random bytes, so that the database cannot compress it
  const delivery = () => {
    const payload = { ...tradePayload(`checkpoint-${randomUUID()}`, 'funded'), note: randomBytes(BODY_NOTE_BYTES / 2).toString('hex') }
    return { id: `checkpoint-${randomUUID()}`, body: JSON.stringify(payload) }
  }

  it('checkpoints as it goes, pg_wal staying under max_wal_size and a segment, and a kill after the checkpoints loses nothing', async () => {
    const first = await start()
    const answered: { id: string; body: string }[] = []
    const afterRounds: number[] = []
    for (let round = 0; round < ROUNDS; round++) {
      for (let index = 0; index < PER_ROUND; index += 4) {
        const batch = Array.from({ length: 4 }, delivery)
        const answers = await Promise.all(batch.map((each) => postDelivery(first.url, each)))
        expect(answers.map(({ status }) => status)).toEqual([200, 200, 200, 200])
        answered.push(...batch)
      }
      // the thread looks once a second: the round's log is checkpointed and its old segments removed, however long
      // the look takes to come on a busy machine (without the checkpoints pg_wal only grew)
      await vi.waitFor(() => expect(walMb()).toBeLessThanOrEqual(BOUND_MB), { timeout: 60_000, interval: 200 })
      afterRounds.push(Math.round(walMb()))
    }
    // a few deliveries more after the last checkpoint: the restart replays them from the log
    for (let index = 0; index < 4; index++) {
      const each = delivery()
      expect((await postDelivery(first.url, each)).status).toBe(200)
      answered.push(each)
    }
    const exited = once(first.child, 'exit')
    first.child.kill('SIGKILL')
    await exited

    const second = await start()
    const again = []
    for (const each of answered) again.push(await postDelivery(second.url, each))
    expect(again.filter(({ status, answer }) => status !== 200 || answer.duplicate !== true)).toEqual([])
    console.warn(`PGlite, DATA_DIR_MAX_WAL=${MAX_WAL_MB}mb: pg_wal after each of ${ROUNDS} rounds of ${PER_ROUND * BODY_NOTE_BYTES / MB} MB: ${afterRounds.join(', ')} MB; ${answered.length} deliveries, every one a duplicate after SIGKILL and a restart`)
    const stopped = once(second.child, 'exit')
    second.child.kill('SIGTERM')
    expect((await stopped)[0]).toBe(0)
  }, 600_000)
})
