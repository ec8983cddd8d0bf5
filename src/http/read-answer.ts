// Reading an HTTP answer from a peer within a bound. A peer (the platform, a receiver) may answer with a
// body that never ends; `response.text()` would hold all of it, for as long as the call's timeout allows.
import { Readable } from 'node:stream'
import type { ReadableStream as NodeReadableStream } from 'node:stream/web'
import getRawBody from 'raw-body'

/**
 * The answer's body as text (UTF-8, as `response.text()` decodes it), or undefined once it passes `limit`
 * bytes, counted after any `Content-Encoding` is undone: then reading stops there and the connection is closed.
 */
export async function readAnswer(response: Response, limit: number): Promise<string | undefined> {
  if (!response.body) return ''
  const stream = Readable.fromWeb(response.body as NodeReadableStream)
  try {
    return await getRawBody(stream, { limit, encoding: 'utf-8' })
  } catch (error) {
    if ((error as { type?: string }).type === 'entity.too.large') return undefined
    throw error
  } finally {
    stream.destroy()
  }
}
