// A listener that cannot open names the variable to change: the compiled `serve` with each of its three ports
// taken by another process, and a host that is no address of this machine. Node's own words were "listen
// EADDRINUSE: address already in use 127.0.0.1:3000", which names neither.
import { once } from 'node:events'
import { createServer, type Server } from 'node:net'
import { afterAll, describe, expect, it } from 'vitest'
import { describeListenError } from '../src/listen-error.js'
import { freePort, runCli } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const taken: Server[] = []
afterAll(() => {
  for (const server of taken) server.close()
})

async function takePort(): Promise<number> {
  const server = createServer()
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  taken.push(server)
  return (server.address() as { port: number }).port
}

describe('a listener that cannot open', () => {
  it('names PORT, ADMIN_PORT or SANDBOX_PORT when another process holds it, and exits 1', async () => {
    for (const setting of ['PORT', 'ADMIN_PORT', 'SANDBOX_PORT']) {
      const busy = await takePort()
      const env: Record<string, string> = {
        DATA_DIR: migratedDataDir('listen-'),
        PORT: String(await freePort()),
        ADMIN_PORT: String(await freePort()),
        SANDBOX_PORT: String(await freePort()),
        [setting]: String(busy),
      }
      const result = await runCli(['serve'], env, { built: true })
      expect(result.code, setting).toBe(1)
      expect(result.stderr).toBe(`${setting}=${busy}: another process already listens on 127.0.0.1:${busy}; stop it, or set ${setting} to a free port\n`)
    }
  })

  it('names --port when `sandbox --port` is held by another process', async () => {
    const busy = await takePort()
    const result = await runCli(['sandbox', '--port', String(busy)], { DATA_DIR: migratedDataDir('listen-') }, { built: true })
    expect({ code: result.code, stderr: result.stderr }).toEqual({
      code: 1,
      stderr: `--port=${busy}: another process already listens on 127.0.0.1:${busy}; stop it, or set --port to a free port\n`,
    })
  })

  it('names HOST when it is no address of this machine', async () => {
    // 192.0.2.0/24 is reserved for documentation: no machine has it
    const env = { DATA_DIR: migratedDataDir('listen-'), HOST: '192.0.2.1', PORT: String(await freePort()) }
    const result = await runCli(['serve'], env, { built: true })
    expect(result.code).toBe(1)
    expect(result.stderr).toBe(
      'HOST=192.0.2.1: no such address on this machine (EADDRNOTAVAIL); set HOST to one of its addresses, such as 127.0.0.1 or 0.0.0.0\n',
    )
  })

  it('says what a privileged port needs, and lets any other error through as it is', () => {
    const target = { portSetting: 'PORT', hostSetting: 'HOST', port: 80, host: '0.0.0.0' }
    const denied = Object.assign(new Error('listen EACCES: permission denied 0.0.0.0:80'), { code: 'EACCES' })
    expect(describeListenError(denied, target).message).toBe(
      'PORT=80: this user may not listen on 0.0.0.0:80 (ports under 1024 need privileges); set PORT to 1024 or above',
    )
    const other = Object.assign(new Error('something else'), { code: 'EMFILE' })
    expect(describeListenError(other, target)).toBe(other)
  })
})
