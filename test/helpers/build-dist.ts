// vitest globalSetup of the "process" project (vitest.config.ts): compiles src/ into dist/ once, as
// `npm run build` does, before any of its test files runs. Those files run the compiled CLI and service as
// the image does (spawnCli with `built`), so each needs dist/ from the sources under test, from its first
// test on: in a fresh clone nothing else has built it, and several files compiling it at once would rewrite
// files that another file's child process is loading.
import { execFileSync } from 'node:child_process'
import path from 'node:path'

const root = path.resolve(import.meta.dirname, '../..')

export default function setup(): void {
  execFileSync(process.execPath, [path.join(root, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.build.json'], { cwd: root })
}
