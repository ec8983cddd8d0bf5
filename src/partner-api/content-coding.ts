// The Content-Encodings this client asks for and undoes itself, strictly: a gzip or deflate body must end with
// its trailer (checksum and length) and a brotli one with its last block, or reading it fails. fetch undoes them
// leniently (undici flushes what it has, Z_SYNC_FLUSH, as curl does), so a body cut short in its framing would
// read as a shorter or whole record with nothing checked; and what it undoes varies with the Node version (zstd
// on 24, not on 20 or 22). Anything else (zstd, x-foo) is not undone here, and a success answer in it is refused.
import { addAbortSignal, pipeline, Readable, type Transform } from 'node:stream'
import type { ReadableStream as NodeReadableStream } from 'node:stream/web'
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib'

/** Sent as Accept-Encoding: the codings undone below, and no others. */
export const ACCEPT_ENCODING = 'gzip, deflate, br'

// zlib's defaults (finishFlush Z_FINISH): a stream without its end fails with Z_BUF_ERROR, "unexpected end of file"
const DECODERS: Record<string, (() => Transform) | null> = {
  gzip: createGunzip,
  'x-gzip': createGunzip,
  deflate: createInflate,
  br: createBrotliDecompress,
  // no coding at all, as some servers write it
  identity: null,
}

/**
 * The most codings one answer may list, as undici's fetch allows ("too many content-encodings" past 5): each is a
 * decoder of its own, and 2,500 gzip layers in a 71-KB body took 53 s of decoding and 339 MB, past any timeout.
 */
export const MAX_CODINGS = 5

/** How many codings a Content-Encoding header lists, when more than MAX_CODINGS; undefined otherwise. */
export function tooManyCodings(contentEncoding: string | null): number | undefined {
  if (contentEncoding === null) return undefined
  const count = codingsOf(contentEncoding).length
  return count > MAX_CODINGS ? count : undefined
}

/** The codings of a Content-Encoding header in the order they were applied (empty list elements skipped). */
function codingsOf(contentEncoding: string): string[] {
  return contentEncoding
    .split(',')
    .map((coding) => coding.trim().toLowerCase())
    .filter((coding) => coding !== '')
}

/** The first coding of `contentEncoding` this client does not undo, as the header writes it; undefined when it undoes them all. */
export function undecodedCoding(contentEncoding: string | null): string | undefined {
  if (contentEncoding === null) return undefined
  return contentEncoding
    .split(',')
    .map((coding) => coding.trim())
    .find((coding) => coding !== '' && !Object.hasOwn(DECODERS, coding.toLowerCase()))
}

/**
 * `body` with the codings of `contentEncoding` undone, last applied first; each must be one undecodedCoding lets
 * through, and no more than MAX_CODINGS of them. `signal` ends it with its reason. Read as it is pulled, so a body that expands without end is never held whole: whoever reads it stops
 * where it wants and cancels. A body that is not what a coding says fails the stream with zlib's error (its `code`
 * Z_DATA_ERROR, Z_BUF_ERROR, ERR__ERROR_FORMAT_PADDING_2, ...).
 */
export function decodedBody(body: ReadableStream<Uint8Array>, contentEncoding: string, signal?: AbortSignal): ReadableStream<Uint8Array> {
  const decoders = codingsOf(contentEncoding)
    .reverse()
    .map((coding) => DECODERS[coding]?.())
    .filter((decoder) => decoder !== undefined)
  if (decoders.length === 0) return body
  const source = Readable.fromWeb(body as NodeReadableStream<Uint8Array>)
  // pipeline destroys every stream with the first error (a lost connection as much as a bad trailer), and the
  // last one passes it on to whoever reads the result
  const decoded = pipeline([source, ...decoders], () => {}) as unknown as Readable
  // the call's timeout and its caller's abort end the decoding too: the body may have come whole before they fire
  if (signal) addAbortSignal(signal, decoded)
  return Readable.toWeb(decoded) as ReadableStream<Uint8Array>
}
