// The local command endpoint during a first start: serve.json is written as soon as the listeners are up,
// before the migrations ran, so a second terminal's command waits for the database instead of meeting
// missing tables, and is told to try again if the database is not ready in time.
import request from 'supertest'
import { describe, expect, it } from 'vitest'
import { createAdminApp } from '../src/http/admin-app.js'
import { localCliRoutes } from '../src/local/local-cli.js'
import { LOCAL_CLI_PATH } from '../src/local/running-service.js'
import { testLogger } from './helpers/log-sink.js'
import { testConfig } from './helpers/test-config.js'
import { useTestDatabase } from './helpers/test-database.js'

describe('the local command endpoint before the database is ready', () => {
  const database = useTestDatabase()
  const token = 'a'.repeat(64)

  function adminWith(whenReady: Promise<void>, calls: string[][], readyWaitMs?: number) {
    const config = testConfig()
    const logger = testLogger()
    const routes = localCliRoutes({
      token,
      context: { config, db: database.db, logger },
      runCommand: async (args) => {
        calls.push(args)
        return { code: 0, stdout: 'ran\n', stderr: '' }
      },
      whenReady,
      ...(readyWaitMs === undefined ? {} : { readyWaitMs }),
    })
    return createAdminApp({ config, db: database.db, logger, metrics: undefined, routes: [routes] })
  }

  it('runs a command sent during start-up once the database is ready', async () => {
    let markReady!: () => void
    const whenReady = new Promise<void>((resolve) => {
      markReady = resolve
    })
    const calls: string[][] = []
    const answer = request(adminWith(whenReady, calls))
      .post(LOCAL_CLI_PATH)
      .set('authorization', `Bearer ${token}`)
      .send({ args: ['orders', 'list'] })
      .then((response) => response)
    await new Promise((resolve) => setTimeout(resolve, 50))
    expect(calls).toEqual([])
    markReady()
    const response = await answer
    expect(response.status).toBe(200)
    expect(response.body).toMatchObject({ code: 0, stdout: 'ran\n' })
    expect(calls).toEqual([['orders', 'list']])
  })

  it('answers 503 not_ready, running nothing, when the database does not become ready in time', async () => {
    const calls: string[][] = []
    const response = await request(adminWith(new Promise<void>(() => {}), calls, 20))
      .post(LOCAL_CLI_PATH)
      .set('authorization', `Bearer ${token}`)
      .send({ args: ['orders', 'list'] })
    expect(response.status).toBe(503)
    expect(response.body.error.code).toBe('not_ready')
    expect(calls).toEqual([])
  })

  it('answers 503 not_ready when the start-up failed', async () => {
    const calls: string[][] = []
    const failed = Promise.reject(new Error('migration failed'))
    failed.catch(() => {})
    const response = await request(adminWith(failed, calls))
      .post(LOCAL_CLI_PATH)
      .set('authorization', `Bearer ${token}`)
      .send({ args: ['orders', 'list'] })
    expect(response.status).toBe(503)
    expect(calls).toEqual([])
  })
})
