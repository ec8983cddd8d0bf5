// Characters that show nothing are shown as escapes wherever text from outside is shown (src/printable.ts): the
// controls and format characters were, but not the rest of Unicode's default-ignorable code points (the combining
// grapheme joiner U+034F, the variation selectors U+FE00–U+FE0F, the Hangul fillers U+3164 and U+FFA0, …), so a
// parked delivery for 'o-3\u034f' showed as 'o-3' beside the real order 'o-3' (a review found it). Through the
// console's pages over HTTP and the CLI's `deliveries list`.
import request from 'supertest'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { systemClock } from '../src/clock.js'
import { createAdminApp } from '../src/http/admin-app.js'
import { type App, createApp } from '../src/http/app.js'
import { findDelivery } from '../src/webhooks/delivery.repository.js'
import { runCommand } from './helpers/cli-in-process.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { createTestDatabase, type TestDatabase } from './helpers/test-database.js'
import { sendWebhook, tradePayload } from './helpers/webhook-delivery.js'

const TOKEN = 'console-ignorable-token-0123456789abcdef'
const marked = (escapes: string) => `<span class="unprintable">${escapes}</span>`

describe('default-ignorable characters from outside are shown as escapes', () => {
  let database: TestDatabase
  let app: App
  let admin: App
  const config = testConfig({ ADMIN_TOKEN: TOKEN })
  beforeAll(async () => {
    database = await createTestDatabase()
    const logger = testLogger([TOKEN])
    app = createApp({ config, db: database.db, logger, clock: systemClock })
    admin = createAdminApp({ config, db: database.db, logger })
    await database.db.insertInto('orders').values({ externalReference: 'o-3' }).execute()
    for (const [reference, id] of [
      ['o-3\u034f', 'ign-cgj'],
      ['o-3\ufe0f', 'ign-vs16'],
      ['\u3164o-3', 'ign-filler'],
    ] as const) {
      expect((await sendWebhook(app, { body: tradePayload(reference, 'funded', `trd-${id}`), deliveryId: id })).status).toBe(200)
    }
  })
  afterAll(async () => {
    await database.close()
  })
  const get = (path: string) => request(admin).get(path).set('Authorization', `Bearer ${TOKEN}`)

  it("marks them on the deliveries search and a delivery's page, where they showed as nothing", async () => {
    const search = await get('/console/deliveries?outcome=unmatched')
    expect(search.status).toBe(200)
    expect(search.text).toContain(`<td>o-3${marked('\\u034f')}</td>`)
    expect(search.text).toContain(`<td>o-3${marked('\\ufe0f')}</td>`)
    expect(search.text).toContain(`<td>${marked('\\u3164')}o-3</td>`)
    const delivery = (await findDelivery(database.db, 'ign-cgj'))!
    const page = await get(`/console/delivery?id=ign-cgj&body=${delivery.bodySha256}`)
    expect(page.text).toContain(`<dt>External reference</dt><dd>o-3${marked('\\u034f')}</dd>`)
    // the link and the hidden fields keep the reference exact
    expect(page.text).toContain('/console/deliveries/dismiss?reference=o-3%CD%8F')
  })

  it('shows them as \\uXXXX in the CLI', async () => {
    const list = await runCommand(['deliveries', 'list', '--outcome', 'unmatched'], database.db, config)
    expect(list.code).toBe(0)
    expect(list.stdout).toContain('o-3\\u034f')
    expect(list.stdout).toContain('o-3\\ufe0f')
    expect(list.stdout).toContain('\\u3164o-3')
    expect(list.stdout).not.toMatch(/[\u034f\ufe0f\u3164]/)
  })
})
