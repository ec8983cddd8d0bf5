// The fetch the client calls the platform with: undici's fetch (the package's, the same on every Node version)
// over connections whose failures before the request was written are marked (connect-failure.ts), and whose
// answers' Content-Encoding this module undoes itself, strictly (content-coding.ts), where fetch would undo it
// leniently. fetch is kept from seeing the header, so it hands the body over as it came; the Response the
// caller gets has the header back, and the body decoded, or as it came when a coding is not one undone here.
import type { Dispatcher, fetch as undiciFetch } from 'undici'
import { undici } from '../lazy-packages.js'
import { AbortedBeforeSentError, connectionsMarkingFailures } from './connect-failure.js'
import { decodedBody, tooManyCodings, undecodedCoding } from './content-coding.js'

interface Seen {
  contentEncoding?: string
  /** Set when undici hands the request to a connection that is up, to be written (onRequestStart): before, not one byte of it has left. */
  requestStarted?: boolean
}

/** An interceptor that takes the answer's Content-Encoding from what fetch sees and notes it in `seen`. */
const hidingContentEncoding =
  (seen: Seen): Dispatcher.DispatcherComposeInterceptor =>
  (dispatch) =>
  (options, handler) => {
    const onResponseStart: Dispatcher.DispatchHandler['onResponseStart'] = (controller, statusCode, headers, statusMessage) => {
      const { 'content-encoding': contentEncoding, ...others } = headers
      // two header lines are one list, as fetch joins them
      if (contentEncoding !== undefined) seen.contentEncoding = [contentEncoding].flat().join(', ')
      return handler.onResponseStart?.(controller, statusCode, others, statusMessage)
    }
    const onRequestStart: Dispatcher.DispatchHandler['onRequestStart'] = (controller, context) => {
      seen.requestStarted = true
      return handler.onRequestStart?.(controller, context)
    }
    // every other method is the handler's own, called on it (undici's handlers keep private fields)
    const hiding = new Proxy(handler, {
      get: (target, key) => {
        if (key === 'onResponseStart') return onResponseStart
        if (key === 'onRequestStart') return onRequestStart
        const value: unknown = Reflect.get(target, key)
        return typeof value === 'function' ? value.bind(target) : value
      },
    })
    return dispatch(options, hiding)
  }

/** A fetch through `dispatcher` whose answers' bodies are decoded by content-coding.ts instead of by fetch. */
export function platformFetch(dispatcher: Dispatcher): typeof fetch {
  const fetchDecodingStrictly = async (input: string | URL, init?: Parameters<typeof undiciFetch>[1]) => {
    const seen: Seen = {}
    let response: Awaited<ReturnType<typeof undiciFetch>>
    try {
      response = await undici().fetch(input, { ...init, dispatcher: dispatcher.compose(hidingContentEncoding(seen)) })
    } catch (error) {
      // aborted (the call's timeout) while the connection was still being set up, or the request queued behind one:
      // undici writes a request only once it starts it on a connection that is up, and one aborted before is never
      // written, so the call was not sent. Its own abort error says nothing of that
      if (init?.signal?.aborted && !seen.requestStarted) throw new AbortedBeforeSentError(error)
      throw error
    }
    // a Response cannot be made with a status outside 200-599 (fetch's own can have one): such an answer is given as
    // it came, its body not decoded, and stands on its status as any refusal whose body cannot be read. Rebuilt, it
    // threw, and a 799 marked gzip read as a lost connection (init["status"] must be in the range of 200 to 599)
    if (seen.contentEncoding === undefined || response.status < 200 || response.status > 599) return response
    const { Headers, Response } = undici()
    const headers = new Headers(response.headers)
    headers.set('content-encoding', seen.contentEncoding)
    // more codings than MAX_CODINGS are not undone: the caller refuses the answer by its header
    const decodable =
      response.body !== null && undecodedCoding(seen.contentEncoding) === undefined && tooManyCodings(seen.contentEncoding) === undefined
    const body = decodable
      ? decodedBody(response.body as ReadableStream<Uint8Array>, seen.contentEncoding, init?.signal ?? undefined)
      : response.body
    return new Response(body as ConstructorParameters<typeof Response>[0], {
      status: response.status,
      statusText: response.statusText,
      headers,
    })
  }
  // the same Response as Node's fetch answers, from the package's copy of undici: typed apart, read alike
  return fetchDecodingStrictly as unknown as typeof fetch
}

// one for the process, made at the first call, so every client shares the platform's connections
let directFetch: typeof fetch | undefined

/** The fetch of a client with no proxy: straight to the platform. */
export function directPlatformFetch(): typeof fetch {
  directFetch ??= platformFetch(new (undici().Agent)({ factory: connectionsMarkingFailures }))
  return directFetch
}
