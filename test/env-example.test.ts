// `.env.example` is where a newcomer learns what can be set (README, "Configuration"): every variable the
// configuration reads is in it, set or commented out. SLOW_BODY_MS was read and not there.
import { readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'
import { CONFIG_VARIABLES } from '../src/config.js'

const example = readFileSync('.env.example', 'utf8')
const documented = (name: string) => new RegExp(`^(# ?)?${name}=`, 'm').test(example)

describe('.env.example', () => {
  it('names every variable the configuration reads (the lower-case proxy names by their upper-case ones)', () => {
    const missing = CONFIG_VARIABLES.filter((name) => !documented(name) && !(name === name.toLowerCase() && documented(name.toUpperCase())))
    expect(missing).toEqual([])
    expect(CONFIG_VARIABLES.length).toBeGreaterThan(50)
  })

  it('sets no HOST: under `docker run --env-file` it would win over the image’s 0.0.0.0', () => {
    expect(example).not.toMatch(/^HOST=/m)
  })
})
