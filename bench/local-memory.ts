// `npx tsx bench/local-memory.ts [seconds]`: the resident memory of local mode, what `npm start` runs
// (`node --import tsx src/cli.ts serve`: the service, the poller and the sandbox on embedded PGlite),
// sampled every 500 ms from /proc: once on a fresh DATA_DIR (the first start initialises the database) and
// once more on the same directory (every later start). Reports the peak (VmHWM), the RSS 1 s after the service
// said it was listening, and the RSS at the end of the idle period. LOCAL_MEMORY_NODE_FLAGS adds Node's (and V8's)
// flags to the service's command line, to compare settings.
import { spawn } from 'node:child_process'
import { once } from 'node:events'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { peakRssMb, rssMb } from './service-process.js'

const root = path.resolve(import.meta.dirname, '..')
const seconds = Number(process.argv[2] ?? 60)
const nodeFlags = (process.env.LOCAL_MEMORY_NODE_FLAGS ?? '').split(' ').filter(Boolean)

async function sample(dataDir: string): Promise<{ readyS: number; peakMb: number; listeningMb: number; idleMb: number }> {
  const child = spawn(process.execPath, [...nodeFlags, '--import', 'tsx', path.join(root, 'src/cli.ts'), 'serve'], {
    cwd: root,
    env: { PATH: process.env.PATH, HOME: process.env.HOME, DATA_DIR: dataDir, PORT: '0', ADMIN_PORT: '0', SANDBOX_PORT: '0', LOG_LEVEL: 'info' },
    stdio: ['ignore', 'pipe', 'inherit'],
  })
  const started = Date.now()
  let readyS = Number.NaN
  child.stdout!.on('data', (chunk: Buffer) => {
    if (Number.isNaN(readyS) && chunk.toString().includes('"msg":"service listening"')) readyS = (Date.now() - started) / 1000
  })
  let idleMb = 0
  let listeningMb = Number.NaN
  while (Date.now() - started < seconds * 1000) {
    await new Promise((resolve) => setTimeout(resolve, 500))
    if (child.exitCode !== null) throw new Error(`serve exited with ${child.exitCode}`)
    idleMb = rssMb(child.pid!)
    if (Number.isNaN(listeningMb) && Date.now() - started >= (readyS + 1) * 1000) listeningMb = idleMb
  }
  const peakMb = peakRssMb(child.pid!)
  child.kill('SIGTERM')
  await once(child, 'exit')
  return { readyS, peakMb, listeningMb, idleMb }
}

const dataDir = mkdtempSync(path.join(tmpdir(), 'local-memory-'))
try {
  const first = await sample(dataDir)
  const again = await sample(dataDir)
  console.log(JSON.stringify({ seconds, node: process.version, nodeFlags, firstStart: first, laterStart: again }))
} finally {
  rmSync(dataDir, { recursive: true, force: true })
}
