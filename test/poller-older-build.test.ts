// The due gauges (countDueOrders, what poller_orders_due and poller_oldest_due_age_seconds and the console read) while
// a poller of a build before migration 0020 claims and writes back beside this one, as in a rolling upgrade. That build
// writes neither poll_due_since nor poll_retry_at: run for real (its `serve` polling a platform that held every GET,
// this build's /metrics scraped), the gauges read 0 due and 0 s while its cycle held every due order, and each order
// from its backoff's end after a failed poll. Migration 0021's trigger gives its writes the two columns this build's
// own statements write.
import { sql } from 'kysely'
import { beforeEach, describe, expect, it } from 'vitest'
import { claimDueOrders, countDueOrders, rescheduleAfterError } from '../src/orders/poll-schedule.repository.js'
import { olderAnswer, olderClaim, olderFlag, olderRelease, olderRescheduleAfterError } from './helpers/older-poller.js'
import { insertOrders, orderByReference } from './helpers/reconcile-orders.js'
import { useTestDatabase } from './helpers/test-database.js'

const NOW = new Date('2026-03-01T12:00:00Z')
const seconds = (s: number) => new Date(NOW.getTime() + s * 1000)

describe('the due gauges beside a poller of a build before migration 0020', () => {
  const database = useTestDatabase()
  beforeEach(async () => {
    await database.db.deleteFrom('orders').execute()
  })

  it('count an order it holds and backs off from when it came due, and this build keeps that time, until a poll is answered', async () => {
    const [orderId] = await insertOrders(database.db, [{ externalReference: 'a', nextPollAt: seconds(-90) }])
    expect(await olderClaim(database.db, { now: NOW, leaseS: 300, leaseToken: 'older-1' })).toBe(1)
    // held by the older cycle (next_poll_at is its lease's end): read 0 and 0 without the trigger
    expect(await countDueOrders(database.db, seconds(10))).toEqual({ ordersDue: 1, oldestDueAgeS: 100 })

    // its poll fails, and it backs the order off to +40 s
    await olderRescheduleAfterError(database.db, { orderId: orderId!, leaseToken: 'older-1', nextPollAt: seconds(40) })
    expect(await countDueOrders(database.db, seconds(20))).toEqual({ ordersDue: 1, oldestDueAgeS: 110 })
    expect(await countDueOrders(database.db, seconds(50))).toEqual({ ordersDue: 1, oldestDueAgeS: 140 })

    // this build claims it and fails too; the older build claims it again: still due from -90 s
    expect((await claimDueOrders(database.db, { now: seconds(50), limit: 10, leaseS: 300, leaseToken: 'this-1' })).length).toBe(1)
    expect(await countDueOrders(database.db, seconds(60))).toEqual({ ordersDue: 1, oldestDueAgeS: 150 })
    await rescheduleAfterError(database.db, { orderId: orderId!, leaseToken: 'this-1', nextPollAt: seconds(120) })
    expect(await olderClaim(database.db, { now: seconds(130), leaseS: 300, leaseToken: 'older-2' })).toBe(1)
    expect(await countDueOrders(database.db, seconds(140))).toEqual({ ordersDue: 1, oldestDueAgeS: 230 })

    // the older build's poll is answered: due no more
    await olderAnswer(database.db, { orderId: orderId!, leaseToken: 'older-2', now: seconds(150), staleAfterS: 21_600 })
    expect(await countDueOrders(database.db, seconds(160))).toEqual({ ordersDue: 0, oldestDueAgeS: 0 })
    expect(await orderByReference(database.db, 'a')).toMatchObject({ pollDueSince: null, pollRetryAt: null, pollAttempts: 0 })
  })

  it('count a claim it gives back from its due time, and leave an order it flags or one rescheduled while its poll ran', async () => {
    const [given, flagged, rescheduled] = await insertOrders(database.db, [
      { externalReference: 'given-back', nextPollAt: seconds(-90), pollAttempts: 2 },
      { externalReference: 'flagged', nextPollAt: seconds(-80) },
      { externalReference: 'rescheduled', nextPollAt: seconds(-70) },
    ])
    expect(await olderClaim(database.db, { now: NOW, leaseS: 300, leaseToken: 'older-1' })).toBe(3)
    expect(await countDueOrders(database.db, seconds(10))).toEqual({ ordersDue: 3, oldestDueAgeS: 100 })

    await olderRelease(database.db, { orderId: given!, leaseToken: 'older-1', dueAt: seconds(-90) })
    await olderFlag(database.db, { orderId: flagged!, leaseToken: 'older-1', now: seconds(5) })
    // a webhook puts the poll 6 h on while the poll runs (it names no lease), and the poll then fails: that time stands
    await sql`update orders set next_poll_at = ${seconds(21_600)}, updated_at = ${seconds(5)} where id = ${rescheduled}`.execute(database.db)
    await olderRescheduleAfterError(database.db, { orderId: rescheduled!, leaseToken: 'older-1', nextPollAt: seconds(40) })

    expect(await countDueOrders(database.db, seconds(20))).toEqual({ ordersDue: 1, oldestDueAgeS: 110 })
    expect(await orderByReference(database.db, 'given-back')).toMatchObject({ pollAttempts: 2, pollLeaseToken: null })
    expect(await orderByReference(database.db, 'flagged')).toMatchObject({ pollDueSince: null, pollRetryAt: null, nextPollAt: null })
    expect(new Date((await orderByReference(database.db, 'rescheduled')).nextPollAt!).getTime()).toBe(seconds(21_600).getTime())
  })
})
