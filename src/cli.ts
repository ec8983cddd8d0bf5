#!/usr/bin/env node
// Entry point of `npm run cli -- <command>`, `npm start` (serve) and the `partner-escrow` bin.
import module from 'node:module'

// V8's compile cache (Node 22.1+; absent on 20) makes each later start of the CLI skip compiling its modules
;(module as { enableCompileCache?: () => unknown }).enableCompileCache?.()
const { commandEnded, stopSignalReceived, stopWhileStarting } = await import('./stop-signals.js')
stopWhileStarting('Stopped by a signal before the command began: nothing done [stopped]\n')
const { forwardToLocalService, RunningServiceError } = await import('./local/running-service.js')
const { ignoreGoneOutput } = await import('./output-gone.js')

// 20.19+ or 22.12+ (package.json's engines: see "Supported Node.js versions" in README.md); 21 and 22.0-22.11 were
// taken without a word, though the README said they were refused (found from outside)
const [major = 0, minor = 0] = process.versions.node.split('.').map(Number)
if (major < 20 || (major === 20 && minor < 19) || major === 21 || (major === 22 && minor < 12)) {
  console.error(`Node.js 20.19+, 22.12+ or 24 is required (this is ${process.version}); see README.md`)
  process.exit(2)
}

const args = process.argv.slice(2)
// `... | head`, a closed terminal: a reader that went away is no failure of the command; an output that could not be
// written (a full disk) fails a command, not the service
ignoreGoneOutput({ failCommand: args[0] !== 'serve' })

// an argument whose bytes are not UTF-8 would be taken as Node decoded it, with U+FFFD in it (not-utf8.ts)
const notUtf8 = (await import('./not-utf8.js')).argumentNotUtf8(args)
if (notUtf8) {
  process.stderr.write(`${notUtf8}\n`)
  process.exit(2)
}
try {
  // while a service runs from DATA_DIR, commands that need the database are run by that process
  const forwarded = await forwardToLocalService(args)
  // the command tree is loaded only when the command runs here
  process.exitCode = forwarded ?? (await (await import('./cli/run-cli.js')).runCommandLine(args))
} catch (error) {
  if (!(error instanceof RunningServiceError)) throw error
  process.stderr.write(`${error.message}\n`)
  process.exitCode = error.exitCode
}
// a command that ran until a stop signal (`sandbox`, the demo's console) ends here, its handlers still up (see
// stopSignalReceived), once stdout and stderr took what it wrote (a pipe or socket whose reader is behind holds
// it, and the exit would drop it), for 5 s at most
if (stopSignalReceived()) {
  await (await import('./logger.js')).stdioWritten(5_000)
  process.exit()
}
// Any other command ends by process.exit once nothing is left to run (its output written, its last events out), as a
// process left to run dry would: left to it, Node takes the signal handlers down a few milliseconds before the process
// is gone, and a Ctrl-C then ended a command that had done its work and printed so by SIGINT (6 of 12 tries, 20-300
// ms after its output). A signal from here ends it at once with its own exit code once its output is written, and as
// before while it is not (commandEnded). `serve` as before.
if (args[0] !== 'serve') {
  commandEnded()
  process.once('beforeExit', () => process.exit())
}
