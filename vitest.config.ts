import { existsSync, readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { availableParallelism } from 'node:os'
import { defineConfig } from 'vitest/config'

// Projects over the same files. "process": the suites that run the CLI or the service as a child
// process (they import helpers/cli-process.ts), or a script of their own in a Node of its own (`spawn(process.execPath`:
// data-dir-lock.test.ts's holders of a DATA_DIR): the slowest, so CI runs them once, on the oldest supported
// Node. "in-process" and "in-process-mocks": everything else, which CI runs on every supported Node.
// `npx vitest run --project 'in-process*'` runs only those.
const testFiles = readdirSync('test', { recursive: true, encoding: 'utf8' })
  .filter((file) => file.endsWith('.test.ts'))
  .map((file) => `test/${file}`)
const processFiles = testFiles.filter((file) => {
  const text = readFileSync(file, 'utf8')
  return text.includes('/helpers/cli-process.js') || text.includes('spawn(process.execPath')
})
// the in-process files that mock a module, run each with modules of its own (below)
const mockingFiles = testFiles.filter((file) => !processFiles.includes(file) && /\bvi\.(do)?[mM]ock\(/.test(readFileSync(file, 'utf8')))

// Whether a test file, or a test helper it imports (however deep), opens the test database (helpers/test-database.ts)
// or reads TEST_DATABASE_URL: the files that do not run the same with or without it.
function reachesTestDatabase(testFile: string): boolean {
  const seen = new Set<string>()
  const next = [testFile]
  for (let file = next.pop(); file !== undefined; file = next.pop()) {
    if (seen.has(file)) continue
    seen.add(file)
    const text = readFileSync(file, 'utf8')
    if (text.includes('TEST_DATABASE_URL') || text.includes('/test-database.js')) return true
    for (const [, imported] of text.matchAll(/from '(\.{1,2}\/[^']+)\.js'/g)) {
      const helper = path.join(path.dirname(file), `${imported}.ts`)
      if (helper.startsWith(`test${path.sep}`) && existsSync(helper)) next.push(helper)
    }
  }
  return false
}
// CI's second run of the suite, on Postgres and Node 24, leaves out the process suites among those
// (SKIP_DATABASE_FREE_PROCESS_SUITES=1 in .ci/run): the first run, on PGlite and Node 20, ran them the same, and a
// process suite runs once. So are the cases on embedded PGlite of the process suites that run a case on both
// (helpers/cli-process.ts, embeddedRanBefore). The in-process ones stay: they are quick, and they are that run's
// check of Node 24.
const skipped =
  process.env.SKIP_DATABASE_FREE_PROCESS_SUITES === '1' ? processFiles.filter((file) => !reachesTestDatabase(file)) : []

export default defineConfig({
  test: {
    setupFiles: ['test/helpers/setup.ts'],
    // the check of what a file leaves in its process (helpers/process-leaks.ts): on where files share one (below)
    provide: { filesShareProcess: false },
    // one initialised and one migrated PGlite, made once and loaded by every test file's createTestDatabase()
    globalSetup: ['test/helpers/pglite-template.ts'],
    // A bound on a hang, not a measure of speed: these machines are shared, and a test that passes in 5 s
    // quiet took over 30 s under a load of 25 on 2 cores. What a test checks is behaviour, never its time.
    testTimeout: 300_000,
    hookTimeout: 300_000,
    pool: 'forks',
    // Most files spend their time waiting on a child process or the database, not on a core: at least three
    // at once (vitest's default is one fewer than the cores, so one file at a time on these 2-core machines).
    // The whole suite on PGlite, 2 cores: 959 s one file at a time; 541 s three at a time, with the process
    // tests' copied DATA_DIRs (helpers/data-dir-template.ts), the cores 93 % busy.
    maxWorkers: Math.max(3, availableParallelism() - 1),
    // Each test file starts PGlite, whose start runs enough of Postgres for V8 to recompile much of its WebAssembly
    // with the optimising compiler, on threads of its own, for a file that then runs a few hundred statements. The
    // baseline compiler alone (what one-shot commands use: src/db/pglite-thread.ts, compileForShortRuns) cost 33 %
    // less CPU: eight of the in-process files, twice each in turn, 59.2 and 56.8 s of user CPU against 39.0 and
    // 37.3 s (2026-12-05, 2 cores). What the code does is the same under either compiler.
    execArgv: ['--liftoff-only'],
    projects: [
      // The in-process files share their worker's modules, one file after another (isolate: false): a new process and
      // a fresh import of every module for each file cost 39 % more CPU (20 of them on PGlite, 99.8 against 61.0 s of
      // user and system CPU, 2026-12-06). What a file leaves in a module's state is the next file's: each logs into the
      // shared sink, emptied at each file's end (helpers/setup.ts). A file that mocks a module (vi.mock) gets its own
      // modules (the project after this one): a module a file before it imported would be the real one.
      { extends: true, test: { name: 'in-process', include: ['test/**/*.test.ts'], exclude: [...processFiles, ...mockingFiles], isolate: false, provide: { filesShareProcess: true } } },
      { extends: true, test: { name: 'in-process-mocks', include: mockingFiles.length > 0 ? mockingFiles : ['no-such-file'], isolate: true } },
      // and dist/ compiled once before its files run (test/helpers/build-dist.ts; added to the global setup
      // above, which runs only for a project with a test file in the run). Its files share their worker's modules
      // too: a new process and the vitest runner, helpers and modules imported afresh for each file cost some 2 s of
      // CPU a file (12 of them on PGlite, twice each way in turn: 132.5 and 142.1 s of user and system CPU against 107.9
      // and 114.5 s, 2026-12-06). What they leave behind, the directories their children ran in, is removed at each
      // file's end (helpers/setup.ts), and what a file leaves in the process fails it, as in "in-process" (every one of
      // them ran clean under that check when it was turned on here, on PGlite and on Postgres, 2026-12-06).
      { extends: true, test: { name: 'process', include: processFiles, exclude: skipped, globalSetup: ['test/helpers/build-dist.ts'], isolate: false, provide: { filesShareProcess: true } } },
    ],
  },
})
