// The compiled CLI refuses a Node outside the supported ones (package.json's engines: 20.19+, 22.12+, 24), exit 2
// with a message: 21 and 22.0-22.11 used to be taken without a word, though the README said they were refused (found
// from outside). The Node version is faked by a module loaded first (test/fixtures/fake-node-version.mjs).
import { spawnSync } from 'node:child_process'
import path from 'node:path'
import { describe, expect, it } from 'vitest'
import { childEnv } from './helpers/cli-process.js'

const root = path.resolve(import.meta.dirname, '..')

function cliOn(version: string) {
  const result = spawnSync(process.execPath, ['--import', path.join(root, 'test/fixtures/fake-node-version.mjs'), path.join(root, 'dist/src/cli.js'), '--version'], {
    env: childEnv({ FAKE_NODE_VERSION: version }),
    encoding: 'utf8',
  })
  return { code: result.status, stderr: result.stderr }
}

describe('the Node versions the CLI runs on', () => {
  it.each(['18.20.0', '20.18.1', '21.7.3', '22.0.0', '22.11.0'])('refuses %s, exit 2, saying which are supported', (version) => {
    expect(cliOn(version)).toEqual({ code: 2, stderr: `Node.js 20.19+, 22.12+ or 24 is required (this is v${version}); see README.md\n` })
  })

  it.each(['20.19.0', '22.12.0', '24.0.0'])('runs on %s', (version) => {
    expect(cliOn(version)).toEqual({ code: 0, stderr: '' })
  })
})
