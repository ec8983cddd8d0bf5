// `npm run bench -- cli` (or `tsx bench/cli-startup.ts` alone): how long a command line takes to answer,
// as ratios against baselines measured in the same run, in turn, on the same machine:
//   the compiled CLI (the package's bin) `--help`, and `orders show` next to a running `serve` (the
//   newcomer's second terminal), against a bare `node -e 0`;
//   `npm run cli -- --help` against `npm run` of a script that does nothing;
//   `orders list` on an embedded database of its own (no service running: the command opens it, as in a
//   second DATA_DIR or with the service stopped), against a script that opens the same database with PGlite alone
//   and runs one select (what any program reading it pays); no target, reported beside the others.
// Medians of interleaved runs, so a burst of load on the machine hits every subject alike.
import { execFileSync, spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { performance } from 'node:perf_hooks'

const root = path.resolve(import.meta.dirname, '..')
const cli = path.join(root, 'dist/src/cli.js')

export interface CliStartupResult {
  rounds: number
  medianMs: Record<string, number>
  targets: string[][]
  /** Ratios reported with no target. */
  beside: string[][]
}

function timeRun(command: string, args: string[], options: { cwd: string; env: NodeJS.ProcessEnv }): number {
  const started = performance.now()
  execFileSync(command, args, { ...options, stdio: ['ignore', 'ignore', 'pipe'] })
  return performance.now() - started
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)]!
}

export async function runCliStartupBench({ rounds = 9 } = {}): Promise<CliStartupResult> {
  execFileSync(process.execPath, [path.join(root, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.build.json'], { cwd: root })
  const dataDir = mkdtempSync(path.join(tmpdir(), 'bench-cli-'))
  const env = { PATH: process.env.PATH, HOME: process.env.HOME, DATA_DIR: dataDir }
  // a project with one script that does nothing: what `npm run` itself costs
  const emptyProject = mkdtempSync(path.join(tmpdir(), 'bench-npm-'))
  writeFileSync(path.join(emptyProject, 'package.json'), JSON.stringify({ name: 'empty', private: true, scripts: { empty: 'true' } }))

  const service = spawn(process.execPath, [cli, 'serve'], {
    cwd: root,
    env: { ...env, PORT: '0', ADMIN_PORT: '0', SANDBOX_PORT: '0', POLL_ENABLED: 'false', LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  try {
    let banner = ''
    service.stdout.on('data', (chunk) => (banner += chunk))
    // the banner's last part (it names `npm run demo` or the compiled CLI's `demo`, as it was started)
    while (!banner.includes('Try next, in another terminal')) {
      if (service.exitCode !== null) throw new Error(`serve exited with ${service.exitCode}`)
      await new Promise((resolve) => setTimeout(resolve, 50))
    }
    execFileSync(process.execPath, [cli, 'orders', 'create', '--external-reference', 'bench-1'], { cwd: root, env })
    // a second data directory, its database made and migrated by a first command, that no service holds
    const ownDataDir = mkdtempSync(path.join(tmpdir(), 'bench-cli-own-'))
    const ownEnv = { ...env, DATA_DIR: ownDataDir }
    execFileSync(process.execPath, [cli, 'orders', 'create', '--external-reference', 'bench-own-1'], { cwd: root, env: ownEnv, stdio: 'ignore' })
    const pgliteAlone = path.join(ownDataDir, 'pglite-alone.mjs')
    writeFileSync(
      pgliteAlone,
      `import { PGlite } from ${JSON.stringify(import.meta.resolve('@electric-sql/pglite'))}\n` +
        `const db = await PGlite.create(${JSON.stringify(path.join(ownDataDir, 'pglite'))})\n` +
        `await db.query('select external_reference from orders order by id limit 50')\n` +
        'await db.close()\n',
    )

    const subjects: Record<string, () => number> = {
      'node -e 0': () => timeRun(process.execPath, ['-e', '0'], { cwd: root, env }),
      'partner-escrow --help': () => timeRun(process.execPath, [cli, '--help'], { cwd: root, env }),
      'partner-escrow orders show': () => timeRun(process.execPath, [cli, 'orders', 'show', 'bench-1'], { cwd: root, env }),
      'npm run (empty script)': () => timeRun('npm', ['run', '--silent', 'empty'], { cwd: emptyProject, env }),
      'npm run cli -- --help': () => timeRun('npm', ['run', '--silent', 'cli', '--', '--help'], { cwd: root, env }),
      'PGlite alone: open, one select, close': () => timeRun(process.execPath, [pgliteAlone], { cwd: root, env: ownEnv }),
      'partner-escrow orders list (its own embedded database)': () => timeRun(process.execPath, [cli, 'orders', 'list'], { cwd: root, env: ownEnv }),
    }
    const times: Record<string, number[]> = Object.fromEntries(Object.keys(subjects).map((name) => [name, []]))
    // one warm-up of each (disk cache, tsx's compile cache), then the measured rounds
    for (const run of Object.values(subjects)) run()
    for (let round = 0; round < rounds; round++) {
      for (const [name, run] of Object.entries(subjects)) times[name]!.push(run())
    }
    const medianMs = Object.fromEntries(Object.entries(times).map(([name, values]) => [name, Math.round(median(values))]))
    const ratio = (a: string, b: string) => medianMs[a]! / medianMs[b]!
    const row = (target: string, value: number) => [target, `${value.toFixed(2)}×`, value <= 3 ? 'yes' : 'no']
    return {
      rounds,
      medianMs,
      targets: [
        row('compiled CLI `--help` ≤ 3× `node -e 0`', ratio('partner-escrow --help', 'node -e 0')),
        row('compiled CLI `orders show` (service running) ≤ 3× `node -e 0`', ratio('partner-escrow orders show', 'node -e 0')),
        row('`npm run cli -- --help` ≤ 3× `npm run` of an empty script', ratio('npm run cli -- --help', 'npm run (empty script)')),
      ],
      beside: [
        [
          'compiled CLI `orders list` on its own embedded database / PGlite alone opening it for one select',
          `${ratio('partner-escrow orders list (its own embedded database)', 'PGlite alone: open, one select, close').toFixed(2)}×`,
        ],
      ],
    }
  } finally {
    service.kill('SIGTERM')
    if (service.exitCode === null) await once(service, 'exit')
  }
}

export function formatCliStartup(result: CliStartupResult): string {
  const lines = [
    `## CLI start-up (median of ${result.rounds} interleaved runs)`,
    '',
    '| command | median ms |',
    '|---|---|',
    ...Object.entries(result.medianMs).map(([name, ms]) => `| ${name} | ${ms} |`),
    '',
    '| target | measured | met |',
    '|---|---|---|',
    ...result.targets.map((cells) => `| ${cells.join(' | ')} |`),
    '',
    '| beside, no target | measured |',
    '|---|---|',
    ...result.beside.map((cells) => `| ${cells.join(' | ')} |`),
  ]
  return `${lines.join('\n')}\n`
}

export async function benchCliStartup(): Promise<void> {
  const result = await runCliStartupBench()
  const markdown = `# CLI start-up\n\n${new Date().toISOString()}, Node ${process.version}\n\n${formatCliStartup(result)}`
  process.stdout.write(markdown)
  writeFileSync(path.join(root, 'bench/results/latest-cli.md'), markdown)
  writeFileSync(path.join(root, 'bench/results/latest-cli.json'), `${JSON.stringify(result, null, 2)}\n`)
}

if (import.meta.url === `file://${process.argv[1]}`) await benchCliStartup()
