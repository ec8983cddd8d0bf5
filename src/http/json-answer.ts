// Answers written on Node's own response, for the webhook path that does not go through Express
// (webhook-endpoint.ts) and the listener's own refusals: the same bytes and headers Express's res.json sends,
// minus the ETag (a sender never revalidates a POST's answer).
import type { ServerResponse } from 'node:http'
import { type ErrorCode, errorBody } from './app-error.js'

export const JSON_CONTENT_TYPE = 'application/json; charset=utf-8'

/** Writes `body` (already encoded, or a value to encode) as the whole answer. */
export function writeJson(res: ServerResponse, status: number, body: Buffer | object): void {
  const bytes = Buffer.isBuffer(body) ? body : Buffer.from(JSON.stringify(body))
  res.writeHead(status, { 'Content-Type': JSON_CONTENT_TYPE, 'Content-Length': bytes.length })
  res.end(bytes)
}

/**
 * An answer in the error shape that closes its connection, whose body (if any is still coming) is not read;
 * `headers` besides (a Retry-After).
 */
export function refuseAndClose(res: ServerResponse, status: number, code: ErrorCode, message: string, headers: Record<string, string> = {}): void {
  res.setHeader('Connection', 'close')
  for (const [name, value] of Object.entries(headers)) res.setHeader(name, value)
  writeJson(res, status, errorBody(code, message))
}
