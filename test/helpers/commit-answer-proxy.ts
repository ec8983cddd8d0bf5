// A TCP proxy in front of Postgres that reads the frontend/backend protocol, so a test can lose the answer to one
// statement's commit: the connection whose Bind message carries a marker (a delivery id in the ingest statement's
// JSON parameter) gets nothing of its statement's answer, and is cut right after the proxy forwarded its Sync.
//
// The webhook ingest sends no COMMIT text: a batch is one statement in its own (implicit) transaction, sent with
// the extended protocol (Parse once per connection for a named statement, then Bind, Describe, Execute, Sync).
// Postgres commits that transaction when it reads the Sync. So the Sync is "the COMMIT": forwarded, the server
// commits and the proxy waits for its ReadyForQuery (the commit done) and drops it; held back, the server reads
// the end of the stream instead and rolls the statement back.
import net from 'node:net'
import { throughPort } from './tcp-proxy.js'

export interface CommitAnswerProxy {
  readonly port: number
  /** The target URL rewritten to go through the proxy. */
  rewrite(url: string): string
  /**
   * Arms the proxy for one statement: the first Bind that carries `marker` marks its connection; from then on
   * nothing of the server's answer reaches the client, and at the Sync after it the client's side is cut. With
   * `commit: true` the Sync is forwarded and the promise resolves once the server answered it (committed) and
   * that answer was dropped; with `commit: false` the Sync is not forwarded, the server's side is closed too,
   * and the promise resolves once that connection is gone.
   */
  loseAnswer(marker: string, options: { commit: boolean }): Promise<{ serverAnswered: boolean }>
  close(): Promise<void>
}

interface Armed {
  marker: Buffer
  commit: boolean
  done: (outcome: { serverAnswered: boolean }) => void
}

// the untyped messages a client may send before its startup message
const SSL_REQUEST = 80877103
const GSSENC_REQUEST = 80877104

/** Splits complete messages off the front of `buffer`: typed ones (1 type byte, then a length that counts itself). */
function takeTyped(buffer: Buffer): { messages: { type: string; bytes: Buffer }[]; rest: Buffer } {
  const messages: { type: string; bytes: Buffer }[] = []
  let offset = 0
  while (buffer.length - offset >= 5) {
    const length = buffer.readInt32BE(offset + 1)
    if (buffer.length - offset < 1 + length) break
    messages.push({ type: String.fromCharCode(buffer[offset]!), bytes: buffer.subarray(offset, offset + 1 + length) })
    offset += 1 + length
  }
  return { messages, rest: buffer.subarray(offset) }
}

export async function startCommitAnswerProxy(target: { host: string; port: number }): Promise<CommitAnswerProxy> {
  const sockets = new Set<net.Socket>()
  let armed: Armed | undefined

  const server = net.createServer((client) => {
    const upstream = net.connect(target.port, target.host)
    sockets.add(client)
    sockets.add(upstream)
    const drop = () => {
      client.destroy()
      upstream.destroy()
      sockets.delete(client)
      sockets.delete(upstream)
    }
    // once cut, the client's side closing leaves the server's side to finish (or roll back) on its own
    const clientGone = () => (cut ? void client.destroy() : drop())
    client.on('error', clientGone).on('close', clientGone)

    // client → server: untyped messages until the startup message, typed ones after it
    let started = false
    let sslAsked = false
    let fromClient: Buffer = Buffer.alloc(0)
    // this connection's armed statement, once its Bind carried the marker
    let marked: Armed | undefined
    let cut = false
    client.on('data', (chunk: Buffer) => {
      if (cut) return
      fromClient = Buffer.concat([fromClient, chunk])
      while (!started && fromClient.length >= 8) {
        const length = fromClient.readInt32BE(0)
        if (fromClient.length < length) return
        const code = fromClient.readInt32BE(4)
        if (code === SSL_REQUEST || code === GSSENC_REQUEST) sslAsked = true
        else started = true
        upstream.write(fromClient.subarray(0, length))
        fromClient = fromClient.subarray(length)
      }
      if (!started) return
      const { messages, rest } = takeTyped(fromClient)
      fromClient = rest
      for (const { type, bytes } of messages) {
        if (type === 'B' && armed && bytes.includes(armed.marker)) {
          marked = armed
          armed = undefined
        }
        if (type === 'S' && marked) {
          const statement = marked
          cut = true
          if (statement.commit) upstream.write(bytes)
          // the service's side goes first: nothing of the answer can reach it now
          client.destroy()
          sockets.delete(client)
          if (statement.commit) {
            // the server's answer to the Sync is its ReadyForQuery: the commit is done
            waitingForReady = () => {
              upstream.end()
              statement.done({ serverAnswered: true })
            }
          } else {
            upstream.end()
            upstream.on('close', () => statement.done({ serverAnswered: false }))
          }
          return
        }
        upstream.write(bytes)
      }
    })

    // server → client: forwarded message by message until this connection's statement is marked
    let fromServer: Buffer = Buffer.alloc(0)
    let sslAnswered = false
    let waitingForReady: (() => void) | undefined
    upstream.on('error', drop).on('close', drop)
    // the server went away before it answered the Sync: the test sees it was not answered
    upstream.on('close', () => {
      const ready = waitingForReady
      waitingForReady = undefined
      if (ready && marked) marked.done({ serverAnswered: false })
    })
    upstream.on('data', (chunk: Buffer) => {
      fromServer = Buffer.concat([fromServer, chunk])
      if (sslAsked && !sslAnswered && fromServer.length > 0) {
        // one byte, 'N' (refused: the test's server runs without TLS); 'S' would make the rest unreadable here
        sslAnswered = true
        if (!cut) client.write(fromServer.subarray(0, 1))
        fromServer = fromServer.subarray(1)
      }
      const { messages, rest } = takeTyped(fromServer)
      fromServer = rest
      for (const { type, bytes } of messages) {
        if (marked || cut) {
          if (type === 'Z' && waitingForReady) {
            const ready = waitingForReady
            waitingForReady = undefined
            ready()
          }
          continue
        }
        client.write(bytes)
      }
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as net.AddressInfo).port
  return {
    port,
    rewrite: (url) => throughPort(url, port),
    loseAnswer: (marker, { commit }) => {
      if (armed) throw new Error('the proxy is already armed for another statement')
      return new Promise((resolve) => {
        armed = { marker: Buffer.from(marker), commit, done: resolve }
      })
    },
    close: async () => {
      for (const socket of sockets) socket.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
