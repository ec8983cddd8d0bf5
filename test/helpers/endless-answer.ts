// An answer whose body would be `size` bytes of spaces, written only as fast as the reader takes it: what
// the socket holds unread is bounded by the kernel's buffers, so the bytes written when the connection
// closes tell how much the reader read.
import type { ServerResponse } from 'node:http'

export const MiB = 1024 * 1024

/**
 * Writes the answer; `onClose` gets the bytes written by the time the connection closed. With `announced` false it
 * has no Content-Length (chunked): nothing tells the reader the size before it reads.
 */
export function answerEndlessly(
  response: ServerResponse,
  onClose: (written: number) => void,
  { size = 256 * MiB, status = 200, announced = true }: { size?: number; status?: number; announced?: boolean } = {},
): void {
  const chunk = Buffer.alloc(64 * 1024, ' ')
  let written = 0
  response.writeHead(status, { 'content-type': 'application/json', ...(announced ? { 'content-length': size } : {}) })
  response.on('close', () => onClose(written))
  const pump = () => {
    while (written < size && !response.destroyed) {
      const piece = chunk.subarray(0, Math.min(chunk.length, size - written))
      written += piece.length
      if (!response.write(piece)) return
    }
    if (written >= size) response.end()
  }
  response.on('drain', pump)
  pump()
}
