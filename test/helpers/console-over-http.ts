// The console over HTTP for a test file: a database, the receiver's app (to send webhooks) and the admin app with the
// console under a token, made before the file's tests and closed after; and the hidden fields of a page's action form.
import request from 'supertest'
import { afterAll, beforeAll } from 'vitest'
import { systemClock } from '../../src/clock.js'
import { createAdminApp } from '../../src/http/admin-app.js'
import { type App, createApp } from '../../src/http/app.js'
import { testLogger } from './log-sink.js'
import { testConfig } from './test-config.js'
import { createTestDatabase, type TestDatabase } from './test-database.js'

/** The hidden fields of a page's action form (the logout form in the header left out), as a browser posts them. */
export function actionFields(page: string): Record<string, string> {
  const form = /<form method="post"[^>]*>([\s\S]*?)<\/form>/.exec(page.replace(/<header>[\s\S]*?<\/header>/, ''))
  if (!form) throw new Error(`no action form in: ${page.slice(0, 400)}`)
  const fields: Record<string, string> = {}
  for (const match of form[1]!.matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)) {
    fields[match[1]!] = match[2]!.replace(/&quot;/g, '"').replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&#39;/g, "'").replace(/&amp;/g, '&')
  }
  return fields
}

/** The console under `token` for the file's tests: `under.database`, `under.app` and `under.admin` are set before them. */
export function consoleOverHttp(token: string) {
  const under = {} as { database: TestDatabase; app: App; admin: App }
  beforeAll(async () => {
    under.database = await createTestDatabase()
    const config = testConfig({ ADMIN_TOKEN: token })
    const logger = testLogger([token])
    under.app = createApp({ config, db: under.database.db, logger, clock: systemClock })
    under.admin = createAdminApp({ config, db: under.database.db, logger })
  })
  afterAll(async () => {
    await under.database.close()
  })
  return {
    under,
    get: (path: string) => request(under.admin).get(path).set('Authorization', `Bearer ${token}`),
    post: (path: string, fields: Record<string, string>) =>
      request(under.admin).post(path).set('Authorization', `Bearer ${token}`).type('form').send(fields),
  }
}
