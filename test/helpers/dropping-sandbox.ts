// The sandbox platform for a test file that runs the compiled CLI against it: listening from the file's beforeAll,
// dropping every webhook (an order moves only by what a command records, never by a webhook that races it), with a
// client of its own to make and move trades on it. At the file's end, the children the file noted are killed, its
// clean-ups run (a Postgres test database's close among them), then the sandbox closes.
import type { ChildProcess } from 'node:child_process'
import { afterAll, beforeAll } from 'vitest'
import type { PartnerApiClient } from '../../src/partner-api/partner-api.client.js'
import { createSandbox, type Sandbox } from '../../src/sandbox/create-sandbox.js'
import { killLeftovers } from './cli-process.js'
import { testLogger } from './log-sink.js'
import { sandboxClient } from './sandbox-client.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './test-config.js'

export interface DroppingSandbox {
  /** Its base URL, for PARTNER_API_BASE_URL (from the file's beforeAll on). */
  readonly url: string
  /** A client of it, with the CLI's key: the test's own calls (a trade to link, to fund). */
  readonly client: PartnerApiClient
  /** The file's child processes (startedCli's), killed at its end. */
  readonly children: ChildProcess[]
  /** The file's clean-ups (seededCliDatabase's), run at its end after the children are killed. */
  readonly cleanups: (() => Promise<void>)[]
}

/** Registers the file's beforeAll and afterAll: call it once, at the top level of a test file. */
export function useDroppingSandbox(): DroppingSandbox {
  let sandbox: Sandbox | undefined
  let url: string | undefined
  let client: PartnerApiClient | undefined
  const children: ChildProcess[] = []
  const cleanups: (() => Promise<void>)[] = []
  beforeAll(async () => {
    const logger = testLogger([TEST_API_SECRET, TEST_WEBHOOK_SECRET])
    sandbox = createSandbox({ keyId: TEST_API_KEY_ID, apiSecret: TEST_API_SECRET, webhookSecret: TEST_WEBHOOK_SECRET, faults: { dropRate: 1 }, logger })
    url = await sandbox.listen(0)
    client = sandboxClient(url, { keyId: TEST_API_KEY_ID, secret: TEST_API_SECRET })
  })
  afterAll(async () => {
    killLeftovers(children)
    for (const cleanup of cleanups) await cleanup()
    await sandbox?.close()
  })
  const started = <T>(value: T | undefined, what: string): T => {
    if (value === undefined) throw new Error(`the sandbox's ${what} is read before the file's beforeAll started it`)
    return value
  }
  return {
    get url() {
      return started(url, 'URL')
    },
    get client() {
      return started(client, 'client')
    },
    children,
    cleanups,
  }
}
