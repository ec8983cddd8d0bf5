// compose.yaml: Docker sends SIGKILL `stop_grace_period` after its SIGTERM (10 s when unset), and a stopping
// `serve` may take SHUTDOWN_DRAIN_DELAY_MS + SHUTDOWN_TIMEOUT_MS (README, "SIGTERM drains"). Every service that
// runs `serve` must give it more, or `docker compose stop` can cut its drain, and its last log lines, short. The
// receiver had no stop_grace_period: Docker's 10 s against the service's own 10 s bound.
import { readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import { parse as parseYaml } from 'yaml'

interface ComposeService {
  build?: unknown
  command?: string[]
  environment?: Record<string, string>
  stop_grace_period?: string
}

/** Docker's own default when a service sets none. */
const DOCKER_DEFAULT_GRACE_S = 10

function seconds(duration: string | undefined): number {
  if (duration === undefined) return DOCKER_DEFAULT_GRACE_S
  const match = /^(\d+)(ms|s|m)$/.exec(duration)
  if (!match) throw new Error(`unexpected duration ${duration}`)
  return Number(match[1]) * { ms: 0.001, s: 1, m: 60 }[match[2] as 'ms' | 's' | 'm']
}

describe('compose.yaml', () => {
  it('gives every service that runs serve longer to stop than its drain delay and shutdown timeout together', () => {
    const file = parseYaml(readFileSync('compose.yaml', 'utf8'), { merge: true }) as { services: Record<string, ComposeService> }
    // the image's CMD is `serve`: a service built from it without a command of its own runs it
    const serving = Object.entries(file.services).filter(([, service]) => service.build !== undefined && service.command === undefined)
    expect(serving.map(([name]) => name).sort()).toEqual(['receiver', 'replica1', 'replica2', 'replica3'])
    for (const [name, service] of serving) {
      const drainMs = Number(service.environment?.SHUTDOWN_DRAIN_DELAY_MS ?? 0)
      const timeoutMs = Number(service.environment?.SHUTDOWN_TIMEOUT_MS ?? 10_000)
      expect(seconds(service.stop_grace_period), name).toBeGreaterThan((drainMs + timeoutMs) / 1000)
    }
  })
})
