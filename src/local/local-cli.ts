// The service side of src/local/running-service.ts: POST /_local/cli runs a command line forwarded by a
// second terminal, in this process, against this process's database, and returns its output. The
// command line is run by a function the entry point gives it (src/cli/run-cli.ts), not an import: the
// service does not depend on the CLI that starts it.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto'
import express, { type RequestHandler, Router } from 'express'
import type { CliContext } from '../cli/cli-context.js'
import { AppError } from '../http/app-error.js'
import { bearerCredential } from '../http/authorization.js'
import { continuingParser, leaveBodyUnread } from '../http/expect-continue.js'
import { COMMAND_STARTED_HEADER, type CommandOutput, COMMANDS_TAKEN_PREFIX, FORWARDED_COMMANDS, LOCAL_CLI_PATH, MAX_COMMAND_REQUEST_BYTES } from './running-service.js'

export function createLocalCliToken(): string {
  return randomBytes(32).toString('hex')
}

/** Runs one command line against `context` (this process's database), its output captured. */
export type LocalCommandRunner = (args: string[], context: CliContext) => Promise<CommandOutput>

/** The bytes of large command lines read, parsed and run at once: two of the largest. */
export const COMMANDS_BUDGET_BYTES = 2 * MAX_COMMAND_REQUEST_BYTES
/** A command line this long or shorter (a shell's whole default argument space is 2 MB) is not counted: it always runs. */
const UNCOUNTED_COMMAND_BYTES = 1024 * 1024

/** The service side: POST /_local/cli {args} with the bearer token runs the command line in-process. */
export function localCliRoutes({
  token,
  context,
  runCommand,
  whenReady,
  readyWaitMs = 120_000,
}: {
  token: string
  context: CliContext
  runCommand: LocalCommandRunner
  /** Settles once the database is migrated: serve.json is written before that, on a first start. */
  whenReady: Promise<void>
  readyWaitMs?: number
}): Router {
  const router = Router()
  const expected = createHash('sha256').update(token).digest()
  // a client that sent `Expect: 100-continue` is told to send its body here (http/expect-continue.ts)
  const parse = continuingParser(express.json({ limit: MAX_COMMAND_REQUEST_BYTES }), MAX_COMMAND_REQUEST_BYTES)
  // every command line a process can be given fits: a larger body is no command's, and is refused in words that say
  // so, its length announced (refused from the headers) or not (refused once the limit is read)
  const json: RequestHandler = (req, res, next) =>
    parse(req, res, (error) => {
      if ((error as { status?: unknown } | undefined)?.status !== 413) return next(error)
      next(
        new AppError(
          413,
          'payload_too_large',
          `A command line is at most ${MAX_COMMAND_REQUEST_BYTES.toLocaleString('en-US')} bytes as JSON, ` +
            'more than the arguments of any process can hold: this request is larger',
        ),
      )
    })
  // the token is in the headers: a request without it is refused before its body is read (or asked for)
  const authorized: RequestHandler = (req, res, next) => {
    const presented = createHash('sha256')
      .update(bearerCredential(req.get('authorization')))
      .digest()
    if (!timingSafeEqual(presented, expected)) {
      leaveBodyUnread(req, res)
      throw new AppError(401, 'invalid_command_token', 'A local command needs the token from DATA_DIR/serve.json')
    }
    next()
  }
  // The large commands' bodies read, parsed and run at once, counted by their announced length (the bound when they
  // announce none) until their answer is sent or their connection closes. One command always fits, however large, and
  // one of 1 MiB or less is not counted; past the budget the next is refused 503 `overloaded`, its body unread. Eight 37.7-MB command lines sent at once took the
  // service's memory from 430 MB to 2.9 GB, and half of them timed out (an outside attack; it needs the token).
  let admitted = 0
  const admit: RequestHandler = (req, res, next) => {
    const announced = Number(req.headers['content-length'])
    const bytes = Number.isSafeInteger(announced) && announced >= 0 ? Math.min(announced, MAX_COMMAND_REQUEST_BYTES + 1) : MAX_COMMAND_REQUEST_BYTES
    if (bytes <= UNCOUNTED_COMMAND_BYTES) return next()
    if (admitted > 0 && admitted + bytes > COMMANDS_BUDGET_BYTES) {
      leaveBodyUnread(req, res)
      res.setHeader('Retry-After', '1')
      throw new AppError(503, 'overloaded', 'The service is reading or running other large commands; try again in a moment')
    }
    admitted += bytes
    let released = false
    res.on('close', () => {
      if (released) return
      released = true
      admitted -= bytes
    })
    next()
  }
  router.post(LOCAL_CLI_PATH, authorized, admit, json, async (req, res) => {
    const args: unknown = req.body?.args
    if (
      !Array.isArray(args) ||
      !args.every((arg) => typeof arg === 'string') ||
      !FORWARDED_COMMANDS.has(String(args[0]))
    ) {
      throw new AppError(
        400,
        'invalid_payload',
        // a newer CLI reads the list from this message to tell that this service is older (running-service.ts)
        `${COMMANDS_TAKEN_PREFIX}${[...FORWARDED_COMMANDS].join(', ')}`,
      )
    }
    // a command sent during a first start waits for the migrations instead of meeting missing tables
    if (!(await settlesWithin(whenReady, readyWaitMs))) {
      throw new AppError(503, 'not_ready', 'The service is still preparing its database; try again in a moment')
    }
    // from here on an answer other than the result (the service stopping meanwhile) leaves what it did unknown
    res.setHeader(COMMAND_STARTED_HEADER, 'true')
    res.json(await runCommand(args as string[], context))
  })
  return router
}


async function settlesWithin(promise: Promise<void>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms)
  })
  try {
    return await Promise.race([promise.then(() => true as const), timeout])
  } catch {
    return false
  } finally {
    clearTimeout(timer)
  }
}
