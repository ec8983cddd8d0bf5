// The setting of the process tests that run the compiled `serve` with the forwarder (Postgres): a test database,
// a local forward receiver, a migrated DATA_DIR, and every `serve` started, killed if still running after the
// describe block, which then closes the receiver and the database (data-dir-template.ts removes the directory).
// All made in beforeAll: a block skipped without Postgres leaves no 40 MB copy of the data directory behind.
import type { ChildProcess } from 'node:child_process'
import { afterAll, beforeAll } from 'vitest'
import { forwardingServeEnv, spawnCli } from './cli-process.js'
import { migratedDataDir } from './data-dir-template.js'
import { type ForwardReceiver, startForwardReceiver } from './forward-receiver.js'
import { createTestDatabase, type TestDatabase } from './test-database.js'

/** Call inside a describe block: its beforeAll and afterAll set up and take down what it returns. */
export function useForwardingServe(dataDirPrefix: string, ...receiverOptions: Parameters<typeof startForwardReceiver>) {
  let database: TestDatabase | undefined
  let receiver: ForwardReceiver | undefined
  let dataDir: string | undefined
  const children: ChildProcess[] = []

  beforeAll(async () => {
    database = await createTestDatabase()
    dataDir = migratedDataDir(dataDirPrefix)
    receiver = await startForwardReceiver(...receiverOptions)
  })
  afterAll(async () => {
    for (const child of children) if (child.exitCode === null) child.kill('SIGKILL')
    await receiver?.close()
    await database?.close()
  })

  return {
    get database(): TestDatabase {
      return database!
    },
    get receiver(): ForwardReceiver {
      return receiver!
    },
    /** `serve`'s environment on the test database, forwarding to the receiver with a new secret. */
    serveEnv: () => forwardingServeEnv({ databaseUrl: database!.url!, dataDir: dataDir!, forwardUrl: receiver!.url }),
    /** Starts the compiled `serve` with `env`. */
    serve(env: Record<string, string>): ChildProcess {
      const child = spawnCli(['serve'], env)
      children.push(child)
      return child
    },
  }
}
