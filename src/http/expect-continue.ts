// Expect: 100-continue. Node writes `100 Continue` itself, before the application sees the request, unless
// the server listens for 'checkContinue'; server.ts does, and hands such a request to the application
// unanswered. Whoever is about to read its body says continue then (continueReading), so a request that
// is refused from its headers alone (a length past the limit, no signature, the body budget spent, a path
// with no route) is refused before its client sends the body, and told nothing else.
import type { IncomingMessage, RequestListener, ServerResponse } from 'node:http'
import { AppError } from './app-error.js'

// the requests whose client waits for `100 Continue` before it sends the body
const awaiting = new WeakSet<IncomingMessage>()

/** The listener for the server's 'checkContinue': the request goes to `app` with no answer written yet. */
export function checkContinue(app: RequestListener): RequestListener {
  return (req, res) => {
    awaiting.add(req)
    app(req, res)
  }
}

/** True while the client waits for `100 Continue` before it sends the body. */
export function awaitsContinue(req: IncomingMessage): boolean {
  return awaiting.has(req)
}

/** Writes `100 Continue` if the client waits for it: call it when the body is about to be read. */
export function continueReading(req: IncomingMessage, res: ServerResponse): void {
  if (awaiting.delete(req)) res.writeContinue()
}

/**
 * Before an answer given from the headers alone (a refusal): the connection is closed after it, so no byte
 * of a body is read. Node would otherwise read a body its client sent anyway, to discard it; it closes by
 * itself after a request whose client waited for `100 Continue` and was never told to send.
 */
export function leaveBodyUnread(req: IncomingMessage, res: ServerResponse): void {
  if (req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length']) > 0) res.setHeader('Connection', 'close')
}

/**
 * A body parser (Express's json or urlencoded) that says continue before it reads. A request whose announced
 * length is past the limit is refused 413 from its headers, the parser not called, and the connection closed
 * after the answer: the parser would answer only once the refused body had arrived and been discarded, which
 * a client waiting for `100 Continue` never sends.
 */
export function continuingParser<Req extends IncomingMessage, Res extends ServerResponse>(
  parser: (req: Req, res: Res, next: (error?: unknown) => void) => void,
  limitBytes: number,
): (req: Req, res: Res, next: (error?: unknown) => void) => void {
  return (req, res, next) => {
    if (Number(req.headers['content-length']) > limitBytes) {
      res.setHeader('Connection', 'close')
      return next(new AppError(413, 'payload_too_large', `The body is larger than ${limitBytes} bytes`))
    }
    continueReading(req, res)
    parser(req, res, next)
  }
}
