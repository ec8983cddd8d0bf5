// One POST to the running service's admin port, for a command forwarded there (running-service.ts), over node:http.
// fetch loads and compiles its HTTP client (undici, its parser in WebAssembly) at its first request: for a command
// that makes one request and exits, that was most of its time (bench/cli-startup.ts, README "Benchmarks").
import { StringDecoder } from 'node:string_decoder'

/** How long the connection may take to be set up (fetch's own bound, with TLS's handshake): past it, the command was not sent. */
const CONNECT_TIMEOUT_MS = 10_000

/** The request failed. `connected`: the connection was made, so the command may have reached the service. */
export class ServiceRequestError extends Error {
  override name = 'ServiceRequestError'
  constructor(
    /** The innermost reason, as Node says it: ECONNREFUSED, ECONNRESET, HPE_INVALID_CONSTANT. */
    readonly code: string,
    readonly connected: boolean,
    options?: ErrorOptions,
  ) {
    super(`the request failed (${code})`, options)
  }
}

export interface ServiceAnswer {
  status: number
  /** A header's value (the first, when it came more than once), or undefined. */
  header: (name: string) => string | undefined
  /**
   * The body as UTF-8 text, at most `limit` bytes; undefined when it is longer (the rest not read). Rejects with a
   * ServiceRequestError when the body is cut short.
   */
  text: (limit: number) => Promise<string | undefined>
}

const codeOf = (error: unknown): string => {
  const { code, message } = (error ?? {}) as { code?: unknown; message?: unknown }
  return typeof code === 'string' ? code : typeof message === 'string' ? message : String(error)
}

/**
 * POSTs `body` (JSON) to `url` on a connection of its own, closed after the answer. Never follows a redirect. An abort
 * of `signal` rejects with its reason; every other failure is a ServiceRequestError.
 */
export async function postToService(url: URL, body: string, headers: Record<string, string>, signal: AbortSignal): Promise<ServiceAnswer> {
  // (loaded here: every command line loads this module, and most never forward; https for a fork that added TLS to its
  // admin port). Taken as Node's own module, not through `import()`: an ES import of node:http makes its namespace of
  // every export, and reading Node 22's and 24's `WebSocket`, `MessageEvent` and `CloseEvent` loads undici, with
  // crypto, tls, http2 and worker_threads (113 of Node's modules, 33-59 ms, against 47 and 7 ms this way)
  const { request: send } = url.protocol === 'https:' ? process.getBuiltinModule('node:https') : process.getBuiltinModule('node:http')
  return new Promise((resolve, reject) => {
    let connected = false
    const failed = (error: unknown) => (signal.aborted ? signal.reason : new ServiceRequestError(codeOf(error), connected, { cause: error }))
    const request = send(url, {
      method: 'POST',
      agent: false,
      signal,
      headers: { ...headers, 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) },
    })
    const connectTimer = setTimeout(() => request.destroy(Object.assign(new Error('connect timed out'), { code: 'CONNECT_TIMEOUT' })), CONNECT_TIMEOUT_MS)
    // connected once the request can be written: after TLS's handshake, on https (a certificate refused sent nothing)
    request.once('socket', (socket) => {
      const onConnect = () => {
        connected = true
        clearTimeout(connectTimer)
      }
      // (a new socket each time, agent false: never one already connected)
      socket.once(url.protocol === 'https:' ? 'secureConnect' : 'connect', onConnect)
    })
    request.once('error', (error) => {
      clearTimeout(connectTimer)
      reject(failed(error))
    })
    request.once('response', (response) => {
      clearTimeout(connectTimer)
      resolve({
        status: response.statusCode ?? 0,
        header: (name) => {
          const value = response.headers[name.toLowerCase()]
          return Array.isArray(value) ? value[0] : value
        },
        text: async (limit) => {
          // read here, not through raw-body: loading it (and iconv-lite, http-errors and the rest) took longer than the
          // service's answer, after that answer had come
          const decoder = new StringDecoder('utf8')
          let text = ''
          let bytes = 0
          try {
            for await (const chunk of response as AsyncIterable<Buffer>) {
              bytes += chunk.length
              if (bytes > limit) return undefined
              text += decoder.write(chunk)
            }
            text += decoder.end()
          } catch (error) {
            throw failed(error)
          } finally {
            response.destroy()
          }
          // (a leading byte order mark dropped, as a decoder for the web does)
          return text.charCodeAt(0) === 0xfeff ? text.slice(1) : text
        },
      })
    })
    request.end(body)
  })
}
