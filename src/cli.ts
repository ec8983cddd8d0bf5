#!/usr/bin/env node
// Entry point of `npm run cli -- <command>`, `npm start` (serve) and the `partner-escrow` bin.
import { CommanderError } from 'commander'
import { UsageError } from './cli/cli-context.js'
import { buildProgram } from './cli/program.js'
import { ConfigError } from './config.js'

const [major] = process.versions.node.split('.').map(Number)
if ((major ?? 0) < 22) {
  console.error(`Node.js 22 or newer is required (this is ${process.version}); see README.md`)
  process.exit(2)
}

const program = buildProgram()
program.exitOverride()
for (const command of program.commands) command.exitOverride()

try {
  await program.parseAsync(process.argv)
} catch (error) {
  if (error instanceof CommanderError) {
    // help and version are not failures; every other parse error is a usage error
    process.exitCode = error.exitCode === 0 ? 0 : 2
  } else if (error instanceof UsageError || error instanceof ConfigError) {
    console.error(error.message)
    process.exitCode = 2
  } else {
    console.error(error instanceof Error ? error.message : String(error))
    process.exitCode = 1
  }
}
