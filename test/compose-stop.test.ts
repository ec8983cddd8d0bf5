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
  profiles?: string[]
  ports?: string[]
  depends_on?: Record<string, unknown>
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

  // the replicas depended on the simulator, so it started beside a real platform, published on every interface
  // with the platform's API secret and webhook secret from .env (a rotation list `old,new` as one secret)
  it('starts the simulator only when it is named, with secrets of its own, published on the host’s loopback only', () => {
    const text = readFileSync('compose.yaml', 'utf8')
    const file = parseYaml(text, { merge: true }) as { services: Record<string, ComposeService> }
    const sandbox = file.services.sandbox!
    expect(sandbox.command).toEqual(['node', 'dist/src/cli.js', 'sandbox'])
    expect(sandbox.profiles).toEqual(['sandbox'])
    const dependingOnIt = Object.entries(file.services).filter(([, service]) => service.depends_on && 'sandbox' in service.depends_on)
    expect(dependingOnIt.map(([name]) => name)).toEqual([])
    expect(Object.values(sandbox.environment ?? {}).filter((value) => String(value).includes('$'))).toEqual([])
    expect(sandbox.ports).toEqual(['127.0.0.1:4010:4010'])
    // the replicas' defaults are the simulator's own: with no platform in .env they sign what it verifies
    const replica = file.services.replica1!.environment!
    expect(replica.PARTNER_API_KEY_ID).toBe(`\${PARTNER_API_KEY_ID:-${sandbox.environment!.SANDBOX_API_KEY_ID}}`)
    expect(replica.PARTNER_API_SECRET).toBe(`\${PARTNER_API_SECRET:-${sandbox.environment!.SANDBOX_API_SECRET}}`)
    expect(replica.WEBHOOK_SECRETS).toBe(`\${WEBHOOK_SECRETS:-${sandbox.environment!.SANDBOX_WEBHOOK_SECRET}}`)
  })
})
