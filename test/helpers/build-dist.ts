// vitest globalSetup of the "process" project (vitest.config.ts): compiles src/ into dist/ once, as
// `npm run build` does, before any of its test files runs. Those files run the compiled CLI and service as
// the image does (spawnCli), so each needs dist/ from the sources under test, from its first
// test on: in a fresh clone nothing else has built it, and several files compiling it at once would rewrite
// files that another file's child process is loading.
import { execFileSync } from 'node:child_process'
import path from 'node:path'

const root = path.resolve(import.meta.dirname, '../..')

export default function setup(): void {
  // with the umask `npm run build` has: the PGlite template's set-up, in this same process before it, made the umask
  // 077 (db/private-directory.ts), and dist/ files new to this build came out 0600, unreadable to the tests that run
  // the compiled CLI as another user (test/data-dir.test.ts's run as nobody)
  const umask = process.umask(0o022)
  try {
    execFileSync(process.execPath, [path.join(root, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.build.json'], { cwd: root })
  } finally {
    process.umask(umask)
  }
}
