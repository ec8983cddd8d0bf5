import { once } from 'node:events'
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import express from 'express'
import { describe, expect, it } from 'vitest'
import { listen } from '../src/http/server.js'
import { freePort, spawnCli, waitForLogLine } from './helpers/cli-process.js'

describe('graceful shutdown', () => {
  it('finishes a request in flight, then refuses new connections', async () => {
    const app = express()
    let release!: () => void
    const held = new Promise<void>((resolve) => {
      release = resolve
    })
    app.get('/slow', async (_req, res) => {
      await held
      res.json({ finished: true })
    })
    const running = await listen(app, { port: 0, host: '127.0.0.1' })

    const inFlight = fetch(`${running.url}/slow`)
    await new Promise((resolve) => setTimeout(resolve, 50))
    const stopped = running.stop(5_000)
    await new Promise((resolve) => setTimeout(resolve, 50))
    release()

    const response = await inFlight
    expect(response.status).toBe(200)
    expect(await response.json()).toEqual({ finished: true })
    await stopped
    await expect(fetch(`${running.url}/slow`)).rejects.toThrow()
  })

  it('drops a request that outlives the grace period instead of hanging', async () => {
    const app = express()
    app.get('/never', () => {
      // never answers
    })
    const running = await listen(app, { port: 0, host: '127.0.0.1' })
    const inFlight = fetch(`${running.url}/never`).then(
      () => 'answered',
      () => 'dropped',
    )
    await new Promise((resolve) => setTimeout(resolve, 50))
    await running.stop(100)
    expect(await inFlight).toBe('dropped')
  })

  it('starts `serve` with no environment, answers /readyz, and exits 0 on SIGTERM', async () => {
    const dataDir = mkdtempSync(path.join(tmpdir(), 'serve-'))
    const child = spawnCli(['serve'], {
      DATA_DIR: dataDir,
      PORT: '0',
      ADMIN_PORT: '0',
      SANDBOX_PORT: String(await freePort()),
      POLL_ENABLED: 'false',
    })
    try {
      const listening = await waitForLogLine(child, 'service listening', 60_000)
      const ready = await fetch(`${listening.url}/readyz`)
      expect(ready.status).toBe(200)
      child.kill('SIGTERM')
      const [code] = await once(child, 'exit')
      expect(code).toBe(0)
    } finally {
      child.kill('SIGKILL')
    }
  })
})
