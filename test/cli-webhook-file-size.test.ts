// `webhook sign|send --file` read the file whole: `--file /dev/zero` grew the process to 2 GB and ended it with no
// line (an outside tester's cli-hostile.sh). The body is read up to 16 MiB; a file, a device or a FIFO holding more
// is a bad argument, exit 2, refused before anything is signed or sent. The compiled CLI, as run.
import { execFileSync, spawn } from 'node:child_process'
import { createHmac } from 'node:crypto'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import http from 'node:http'
import type { AddressInfo } from 'node:net'
import { tmpdir } from 'node:os'
import path from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { runCli } from './helpers/cli-process.js'
import { rememberSecret } from './helpers/log-sink.js'

const secret = 'cli-webhook-file-size-secret-0123456789'
rememberSecret(secret)
const BOUND = 16 * 1024 * 1024
const dir = mkdtempSync(path.join(tmpdir(), 'cli-webhook-file-size-'))
const env = { DATA_DIR: dir, LOG_LEVEL: 'warn' }
const tooLarge = (file: string) =>
  `--file ${file} holds more than 16,777,216 bytes, the most a body is read to: nothing was signed or sent [file_too_large]\n`

describe('webhook sign|send --file past 16 MiB', () => {
  let receiver: http.Server
  let url: string
  let requests = 0
  beforeAll(async () => {
    receiver = http.createServer((req, res) => {
      requests++
      req.resume()
      res.end('{"received":true}')
    })
    await new Promise<void>((resolve) => receiver.listen(0, '127.0.0.1', resolve))
    url = `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/webhooks/partner`
  })
  afterAll(async () => {
    await new Promise((resolve) => receiver.close(resolve))
    rmSync(dir, { recursive: true, force: true })
  })

  it('refuses /dev/zero, exit 2, and sends nothing', async () => {
    for (const args of [['sign'], ['send', '--url', url]]) {
      const result = await runCli(['webhook', ...args, '--file', '/dev/zero', '--secret', secret], env)
      expect(result, args[0]).toEqual({ code: 2, stdout: '', stderr: tooLarge('/dev/zero') })
    }
    expect(requests).toBe(0)
  })

  it('refuses a FIFO whose writer does not stop', async () => {
    const fifo = path.join(dir, 'endless.fifo')
    execFileSync('mkfifo', [fifo])
    const writer = spawn('sh', ['-c', `exec yes > '${fifo}'`], { stdio: 'ignore' })
    try {
      const result = await runCli(['webhook', 'send', '--file', fifo, '--secret', secret, '--url', url], env)
      expect(result).toEqual({ code: 2, stdout: '', stderr: tooLarge(fifo) })
      expect(requests).toBe(0)
    } finally {
      writer.kill('SIGKILL')
    }
  })

  it('signs a file of exactly 16 MiB, and refuses one byte more', async () => {
    const exact = path.join(dir, 'exact.json')
    const body = Buffer.alloc(BOUND, 'a')
    writeFileSync(exact, body)
    const signed = await runCli(['webhook', 'sign', '--file', exact, '--secret', secret, '--delivery-id', 'dlv_1', '--json'], env)
    expect(signed.code).toBe(0)
    expect(JSON.parse(signed.stdout)).toMatchObject({ 'X-Partner-Signature': `sha256=${createHmac('sha256', secret).update(body).digest('hex')}` })

    const over = path.join(dir, 'over.json')
    writeFileSync(over, Buffer.alloc(BOUND + 1, 'a'))
    expect(await runCli(['webhook', 'sign', '--file', over, '--secret', secret], env)).toEqual({
      code: 2,
      stdout: '',
      stderr: tooLarge(over),
    })
  })

  it('still sends a small body whole', async () => {
    const small = path.join(dir, 'small.json')
    writeFileSync(small, '{"event":"seller.updated"}')
    const result = await runCli(['webhook', 'send', '--file', small, '--secret', secret, '--url', url, '--json'], env)
    expect(result.code).toBe(0)
    expect(JSON.parse(result.stdout)).toMatchObject({ status: 200, body: { received: true } })
    expect(requests).toBe(1)
  })
})
