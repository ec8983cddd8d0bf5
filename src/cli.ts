#!/usr/bin/env node
// Entry point of `npm run cli -- <command>`, `npm start` (serve) and the `partner-escrow` bin.
import { runCommandLine } from './cli/run-cli.js'
import { forwardToLocalService } from './local/local-cli.js'

// 20.19 is the oldest Node the dependencies support (see "Supported Node.js versions" in README.md)
const [major = 0, minor = 0] = process.versions.node.split('.').map(Number)
if (major < 20 || (major === 20 && minor < 19)) {
  console.error(`Node.js 20.19 or newer is required (this is ${process.version}); see README.md`)
  process.exit(2)
}

const args = process.argv.slice(2)
// while `npm start` holds the embedded database, operator commands are run by that process
const forwarded = await forwardToLocalService(args)
process.exitCode = forwarded ?? (await runCommandLine(args))
