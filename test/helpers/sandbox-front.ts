// The sandbox platform, dropping every webhook (the trade exists there and nothing tells the receiver), behind a front
// that runs a test's hook on each request before the sandbox answers it: what happens on our side while a call is out.
import { createServer, type IncomingMessage } from 'node:http'
import type { AddressInfo } from 'node:net'
import type { Logger } from '../../src/logger.js'
import { createSandbox, type Sandbox } from '../../src/sandbox/create-sandbox.js'
import { TEST_API_KEY_ID, TEST_API_SECRET, TEST_WEBHOOK_SECRET } from './test-config.js'

/** Run before the sandbox answers `request`; an answer it returns is the platform's instead of the sandbox's. */
export type BeforeAnswer = (request: IncomingMessage) => Promise<{ status: number; body: unknown } | void>

export interface SandboxFront {
  sandbox: Sandbox
  url: string
  close(): Promise<void>
}

export async function startSandboxFront(logger: Logger, beforeAnswer: BeforeAnswer): Promise<SandboxFront> {
  const sandbox = createSandbox({ keyId: TEST_API_KEY_ID, apiSecret: TEST_API_SECRET, webhookSecret: TEST_WEBHOOK_SECRET, faults: { dropRate: 1 }, logger })
  const front = createServer((request, response) => {
    void beforeAnswer(request).then((instead) => {
      if (!instead) return sandbox.app(request, response)
      response.writeHead(instead.status, { 'content-type': 'application/json' })
      response.end(JSON.stringify(instead.body))
    })
  })
  await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', resolve))
  return {
    sandbox,
    url: `http://127.0.0.1:${(front.address() as AddressInfo).port}`,
    async close() {
      front.closeAllConnections()
      await new Promise<void>((resolve) => front.close(() => resolve()))
      await sandbox.close()
    },
  }
}
