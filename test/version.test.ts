import { describe, expect, it } from 'vitest'
import { runCli } from './helpers/cli-process.js'
import { PACKAGE_VERSION } from './helpers/package-version.js'

// the compiled CLI finds package.json two folders up (dist/src/), the sources one up (src/): both are asked
describe('partner-escrow --version', () => {
  it.each([
    ['from the sources', true],
    ['compiled', false],
  ])('prints package.json’s version and exits 0, %s', async (_name, source) => {
    for (const flag of ['--version', '-V']) {
      const result = await runCli([flag], {}, { source })
      expect(result.stderr).toBe('')
      expect(result.stdout).toBe(`${PACKAGE_VERSION}\n`)
      expect(result.code).toBe(0)
    }
  })
})
