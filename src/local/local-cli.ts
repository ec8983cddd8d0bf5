// The service side of src/local/running-service.ts: POST /_local/cli runs a command line forwarded by a
// second terminal, in this process, against this process's database, and returns its output.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto'
import express, { Router } from 'express'
import type { CliContext } from '../cli/cli-context.js'
import { runCommandLine } from '../cli/run-cli.js'
import { AppError } from '../http/app-error.js'
import { FORWARDED_COMMANDS, LOCAL_CLI_PATH } from './running-service.js'

export function createLocalCliToken(): string {
  return randomBytes(32).toString('hex')
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

