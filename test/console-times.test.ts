// A time typed in a console filter (the deliveries search, a bulk re-apply's range) is UTC, whatever the server's
// time zone, and written in one of the documented forms; any other text is a 400 naming the field. The console
// handed every text it did not recognise to Date: '2026-12-01 10:00' was read in the server's zone, '1' as
// 2001-01-01 (a review found it). The server's zone here is set to one five hours behind UTC.
import request from 'supertest'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { createAdminApp } from '../src/http/admin-app.js'
import type { App } from '../src/http/app.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'

const TOKEN = 'console-times-token-0123456789abcdef'

describe('console: the times typed in its filters', () => {
  let database: TestDatabase
  let admin: App
  const zone = process.env.TZ
  beforeAll(async () => {
    process.env.TZ = 'America/New_York'
    database = await createTestDatabase()
    admin = createAdminApp({ config: testConfig({ ADMIN_TOKEN: TOKEN }), db: database.db, logger: testLogger([TOKEN]) })
  })
  afterAll(async () => {
    if (zone === undefined) delete process.env.TZ
    else process.env.TZ = zone
    await database.close()
  })
  const get = (path: string, query: Record<string, string>) => request(admin).get(path).query(query).set('Authorization', `Bearer ${TOKEN}`)

  it('reads each documented form as UTC, in a search and a bulk re-apply alike, in a server five hours behind it', async () => {
    expect(new Date(2026, 11, 1, 10).toISOString()).toBe('2026-12-01T15:00:00.000Z')
    for (const [typed, read] of [
      ['2026-12-01 10:00', '2026-12-01T10:00:00.000Z'],
      ['2026-12-01T10:00', '2026-12-01T10:00:00.000Z'],
      ['2026-12-01T10:00Z', '2026-12-01T10:00:00.000Z'],
      ['2026-12-01 10:00:30', '2026-12-01T10:00:30.000Z'],
      ['2026-12-01T10:00:30.250Z', '2026-12-01T10:00:30.250Z'],
      [' 2026-12-01 ', '2026-12-01T00:00:00.000Z'],
    ] as const) {
      const search = await get('/console/deliveries', { from: typed })
      expect(search.status, typed).toBe(200)
      // the search box shows back the time it read
      expect(search.text, typed).toContain(`name="from" value="${read}"`)
      const dryRun = await get('/console/deliveries/reapply', { to: typed })
      expect(dryRun.status, typed).toBe(200)
      expect(dryRun.text, typed).toContain(`<input type="hidden" name="to" value="${read}">`)
    }
  })

  it('answers any other text with a 400 page naming the field and the forms it takes', async () => {
    for (const [path, field, typed] of [
      ['/console/deliveries', 'from', '1'],
      ['/console/deliveries', 'to', '2026-12-01T10:00+02:00'],
      ['/console/deliveries', 'from', 'Dec 1 2026 10:00'],
      ['/console/deliveries', 'to', '2026-12-01T10'],
      ['/console/deliveries', 'from', '2026-12-01T25:00'],
      ['/console/deliveries/reapply', 'from', '1'],
      ['/console/deliveries/reapply', 'to', '12/01/2026'],
    ] as const) {
      const response = await get(path, { [field]: typed })
      expect([response.status, response.type], `${field}=${typed}`).toEqual([400, 'text/html'])
      expect(response.text, `${field}=${typed}`).toContain(`${field}: `)
      expect(response.text, `${field}=${typed}`).toContain('is not a time: write YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS[.fff]], UTC')
    }
  })
})
