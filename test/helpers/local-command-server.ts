// The operator listener with the local command endpoint, through the real server (http/server.ts) as a second
// terminal's CLI reaches it, over the enclosing describe()'s database. The commands it is sent are recorded, not
// run: each is answered `ran`.
import { afterAll, beforeAll } from 'vitest'
import { systemClock } from '../../src/clock.js'
import { createAdminApp } from '../../src/http/admin-app.js'
import { listen, type RunningServer } from '../../src/http/server.js'
import { localCliRoutes } from '../../src/local/local-cli.js'
import { testLogger } from './log-sink.js'
import { testConfig } from './test-config.js'
import type { TestDatabase } from './test-database.js'

export interface LocalCommandServer {
  /** The listener's port and URL, once the describe()'s hooks started it. */
  readonly port: number
  readonly url: string
  /** Each command line the endpoint took, in order. */
  readonly commands: string[][]
}

/** `token`: the command endpoint's; `config`: the service's settings beside the defaults (an ADMIN_TOKEN). */
export function useLocalCommandServer(
  database: TestDatabase,
  { token, config: settings = {} }: { token: string; config?: Record<string, string> },
): LocalCommandServer {
  const commands: string[][] = []
  let server: RunningServer | undefined
  let port = 0
  beforeAll(async () => {
    const config = testConfig(settings)
    const logger = testLogger([token, ...Object.values(settings)])
    const local = localCliRoutes({
      token,
      context: { config, db: database.db, logger },
      runCommand: async (args) => {
        commands.push(args)
        return { code: 0, stdout: 'ran\n', stderr: '' }
      },
      whenReady: Promise.resolve(),
    })
    server = await listen(createAdminApp({ config, db: database.db, logger, clock: systemClock, routes: [local] }), { port: 0, host: '127.0.0.1' })
    port = Number(new URL(server.url).port)
  })
  afterAll(async () => {
    await server?.stop(1_000)
  })
  return {
    get port() {
      return port
    },
    get url() {
      return server?.url ?? ''
    },
    commands,
  }
}
