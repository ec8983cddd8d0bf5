// deploy/prometheus/prometheus.yml, the example an operator copies: its scrape job must reach the listener that
// serves METRICS_PATH. It named localhost:3000, the public listener, where /metrics is 404: every scrape failed,
// `up` was 0 (PartnerEscrowDown fired at once) and no other alert had a series to fire on. The compiled `serve`
// runs on ports of its own; the example's target is read against the defaults of PORT and ADMIN_PORT.
import type { ChildProcess } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { afterAll, describe, expect, it } from 'vitest'
import { parse as parseYaml } from 'yaml'
import { parseConfig } from '../src/config.js'
import { freePort, receiverEnv, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

interface ScrapeConfig {
  job_name: string
  metrics_path?: string
  static_configs: { targets: string[] }[]
}

const children: ChildProcess[] = []
afterAll(async () => {
  for (const child of children) await stopChild(child)
})

describe('the example Prometheus configuration', () => {
  it('scrapes the operator listener, where a service with the default ports serves its metrics', async () => {
    const file = parseYaml(readFileSync('deploy/prometheus/prometheus.yml', 'utf8')) as { scrape_configs: ScrapeConfig[] }
    const job = file.scrape_configs.find((config) => config.job_name === 'partner-escrow')
    expect(job, 'a scrape job named partner-escrow, as the alert rules select').toBeDefined()
    const targets = job!.static_configs.flatMap((config) => config.targets)
    expect(targets.length).toBeGreaterThan(0)

    // the ports a service started with no PORT or ADMIN_PORT listens on
    const defaults = parseConfig({
      PARTNER_API_BASE_URL: 'http://127.0.0.1:9',
      PARTNER_API_KEY_ID: 'pk_defaults',
      PARTNER_API_SECRET: 'the-defaults-api-secret-0123456789',
      WEBHOOK_SECRETS: 'the-defaults-webhook-secret-0123456789',
    })
    const publicPort = await freePort()
    const adminPort = await freePort()
    const ours = new Map([
      [defaults.port, publicPort],
      [defaults.admin.port, adminPort],
    ])
    const child = spawnCli(
      ['serve'],
      { ...receiverEnv(migratedDataDir('prometheus-scrape-')), PORT: String(publicPort), ADMIN_PORT: String(adminPort) },
    )
    children.push(child)
    await waitForLogLine(child, 'service listening')

    for (const target of targets) {
      const port = Number(target.split(':').at(-1))
      expect(ours.has(port), `${target} is one of the service's default ports`).toBe(true)
      // what Prometheus does with the target: GET http://<target><metrics_path>
      const answer = await fetch(`http://127.0.0.1:${ours.get(port)}${job!.metrics_path ?? '/metrics'}`)
      expect(answer.status, `GET ${target}${job!.metrics_path ?? '/metrics'}`).toBe(200)
      expect(await answer.text()).toMatch(/^webhook_deliveries_total\{outcome="applied"\} 0$/m)
    }
    expect(await stopChild(child)).toBe(0)
  })
})
