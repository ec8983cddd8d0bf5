// Reading an HTTP answer from a peer within a bound. A peer (the platform, a receiver) may answer with a
// body that never ends; `response.text()` would hold all of it, for as long as the call's timeout allows.
import { Readable } from 'node:stream'
import type { ReadableStream as NodeReadableStream } from 'node:stream/web'
import getRawBody from 'raw-body'

/** The body's bytes are not UTF-8: thrown by readAnswer with `fatal` instead of decoding them as U+FFFD. */
export class AnswerNotUtf8Error extends Error {
  override name = 'AnswerNotUtf8Error'
}

// (one decode at a time, never streamed: one decoder serves every answer)
const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true })

/**
 * The answer's body as text (UTF-8, as `response.text()` decodes it), or undefined once it passes `limit`
 * bytes, counted after any `Content-Encoding` is undone: then reading stops there and the connection is closed.
 * A byte sequence that is not UTF-8 becomes U+FFFD, or, with `fatal`, rejects with AnswerNotUtf8Error.
 */
export async function readAnswer(response: Response, limit: number, { fatal = false }: { fatal?: boolean } = {}): Promise<string | undefined> {
  if (!response.body) return ''
  const stream = Readable.fromWeb(response.body as NodeReadableStream)
  try {
    if (!fatal) return await getRawBody(stream, { limit, encoding: 'utf-8' })
    const bytes = await getRawBody(stream, { limit })
    try {
      // a leading byte order mark is dropped, as without `fatal` (and as `response.text()` does)
      return STRICT_UTF8.decode(bytes)
    } catch (error) {
      throw new AnswerNotUtf8Error('The answer is not valid UTF-8', { cause: error })
    }
  } catch (error) {
    if ((error as { type?: string }).type === 'entity.too.large') return undefined
    throw error
  } finally {
    stream.destroy()
  }
}
