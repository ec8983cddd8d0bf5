// A command beside a running service on Postgres runs in that service when its DATABASE_URL names the service's
// database. 127.0.0.1 and localhost name one server: `DATABASE_URL=postgres://…@localhost:15432/db` beside a service
// on 127.0.0.1:15432/db was refused as naming another database, exit 2 [wrong_database].
import { describe, expect, it } from 'vitest'
import { databaseIdentity, sameLocation } from '../src/local/running-service.js'

const location = (url: string) => databaseIdentity({ databaseUrl: url, dataDir: '/tmp/unused' }).location

describe('the Postgres database a DATABASE_URL names', () => {
  it('is the same on any of the loopback names, and on no other host, port or database', () => {
    const service = location('postgres://app@127.0.0.1:15432/escrow')
    for (const same of ['postgres://app@localhost:15432/escrow', 'postgres://app@[::1]:15432/escrow', 'postgres://app@LOCALHOST:15432/escrow']) {
      expect(sameLocation(service, location(same)), same).toBe(true)
    }
    for (const other of ['postgres://app@127.0.0.1:5432/escrow', 'postgres://app@localhost:15432/other', 'postgres://app@db.internal:15432/escrow', 'postgres://app@127.0.0.2:15432/escrow']) {
      expect(sameLocation(service, location(other)), other).toBe(false)
    }
    // the default port written out or not
    expect(sameLocation(location('postgres://app@localhost/escrow'), location('postgres://app@127.0.0.1:5432/escrow'))).toBe(true)
  })
})
