// What both listeners do with a request before Express sees it. Express's router and req.path read the
// target with parseurl, which hands anything not starting with `/` to Node's legacy url.parse: an
// absolute-form target that is no URL (`http://[::1/x`, `http://host:port/`) makes that print a DEP0170
// warning quoting the target to the process's stderr (an outsider's bytes, unescaped) and, for some, throw.
// So a target that is not a path is read here with the WHATWG URL parser instead: its path and query are
// what Express is given (a server must accept the absolute form, RFC 9112 3.2.2), and one that is no http
// URL is answered 404 at once.
import type { IncomingMessage, ServerResponse } from 'node:http'
import { errorBody } from './app-error.js'
import { writeJson } from './json-answer.js'

/** A request listener for Node's http server (and supertest). */
export type App = (req: IncomingMessage, res: ServerResponse) => void

/**
 * Leaves `req.url` a path (origin form), rewriting an absolute-form target to its path and query. False:
 * the target is no URL, and the request was answered 404 `not_found`.
 */
export function readRequestTarget(req: IncomingMessage, res: ServerResponse): boolean {
  const target = req.url ?? ''
  if (target.charCodeAt(0) === 0x2f /* / */) return true
  const url = parsedUrl(target)
  if (url === undefined || (url.protocol !== 'http:' && url.protocol !== 'https:')) {
    noRoute(res)
    return false
  }
  req.url = `${url.pathname}${url.search}`
  // the target's authority is the request's host, whatever Host says (RFC 9112 3.2.2): the operator listener's Host
  // check reads it (a GET http://evil.example/metrics with Host: 127.0.0.1 was answered as if for 127.0.0.1)
  req.headers.host = url.host
  return true
}

function parsedUrl(target: string): URL | undefined {
  try {
    return new URL(target)
  } catch {
    return undefined
  }
}

/**
 * An Express application as Node's request listener: what Express's router falls through to when no route
 * or error handler answered (an error after the answer began, say) is a 404 in the error shape, or the
 * connection closed, never Express's own HTML page. The target must have been read (readRequestTarget).
 */
export function expressListener(app: unknown): App {
  // Express calls its third argument when nothing answered (its types leave the argument out)
  const handle = app as (req: IncomingMessage, res: ServerResponse, done: () => void) => void
  return (req, res) => handle(req, res, () => noRoute(res))
}

function noRoute(res: ServerResponse): void {
  if (res.headersSent) res.destroy()
  else writeJson(res, 404, errorBody('not_found', 'No route for this request target'))
}
