// The Content-Encodings this client asks for and undoes itself, strictly: a gzip or deflate body must end with
// its trailer (checksum and length) and a brotli one with its last block, or reading it fails. fetch undoes them
// leniently (undici flushes what it has, Z_SYNC_FLUSH, as curl does), so a body cut short in its framing would
// read as a shorter or whole record with nothing checked; and what it undoes varies with the Node version (zstd
// on 24, not on 20 or 22). Anything else (zstd, x-foo) is not undone here, and a success answer in it is refused.
import { pipeline, Readable, type Transform } from 'node:stream'
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
 * through. Read as it is pulled, so a body that expands without end is never held whole: whoever reads it stops
 * where it wants and cancels. A body that is not what a coding says fails the stream with zlib's error (its `code`
 * Z_DATA_ERROR, Z_BUF_ERROR, ERR__ERROR_FORMAT_PADDING_2, ...).
 */
export function decodedBody(body: ReadableStream<Uint8Array>, contentEncoding: string): ReadableStream<Uint8Array> {
  const decoders = codingsOf(contentEncoding)
    .reverse()
    .map((coding) => DECODERS[coding]?.())
    .filter((decoder) => decoder !== undefined)
  if (decoders.length === 0) return body
  const source = Readable.fromWeb(body as NodeReadableStream<Uint8Array>)
  // pipeline destroys every stream with the first error (a lost connection as much as a bad trailer), and the
  // last one passes it on to whoever reads the result
  const decoded = pipeline([source, ...decoders], () => {}) as unknown as Readable
  return Readable.toWeb(decoded) as ReadableStream<Uint8Array>
}
