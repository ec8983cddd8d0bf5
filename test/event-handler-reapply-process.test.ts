// A fork's seller handler, in a fork's build: the compiled service with src/webhooks/partner-event-handlers.js as a
// fork writes it (the project's own registers none, so the suite's other processes run no event handler). The
// handler fails at the ingest, again in a command sent to the running service from a second terminal, and runs
// once its cause is put right in `deliveries reapply` run on its own: the command reads the fork's registry itself.
import type { ChildProcess } from 'node:child_process'
import { once } from 'node:events'
import { readFileSync, rmSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { expect, it } from 'vitest'
import { endedAfterAll, jsonLogLines, receiverEnv, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'
import { forkBuild } from './helpers/fork-build.js'
import { postDelivery } from './helpers/webhook-delivery.js'

const { children, cleanups } = endedAfterAll()

/**
 * A fork's build in a directory of its own: the compiled service, its seller handler writing each run to `ran`, failing
 * while the file `failing` is there, and waiting, once it has written `held`, while the file `hold` is.
 */
function forkWithSellerHandler(): { cli: string; ran: string; failing: string; hold: string } {
  const { directory, cli, write } = forkBuild(cleanups)
  const ran = path.join(directory, 'ran.txt')
  // while this file is there, the registry the handler writes to is down
  const failing = path.join(directory, 'registry-down')
  const hold = path.join(directory, 'hold')
  writeFileSync(ran, '')
  writeFileSync(failing, '')
  write(
    'dist/src/webhooks/partner-event-handlers.js',
    `import { appendFileSync, existsSync } from 'node:fs'
export function registerEventHandlers(events) {
  events.on('seller.verified', async ({ deliveryId, body }) => {
    appendFileSync(${JSON.stringify(ran)}, deliveryId + ' ' + body.seller_id + '\\n')
    if (existsSync(${JSON.stringify(hold)})) {
      appendFileSync(${JSON.stringify(ran)}, 'held\\n')
      while (existsSync(${JSON.stringify(hold)})) await new Promise((resolve) => setTimeout(resolve, 50))
    }
    if (existsSync(${JSON.stringify(failing)})) throw new Error('the seller registry is down')
    return 'applied'
  })
}
`,
  )
  return { cli, ran, failing, hold }
}

function run(cli: string, args: string[], env: Record<string, string>): ChildProcess {
  const child = spawnCli(args, env, { cli })
  children.push(child)
  return child
}

async function ended(child: ChildProcess): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const output = collected(child)
  const [code] = (await once(child, 'close')) as [number | null]
  return { code, ...output }
}

/** What the child writes, as it comes. */
function collected(child: ChildProcess): { stdout: string; stderr: string } {
  const output = { stdout: '', stderr: '' }
  child.stdout!.on('data', (chunk) => (output.stdout += chunk))
  child.stderr!.on('data', (chunk) => (output.stderr += chunk))
  return output
}

/** Resolves once `check` holds, looked at every 50 ms; throws naming `what` after 60 s. */
async function until(check: () => boolean, what: string): Promise<void> {
  const gaveUpAt = Date.now() + 60_000
  while (!check()) {
    if (Date.now() > gaveUpAt) throw new Error(`waited 60 s for ${what}`)
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
}

/** A fork's build whose seller handler failed at the ingest of dlv-fork-1: the delivery stored ignored, the service stopped. */
async function failedAtIngest() {
  const fork = forkWithSellerHandler()
  const env = receiverEnv(migratedDataDir('fork-handlers-'))
  const serve = run(fork.cli, ['serve'], env)
  const { url } = (await waitForLogLine(serve, 'service listening')) as { url: string }
  expect((await postDelivery(url, { id: 'dlv-fork-1', body: BODY })).status).toBe(500)
  expect(await stopChild(serve)).toBe(0)
  rmSync(fork.failing)
  return { fork, env }
}

const BODY = '{"event":"seller.verified","seller_id":"s-77","status":"verified"}'

it('a fork’s seller handler that failed at the ingest runs again with deliveries reapply: through the service, then on its own once the cause is put right', async () => {
  const fork = forkWithSellerHandler()
  const dataDir = migratedDataDir('fork-handlers-')
  const env = receiverEnv(dataDir)
  const serve = run(fork.cli, ['serve'], env)
  const { url } = (await waitForLogLine(serve, 'service listening')) as { url: string }
  const serviceLog = jsonLogLines(serve)

  const first = await postDelivery(url, { id: 'dlv-fork-1', body: BODY })
  expect(first.status).toBe(500)
  expect(readFileSync(fork.ran, 'utf8')).toBe('dlv-fork-1 s-77\n')

  // a second terminal: the command runs in the service, with the service's handlers
  const inService = await ended(run(fork.cli, ['deliveries', 'reapply', 'dlv-fork-1'], env))
  expect(inService).toMatchObject({ code: 1, stdout: '' })
  expect(inService.stderr).toContain(
    'The handler for seller.verified failed again on delivery dlv-fork-1 (its error is logged with the delivery id): the delivery ' +
      'stays stored as ignored; reapply it again once what failed is put right [event_handler_failed]\n',
  )
  expect(readFileSync(fork.ran, 'utf8')).toBe('dlv-fork-1 s-77\n'.repeat(2))
  expect(await stopChild(serve)).toBe(0)
  // it ran in the service, whose log has its failure (the id, the type, the error; never the body)
  const failures = serviceLog.filter((line) => String(line.msg).startsWith('webhook event handler failed'))
  expect(failures.map((line) => [line.msg, line.deliveryId, line.eventType])).toEqual([
    ['webhook event handler failed; the delivery stays stored as ignored', 'dlv-fork-1', 'seller.verified'],
    ['webhook event handler failed again on a re-apply; the delivery stays stored as it was', 'dlv-fork-1', 'seller.verified'],
  ])
  expect(JSON.stringify(serviceLog)).not.toContain('s-77')

  // the registry back, and the command on its own: it builds the fork's handlers itself
  rmSync(fork.failing)
  const alone = await ended(run(fork.cli, ['deliveries', 'reapply', 'dlv-fork-1'], env))
  expect(alone).toEqual({ code: 0, stdout: 'dlv-fork-1: applied (seller.verified: its handler ran again)\n', stderr: '' })
  expect(readFileSync(fork.ran, 'utf8')).toBe('dlv-fork-1 s-77\n'.repeat(3))
  const shown = await ended(run(fork.cli, ['deliveries', 'show', 'dlv-fork-1', '--json'], env))
  expect(JSON.parse(shown.stdout)).toMatchObject({ deliveryId: 'dlv-fork-1', eventType: 'seller.verified', outcome: 'applied' })
}, 180_000)

/** `deliveries reapply` of dlv-fork-1 (failedAtIngest), given SIGINT while its handler is held; its first line read. */
async function interruptedWhileHeld() {
  const { fork, env } = await failedAtIngest()
  writeFileSync(fork.hold, '')
  const command = run(fork.cli, ['deliveries', 'reapply', 'dlv-fork-1'], env)
  const output = collected(command)
  await until(() => readFileSync(fork.ran, 'utf8').endsWith('held\n'), 'the handler to be held')
  command.kill('SIGINT')
  await until(() => output.stderr.includes('\n'), "the command's first line after SIGINT")
  return { fork, env, command, output }
}

it('a stop signal while the handler runs again: the line says the command waits for it, then prints what it did; exit 130', async () => {
  const { fork, command, output } = await interruptedWhileHeld()
  rmSync(fork.hold)
  const [code] = (await once(command, 'close')) as [number | null]
  expect({ code, ...output }).toEqual({
    code: 130,
    stdout: 'dlv-fork-1: applied (seller.verified: its handler ran again)\n',
    stderr:
      "stopping once the delivery's handlers return (a second Ctrl-C ends the process now, in the middle of a handler: what it did " +
      'by then is its own to tell, and `deliveries show dlv-fork-1` shows whether the delivery was recorded applied)\n' +
      "stopped by a signal after the delivery in flight: dlv-fork-1's handlers ran again (above)\n",
  })
}, 180_000)

it('a second stop signal while the handler runs again: ends at once, saying the handler was cut off; exit 130', async () => {
  const { fork, env, command, output } = await interruptedWhileHeld()
  command.kill('SIGTERM')
  const [code] = (await once(command, 'close')) as [number | null]
  expect({ code, stdout: output.stdout }).toEqual({ code: 130, stdout: '' })
  expect(output.stderr.split('\n').slice(1).join('\n')).toBe(
    "Stopped by a second signal while delivery dlv-fork-1's handlers ran: what they did by then is their own to tell; " +
      '`deliveries show dlv-fork-1` shows whether the delivery was recorded applied [stopped]\n',
  )
  rmSync(fork.hold)
  const shown = await ended(run(fork.cli, ['deliveries', 'show', 'dlv-fork-1', '--json'], env))
  expect(JSON.parse(shown.stdout)).toMatchObject({ outcome: 'ignored' })
}, 180_000)
