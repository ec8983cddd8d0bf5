// Local mode runs on embedded PGlite, which one process owns. So that operator commands still work
// while `npm start` runs, the service writes DATA_DIR/serve.json (its URLs and a random token, mode
// 0600) and runs forwarded command lines itself, on its operator listener (adminUrl), against its own
// database, returning their output.
// With DATABASE_URL set (Postgres) nothing is forwarded: every process opens its own pool.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto'
import { readFileSync, rmSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import express, { Router } from 'express'
import type { CliContext } from '../cli/cli-context.js'
import { runCommandLine } from '../cli/run-cli.js'
import { type Config, ConfigError, loadConfig } from '../config.js'
import { AppError } from '../http/app-error.js'

/** Commands that need the database; the rest (serve, sandbox, demo, webhook, help) run where typed. */
const FORWARDED_COMMANDS = new Set([
  'orders',
  'deliveries',
  'trades',
  'disputes',
  'proposals',
  'reconcile',
  'migrate',
])
export const LOCAL_CLI_PATH = '/_local/cli'

interface ServiceFile {
  pid: number
  /** The public listener (webhooks, health). */
  url: string
  /** The operator listener, where LOCAL_CLI_PATH is served. */
  adminUrl: string
  token: string
}

function serviceFilePath(dataDir: string): string {
  return path.join(dataDir, 'serve.json')
}

export function createLocalCliToken(): string {
  return randomBytes(32).toString('hex')
}

/** Writes serve.json for the running service; the returned function removes it. */
export function advertiseLocalService(
  dataDir: string,
  { url, adminUrl }: { url: string; adminUrl: string },
  token: string,
): () => void {
  const file = serviceFilePath(dataDir)
  const contents: ServiceFile = { pid: process.pid, url, adminUrl, token }
  writeFileSync(file, `${JSON.stringify(contents)}\n`, { mode: 0o600 })
  return () => rmSync(file, { force: true })
}

/** The service side: POST /_local/cli {args} with the bearer token runs the command line in-process. */
export function localCliRoutes({ token, context }: { token: string; context: CliContext }): Router {
  const router = Router()
  const expected = createHash('sha256').update(token).digest()
  router.post(LOCAL_CLI_PATH, express.json({ limit: '64kb' }), async (req, res) => {
    const presented = createHash('sha256')
      .update(req.get('authorization')?.replace(/^Bearer /, '') ?? '')
      .digest()
    if (!timingSafeEqual(presented, expected)) {
      throw new AppError(401, 'invalid_signature', 'A local command needs the token from DATA_DIR/serve.json')
    }
    const args: unknown = req.body?.args
    if (
      !Array.isArray(args) ||
      !args.every((arg) => typeof arg === 'string') ||
      !FORWARDED_COMMANDS.has(String(args[0]))
    ) {
      throw new AppError(
        400,
        'invalid_payload',
        `args must be a command line starting with one of: ${[...FORWARDED_COMMANDS].join(', ')}`,
      )
    }
    let stdout = ''
    let stderr = ''
    const code = await runCommandLine(args as string[], {
      stdout: { write: (text: string) => (stdout += text) },
      stderr: { write: (text: string) => (stderr += text) },
      exitCode: 0,
      context,
    })
    res.json({ code, stdout, stderr })
  })
  return router
}

/**
 * The command side: when the command needs the database and a local service owns it, ask that service
 * to run it. Returns the exit code, or undefined to run the command here.
 */
export async function forwardToLocalService(args: string[]): Promise<number | undefined> {
  if (!FORWARDED_COMMANDS.has(args[0] ?? '') || args.includes('--help') || args.includes('-h'))
    return undefined
  let config: Config
  try {
    config = loadConfig()
  } catch (error) {
    if (error instanceof ConfigError) return undefined // reported by the normal path
    throw error
  }
  if (config.databaseUrl || config.dataDir.startsWith('memory://')) return undefined
  let service: Omit<ServiceFile, 'adminUrl'> & { adminUrl?: string }
  try {
    service = JSON.parse(readFileSync(serviceFilePath(config.dataDir), 'utf8')) as typeof service
    process.kill(service.pid, 0)
  } catch {
    return undefined // no running service: open the database here
  }
  let response: Response
  try {
    // a serve.json without adminUrl was written by an older service, which served commands on `url`
    response = await fetch(`${service.adminUrl ?? service.url}${LOCAL_CLI_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${service.token}` },
      body: JSON.stringify({ args }),
    })
  } catch {
    return undefined
  }
  if (!response.ok) {
    process.stderr.write(
      `The running service refused the command (${response.status}): ${await response.text()}\n`,
    )
    return 1
  }
  const result = (await response.json()) as { code: number; stdout: string; stderr: string }
  process.stdout.write(result.stdout)
  process.stderr.write(result.stderr)
  return result.code
}
