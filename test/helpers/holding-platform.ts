// A platform stand-in for the trade commands' stop-signal tests: it takes every request and answers only when the test
// says so, so a call is at the platform for certain while the test sends its signals, and the test chooses the answer
// (a record, a refusal, a 503) or gives none. Listening from the file's beforeAll, closed at its end.
import { once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterAll, beforeAll } from 'vitest'
import { eventually } from './reconcile-poller.js'

export interface HeldRequest {
  method: string
  path: string
  body: string
  respond(status: number, body: unknown): void
  /** Resolves when the client closed the connection without waiting for an answer. */
  abandoned: Promise<void>
}

/** A run of the CLI, as far as waiting for its request goes: whether it has ended, and what it wrote to stderr. */
export interface RunningCommand {
  closed(): unknown
  stderr(): string
}

export interface HoldingPlatform {
  /** Its base URL, for PARTNER_API_BASE_URL (from the file's beforeAll on). */
  readonly url: string
  /**
   * The request of the run whose order is `marker` (in its path or body: the order's reference or trade id), once it
   * is at the platform, taken from those held: never one another run's call left there. Fails if the run ends first.
   */
  requestOf(run: RunningCommand, marker: string): Promise<HeldRequest>
}

/** Registers the file's beforeAll and afterAll: call it once, at the top level of a test file. */
export function useHoldingPlatform(): HoldingPlatform {
  const held: HeldRequest[] = []
  const server = createServer((request, response: ServerResponse) => {
    let body = ''
    request.setEncoding('utf8')
    request.on('data', (chunk: string) => (body += chunk))
    request.on('end', () => {
      held.push({
        method: request.method!,
        path: request.url!,
        body,
        respond: (status, answer) => {
          response.writeHead(status, { 'content-type': 'application/json' })
          response.end(JSON.stringify(answer))
        },
        abandoned: new Promise<void>((resolve) => response.once('close', () => (response.writableEnded ? undefined : resolve()))),
      })
    })
  })
  let url: string | undefined
  beforeAll(async () => {
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  })
  afterAll(() => {
    server.closeAllConnections()
    server.close()
  })
  return {
    get url() {
      if (url === undefined) throw new Error('the holding platform’s URL is read before the file’s beforeAll started it')
      return url
    },
    async requestOf(run, marker) {
      const mine = (request: HeldRequest) => request.path.includes(marker) || request.body.includes(marker)
      await eventually(() => {
        if (run.closed()) throw new Error(`the command ended before its call reached the platform:\n${run.stderr()}`)
        return held.some(mine)
      }, 'the call is at the platform', 120_000)
      return held.splice(held.findIndex(mine), 1)[0]!
    },
  }
}
