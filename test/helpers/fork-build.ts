// A fork's build under test: the compiled service as a fork ships it, some of its files its own. The project's own
// files that a fork edits (src/webhooks/partner-event-handlers.ts, src/reactions/partner-handlers.ts) register no
// handler, so no other process test runs one through the compiled CLI; a test writes the fork's version, as
// JavaScript, over the compiled one.
import { copyFileSync, cpSync, existsSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'

const root = path.resolve(import.meta.dirname, '../..')

export interface ForkBuild {
  /** The directory: dist/, package.json, node_modules (linked), and whatever files the test keeps beside them. */
  directory: string
  /** Its compiled CLI, run from the directory: `spawnCli(args, env, { cli })` (helpers/cli-process.ts). */
  cli: string
  /** Writes `text` over the build's `file` (`dist/src/...js`), which must be one the build has. */
  write(file: string, text: string): void
}

/**
 * The compiled dist/ (helpers/build-dist.ts built it) copied into a directory of its own, with package.json beside it
 * and node_modules linked; removed by a clean-up pushed on `cleanups`.
 */
export function forkBuild(cleanups: (() => Promise<void>)[]): ForkBuild {
  const directory = mkdtempSync(path.join(tmpdir(), 'fork-build-'))
  cleanups.push(async () => rmSync(directory, { recursive: true, force: true }))
  cpSync(path.join(root, 'dist'), path.join(directory, 'dist'), { recursive: true })
  copyFileSync(path.join(root, 'package.json'), path.join(directory, 'package.json'))
  symlinkSync(path.join(root, 'node_modules'), path.join(directory, 'node_modules'))
  return {
    directory,
    cli: path.join(directory, 'dist/src/cli.js'),
    write(file, text) {
      // a file the build does not have would be written and never loaded: the test's mistake, not the fork's
      if (!existsSync(path.join(directory, file))) throw new Error(`forkBuild: the build has no ${file} to write over`)
      writeFileSync(path.join(directory, file), text)
    },
  }
}
