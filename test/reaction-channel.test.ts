// The NOTIFY channel of the reaction dispatchers is the schema's: services sharing a database in schemas of
// their own (and test files side by side) neither wake each other nor count each other's listeners.
import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { reactionChannel, reactionChannelSql } from '../src/db/reaction-channel.js'
import { eventually } from './helpers/reconcile-poller.js'
import { createTestDatabase, describePostgres, type TestDatabase } from './helpers/test-database.js'

describe('the reaction channel on the embedded database', () => {
  it('is reaction_jobs in the public schema', async () => {
    const database = await createTestDatabase({ kind: 'pglite' })
    try {
      expect(await reactionChannel(database.db)).toBe('reaction_jobs')
    } finally {
      await database.close()
    }
  })
})

describePostgres('the reaction channel of two services in schemas of one database (Postgres)', () => {
  let first: TestDatabase
  let second: TestDatabase
  beforeAll(async () => {
    first = await createTestDatabase({ kind: 'postgres' })
    second = await createTestDatabase({ kind: 'postgres' })
  })
  afterAll(async () => {
    await first?.close()
    await second?.close()
  })

  it("is each schema's own: one service's NOTIFY does not reach the other's listener, nor is that listener counted", async () => {
    const channels = [await reactionChannel(first.db), await reactionChannel(second.db)]
    expect(channels[0]).toMatch(/^reaction_jobs_[0-9a-f]{16}$/)
    expect(channels[1]).toMatch(/^reaction_jobs_[0-9a-f]{16}$/)
    expect(channels[0]).not.toBe(channels[1])

    const heard: string[] = []
    // a listener connects in the background, and looks once (no payload) when it listens
    const unlistenFirst = await first.listen(channels[0]!, (payload) => heard.push(`first ${payload ?? 'listening'}`))
    const unlistenSecond = await second.listen(channels[1]!, (payload) => heard.push(`second ${payload ?? 'listening'}`))
    try {
      await eventually(() => heard.includes('first listening') && heard.includes('second listening'), 'both listen')
      const notify = (database: TestDatabase, payload: string) => sql`select pg_notify(${reactionChannelSql}, ${payload})`.execute(database.db)
      await notify(first, 'from-first')
      await notify(second, 'from-second')
      await eventually(() => heard.includes('first from-first') && heard.includes('second from-second'), 'each service hears its own')
      // a NOTIFY after both: once it is heard, anything sent before it has been delivered too
      await notify(first, 'after')
      await eventually(() => heard.includes('first after'), 'the later NOTIFY is heard')
      expect(heard.sort()).toEqual([
        'first after',
        'first from-first',
        'first listening',
        'second from-second',
        'second listening',
      ])
      // each counts no listener of the other as a replica of its own
      await eventually(async () => (await first.otherListeners(channels[0]!)) === 0, "the first counts none of the second's")
      expect(await second.otherListeners(channels[1]!)).toBe(0)
    } finally {
      await unlistenFirst()
      await unlistenSecond()
    }
  })
})
