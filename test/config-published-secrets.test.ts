// The placeholder secrets this repository publishes (compose.yaml, the demo, the benchmarks) are refused against a
// real platform (test/config-variables.test.ts): this keeps that list whole, and compose honest about where a
// value comes from. In Compose a service's `environment:` wins over its `env_file`, so compose.yaml's DATABASE_URL,
// written out in full, ignored the one .env set, and its `${WEBHOOK_SECRETS:-placeholder}` stayed where .env
// misspelled the name.
import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { parse as parseYaml } from 'yaml'
import { PUBLISHED_SECRETS } from '../src/config.js'
import { BENCH_SECRET } from '../bench/bench-secrets.js'

const root = path.resolve(import.meta.dirname, '..')

interface ComposeService {
  build?: unknown
  command?: string[]
  environment?: Record<string, string>
}

const composeText = readFileSync(path.join(root, 'compose.yaml'), 'utf8')
const compose = parseYaml(composeText, { merge: true }) as { services: Record<string, ComposeService> }

// the variables of ours and of the sandbox command's that hold a secret
const SECRET_VARIABLES = ['WEBHOOK_SECRETS', 'PARTNER_API_SECRET', 'ADMIN_TOKEN', 'SANDBOX_CONTROL_TOKEN', 'SANDBOX_API_SECRET', 'SANDBOX_WEBHOOK_SECRET']

function filesUnder(directory: string): string[] {
  return readdirSync(path.join(root, directory), { recursive: true, encoding: 'utf8' })
    .filter((file) => file.endsWith('.ts'))
    .map((file) => path.join(directory, file))
}

describe('the secrets this repository publishes', () => {
  it("lists every secret compose.yaml gives a service, as a value or as a ${NAME:-default}'s default", () => {
    const given = Object.values(compose.services).flatMap((service) =>
      Object.entries(service.environment ?? {})
        .filter(([name]) => SECRET_VARIABLES.includes(name))
        .map(([, value]) => /^\$\{\w+:-(.*)\}$/.exec(String(value))?.[1] ?? String(value)),
    )
    expect(given.length).toBeGreaterThanOrEqual(4)
    expect(given.filter((secret) => !PUBLISHED_SECRETS.includes(secret))).toEqual([])
  })

  it('lists every placeholder marked not-for-production in the sources, the benchmarks and the docs, and the benchmarks’ secret', () => {
    const texts = [...filesUnder('src'), ...filesUnder('bench'), 'compose.yaml', '.env.example', 'README.md'].map((file) =>
      readFileSync(path.join(root, file), 'utf8'),
    )
    const marked = [...new Set(texts.flatMap((text) => [...text.matchAll(/\w[\w-]*not-for-production[\w-]*/g)].map((match) => match[0])))]
    // compose's two and the demo's two; config.ts names them all in its list
    expect(marked.length).toBeGreaterThanOrEqual(4)
    expect(marked.filter((secret) => !PUBLISHED_SECRETS.includes(secret))).toEqual([])
    expect(PUBLISHED_SECRETS).toContain(BENCH_SECRET)
  })
})

describe('compose.yaml', () => {
  it("takes DATABASE_URL from .env where it sets one, in every service that runs serve", () => {
    // the image's CMD is `serve`: a service built from it without a command of its own runs it
    const serving = Object.entries(compose.services).filter(([, service]) => service.build !== undefined && service.command === undefined)
    expect(serving.map(([name]) => name).sort()).toEqual(['receiver', 'replica1', 'replica2', 'replica3'])
    for (const [name, service] of serving) {
      expect(service.environment?.DATABASE_URL, name).toBe('${DATABASE_URL:-postgres://partner:partner@postgres:5432/partner}')
    }
  })

  it('fills in no secret of the platform for the single receiver: its own come from .env alone', () => {
    const receiver = compose.services.receiver!.environment ?? {}
    expect(Object.keys(receiver).filter((name) => name.startsWith('PARTNER_') || SECRET_VARIABLES.includes(name))).toEqual([])
  })

  it('says where a value comes from: environment: over .env, and a ${NAME:-default} filled in from .env', () => {
    expect(composeText).toContain('a variable set under a service\'s `environment:` wins over the same one in .env')
    expect(composeText).toContain('the default is taken only where NAME is set in neither')
  })
})
