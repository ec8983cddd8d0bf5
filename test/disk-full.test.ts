// The compiled `serve` on PGlite whose disk fills up, on a small tmpfs of its own (mounting one needs root: the
// suite is skipped without it, and CI runs as root):
// - with the guard (DATA_DIR_MIN_FREE), deliveries are answered 503 storage_low and /readyz turns 503 once the
//   free space is under the minimum; when space is freed, both come back without a restart;
// - without it (0), the database's own failure to write its log closes it: every delivery is answered (503), none
//   hangs, and a start on the same directory once there is room again has every delivery that was answered 200.
// Before, the first write-ahead log segment PGlite could not write left its thread in a loop: deliveries waited
// with no answer and a core stayed busy until the process was killed.
import { type ChildProcess, spawnSync } from 'node:child_process'
import { randomBytes, randomUUID } from 'node:crypto'
import { once } from 'node:events'
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { receiverEnv, runCli, spawnCli, waitForLogLine } from './helpers/cli-process.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

const SENDERS = 8
// a delivery that gets no answer in this long is taken as one that never will (the fault this test is about)
const ANSWER_BOUND_MS = 60_000

const mounts: string[] = []
function mountTmpfs(sizeMb: number): string | undefined {
  const directory = mkdtempSync(path.join(tmpdir(), 'disk-full-'))
  if (spawnSync('mount', ['-t', 'tmpfs', '-o', `size=${sizeMb}m`, 'tmpfs', directory]).status !== 0) return undefined
  mounts.push(directory)
  return directory
}
const canMount = (() => {
  const directory = mountTmpfs(1)
  if (!directory) return false
  spawnSync('umount', [directory])
  mounts.pop()
  return true
})()

interface Delivery {
  id: string
  body: string
}

describe.skipIf(!canMount)('the compiled serve on PGlite when its disk fills up', () => {
  const children: ChildProcess[] = []
  afterAll(() => {
    for (const child of children) child.kill('SIGKILL')
    for (const directory of mounts) spawnSync('umount', ['-l', directory])
  })

  async function start(dataDir: string, minFree: string) {
    const child = spawnCli(['serve'], { ...receiverEnv(dataDir), DATA_DIR_MIN_FREE: minFree })
    children.push(child)
    const { url } = await waitForLogLine(child, 'service listening')
    const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
    return { child, url: String(url), exited }
  }

  /**
   * An unmatched delivery is stored whole (parked until its order exists); its note of random characters makes each
   * one weigh `noteBytes`, which the database cannot compress, so the disk fills in hundreds of deliveries, not
   * thousands.
   */
  const delivery = (noteBytes = 1_000): Delivery => {
    const reference = `full-${randomUUID()}`
    const note = randomBytes((noteBytes * 3) / 4).toString('base64')
    return { id: `full-${randomUUID()}`, body: JSON.stringify({ ...tradePayload(reference, 'funded'), note }) }
  }

  /** Senders at it until `enough` says so: what each delivery was answered, none left without an answer. */
  async function flood(url: string, noteBytes: number, enough: (answers: { status: number; code?: string }[]) => boolean) {
    const answers: { status: number; code?: string }[] = []
    const stored: Delivery[] = []
    let unanswered = 0
    await Promise.all(
      Array.from({ length: SENDERS }, async () => {
        while (!enough(answers) && unanswered === 0) {
          const next = delivery(noteBytes)
          try {
            const answer = await send(url, next)
            answers.push(answer)
            if (answer.status === 200) stored.push(next)
          } catch {
            unanswered += 1
          }
        }
      }),
    )
    return { answers, stored, unanswered }
  }

  it('with the guard: refuses deliveries under DATA_DIR_MIN_FREE, and takes them again once space is freed', async () => {
    const disk = mountTmpfs(100)!
    // room PGlite's first start needs (about 40 MB), the 16 MB minimum and a few MB to fill; freed later
    const filler = path.join(disk, 'filler')
    writeFileSync(filler, Buffer.alloc(30 * 1024 * 1024))
    const serve = await start(path.join(disk, 'data'), '16mb')

    // the guard looks once a second: 8 KB a delivery keeps a second's deliveries well within the 16 MB
    const full = await flood(serve.url, 8_000, (answers) => answers.some((answer) => answer.code === 'storage_low'))
    expect(full.unanswered).toBe(0)
    expect(full.stored.length).toBeGreaterThan(0)
    expect(full.answers.filter((answer) => answer.status !== 200 && answer.code !== 'storage_low')).toEqual([])
    const refused = await readyz(serve.url)
    expect(refused).toMatchObject({ status: 503, code: 'not_ready' })
    expect(refused.message).toContain('DATA_DIR_MIN_FREE')

    rmSync(filler)
    for (let answer = await readyz(serve.url); answer.status !== 200; answer = await readyz(serve.url)) {
      expect(answer.code).toBe('not_ready')
      await new Promise((resolve) => setTimeout(resolve, 100))
    }
    const next = delivery()
    expect(await send(serve.url, next)).toEqual({ status: 200 })
    for (const stored of full.stored.slice(-50)) expect(await send(serve.url, stored)).toEqual({ status: 200, duplicate: true })
    serve.child.kill('SIGTERM')
    expect((await serve.exited)[0]).toBe(0)
  })

  // found from outside: a start on a DATA_DIR whose disk had filled since ended on a bare ENOSPC from the embedded
  // database's lock file, exit 1
  it('a start and a command on a DATA_DIR whose disk is full exit 2 naming DATA_DIR, and leave no file behind', async () => {
    const disk = mountTmpfs(1)!
    const dataDir = path.join(disk, 'data')
    mkdirSync(dataDir)
    // every page of the disk taken
    try {
      for (let i = 0; ; i++) writeFileSync(path.join(disk, `filler-${i}`), Buffer.alloc(64 * 1024))
    } catch (error) {
      expect((error as NodeJS.ErrnoException).code).toBe('ENOSPC')
    }
    const said = `DATA_DIR: ${dataDir} cannot be written: no space left on its device (ENOSPC); free space or set DATA_DIR to a directory this user can write`
    for (const args of [['serve'], ['orders', 'list']]) {
      const result = await runCli(args, receiverEnv(dataDir))
      expect({ args, code: result.code }).toEqual({ args, code: 2 })
      // (a command says first that it is about to make a new embedded database there)
      expect(result.stderr.endsWith(`Invalid configuration [config_invalid]\n  - ${said}\n`), result.stderr).toBe(true)
    }
    expect(readdirSync(path.join(dataDir, 'pglite'))).toEqual([])
  })

  it('without it: answers every delivery when the disk is full, and keeps what it answered 200', async () => {
    const disk = mountTmpfs(60)!
    const dataDir = path.join(disk, 'data')
    const first = await start(dataDir, '0')
    // until the database is closed: a run of 503s after the last 200
    const full = await flood(first.url, 64_000, (answers) => answers.length > 0 && answers.slice(-200).every((answer) => answer.status === 503) && answers.length >= 200)
    expect(full.unanswered).toBe(0)
    expect(full.stored.length).toBeGreaterThan(0)
    expect(new Set(full.answers.map((answer) => `${answer.status} ${answer.code ?? ''}`.trim()))).toEqual(new Set(['200', '503 database_unavailable']))
    expect(await readyz(first.url)).toEqual({
      status: 503,
      code: 'not_ready',
      message: 'The embedded database stopped (its thread could not write its write-ahead log (is the disk full?)); restart the service',
    })
    first.child.kill('SIGTERM')
    expect((await first.exited)[0]).toBe(0)

    // room again: the same directory on a larger disk
    expect(spawnSync('mount', ['-o', 'remount,size=200m', disk]).status).toBe(0)
    const second = await start(dataDir, '0')
    for (const stored of full.stored) expect(await send(second.url, stored)).toEqual({ status: 200, duplicate: true })
    expect(await send(second.url, delivery())).toEqual({ status: 200 })
    second.child.kill('SIGTERM')
    expect((await second.exited)[0]).toBe(0)
  })
})

async function send(url: string, { id, body }: Delivery): Promise<{ status: number; code?: string; duplicate?: true }> {
  const response = await fetch(`${url}/webhooks/partner`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-partner-delivery-id': id, 'x-partner-signature': signBody(body) },
    body,
    signal: AbortSignal.timeout(ANSWER_BOUND_MS),
  })
  const answer = (await response.json()) as { duplicate?: true; error?: { code: string } }
  return {
    status: response.status,
    ...(answer.error ? { code: answer.error.code } : {}),
    ...(answer.duplicate ? { duplicate: true as const } : {}),
  }
}

async function readyz(url: string): Promise<{ status: number; code?: string; message?: string }> {
  const response = await fetch(`${url}/readyz`, { signal: AbortSignal.timeout(ANSWER_BOUND_MS) })
  const answer = (await response.json()) as { error?: { code: string; message: string } }
  return { status: response.status, ...(answer.error ? { code: answer.error.code, message: answer.error.message } : {}) }
}
