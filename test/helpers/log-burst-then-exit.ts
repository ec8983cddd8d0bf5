// Run as `node --import tsx test/helpers/log-burst-then-exit.ts <lines> [pretty]` (logger-exit.test.ts): logs
// `lines` lines of about 1 kB to stdout through the service's logger (JSON, or the human-readable lines of
// LOG_PRETTY), then a last one, and ends as serve ends: flushLogger, then exitProcess. On stderr it says when it
// starts waiting and whether the wait saw every line written.
import { createLogger, exitProcess, flushLogger } from '../../src/logger.js'

// as serve does (main.ts): a reader that went away is not a failure
process.stdout.on('error', (error: NodeJS.ErrnoException) => {
  if (error.code !== 'EPIPE') throw error
})
const lines = Number(process.argv[2] ?? 2_000)
const logger = createLogger({ level: 'info', pretty: process.argv[3] === 'pretty' })
const filler = 'x'.repeat(1_000)
for (let line = 0; line < lines; line++) logger.info({ line, filler }, 'burst')
logger.info('the last line')
process.stderr.write('waiting\n')
const written = await flushLogger(logger, 120_000)
process.stderr.write(`${JSON.stringify({ written })}\n`)
exitProcess(logger, 0)
