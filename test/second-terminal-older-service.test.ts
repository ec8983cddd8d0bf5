// A second terminal's CLI beside a service started from an older build, from before `reactions` and `prune` were
// forwarded (88a7ef1): that service's command endpoint refuses them with a 400. The service here answers as that
// build's src/local/local-cli.ts did, word for word, so no old build needs to be started.
import { once } from 'node:events'
import { writeFileSync } from 'node:fs'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import path from 'node:path'
import { afterAll, beforeAll, expect, it } from 'vitest'
import { receiverEnv, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

// the commands the service took before 88a7ef1
const OLD_COMMANDS = ['orders', 'deliveries', 'trades', 'disputes', 'proposals', 'reconcile', 'migrate']
const TOKEN = 'older-service-token'

const oldService = createServer((request, response) => {
  let body = ''
  request.on('data', (chunk) => (body += chunk))
  request.on('end', () => {
    const args = (JSON.parse(body) as { args: string[] }).args
    response.setHeader('content-type', 'application/json')
    if (request.url !== '/_local/cli' || request.headers.authorization !== `Bearer ${TOKEN}`) {
      response.statusCode = 401
      response.end(JSON.stringify({ error: { code: 'invalid_command_token', message: 'A local command needs the token from DATA_DIR/serve.json' } }))
    } else if (!OLD_COMMANDS.includes(args[0]!)) {
      response.statusCode = 400
      response.end(
        JSON.stringify({
          error: { code: 'invalid_payload', message: `args must be a command line starting with one of: ${OLD_COMMANDS.join(', ')}` },
        }),
      )
    } else {
      response.end(JSON.stringify({ code: 0, stdout: '(no orders)\n', stderr: '' }))
    }
  })
})
const dataDir = migratedDataDir('older-service-')

beforeAll(async () => {
  oldService.listen(0, '127.0.0.1')
  await once(oldService, 'listening')
  const { port } = oldService.address() as AddressInfo
  // this test's process stands for the service's: a pid that runs
  writeFileSync(
    path.join(dataDir, 'serve.json'),
    JSON.stringify({
      pid: process.pid,
      url: `http://127.0.0.1:${port}`,
      adminUrl: `http://127.0.0.1:${port}`,
      token: TOKEN,
      webhookUrl: `http://127.0.0.1:${port}/webhooks/escrow`,
      database: { kind: 'pglite', location: dataDir },
    }),
    { mode: 0o600 },
  )
})
afterAll(() => {
  oldService.close()
})

it('says that the running service is older and does not run `prune` or `reactions` (exit 1), instead of its bare 400', async () => {
  for (const args of [['prune'], ['prune', '--dry-run'], ['reactions', 'list']]) {
    const result = await runCli(args, receiverEnv(dataDir))
    expect(result.code, `${args.join(' ')}: ${result.stderr}`).toBe(1)
    expect(result.stderr).toBe(
      `The service running from ${dataDir} (pid ${process.pid}) is older than this CLI and does not run \`${args[0]}\`. ` +
        'Restart it with this build, or stop it and run the command alone. [service_too_old]\n',
    )
    expect(result.stdout).toBe('')
  }
})

it('still runs in that service the commands it takes', async () => {
  const result = await runCli(['orders', 'list'], receiverEnv(dataDir))
  expect(result.code, result.stderr).toBe(0)
  expect(result.stdout).toBe('(no orders)\n')
})
