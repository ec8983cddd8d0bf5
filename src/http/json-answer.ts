// Answers written on Node's own response, for the webhook path that does not go through Express
// (webhook-endpoint.ts): the same bytes and headers Express's res.json sends, minus the ETag (a sender
// never revalidates a POST's answer).
import type { ServerResponse } from 'node:http'

export const JSON_CONTENT_TYPE = 'application/json; charset=utf-8'

/** Writes `body` (already encoded, or a value to encode) as the whole answer. */
export function writeJson(res: ServerResponse, status: number, body: Buffer | object): void {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body))
  res.writeHead(status, { 'Content-Type': JSON_CONTENT_TYPE, 'Content-Length': bytes.length })
  res.end(bytes)
}
