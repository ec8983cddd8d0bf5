// Run as `node --import tsx test/helpers/log-burst-then-exit.ts <lines> <json|pretty|stdio>` (logger-exit.test.ts):
// writes `lines` lines of about 1 kB to stdout, then a last one, and ends the way the process it stands for ends:
// - json, pretty: through the service's logger (JSON, or the human-readable lines of LOG_PRETTY), then as serve
//   ends: flushLogger, then exitProcess;
// - stdio: with process.stdout.write, then as a CLI command stopped by a signal ends (cli.ts): stdioWritten,
//   then process.exit.
// On stderr it says when it starts waiting and whether the wait saw every line written. Each logged line also
// carries text of two to four bytes a character and a configured secret, which no line may show.
import { createLogger, exitProcess, flushLogger, stdioWritten } from '../../src/logger.js'

// as serve and the CLI do: a reader that went away is not a failure
process.stdout.on('error', (error: NodeJS.ErrnoException) => {
  if (error.code !== 'EPIPE') throw error
})
const lines = Number(process.argv[2] ?? 2_000)
const format = process.argv[3] ?? 'json'
const filler = 'x'.repeat(1_000)
const reportWait = (written: boolean) => process.stderr.write(`${JSON.stringify({ written })}\n`)

if (format === 'stdio') {
  for (let line = 0; line < lines; line++) process.stdout.write(`burst ${line} ${filler}\n`)
  process.stdout.write('the last line\n')
  process.stderr.write('waiting\n')
  reportWait(await stdioWritten(120_000))
  process.exit(0)
}
const BURST_SECRET = 'never-shown-0123456789'
const BURST_TEXT = 'Zürich — ✓ 🚀'
const logger = createLogger({ level: 'info', pretty: format === 'pretty', secrets: [BURST_SECRET] })
for (let line = 0; line < lines; line++) logger.info({ line, filler, text: BURST_TEXT, careless: BURST_SECRET }, 'burst')
logger.info('the last line')
process.stderr.write('waiting\n')
reportWait(await flushLogger(logger, 120_000))
exitProcess(logger, 0)
