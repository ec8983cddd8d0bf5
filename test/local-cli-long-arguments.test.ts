// A command whose arguments are long is answered the same beside a running service as with none running. The
// service refused any command line past 64 KiB as JSON (`The running service refused the command (413): …
// [service_refused]`), where the command run alone refused a long reference in its own words, or ran. The compiled
// CLI beside a compiled service on the embedded database, as an operator runs them.
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { freePort, runCli, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { migratedDataDir } from './helpers/data-dir-template.js'

const CREATE_REFUSAL =
  'Invalid order: external_reference: must be 1 to 200 characters without a NUL or a lone surrogate, as every webhook for the order carries it [invalid_arguments]\n'
// the longest one argument can be on Linux (MAX_ARG_STRLEN, less its NUL)
const LONGEST_ARGUMENT = 128 * 1024 - 1

describe('a command line past 64 KiB beside `npm start` on the embedded database', () => {
  const serviceEnv = { DATA_DIR: migratedDataDir('local-cli-long-'), PORT: '0', ADMIN_PORT: '0', POLL_ENABLED: 'false', SANDBOX_PORT: '0' }
  // the same database, with no service running from its DATA_DIR: the command runs in its own process
  const aloneEnv = { DATA_DIR: migratedDataDir('local-cli-long-alone-'), POLL_ENABLED: 'false' }
  let service: ReturnType<typeof spawnCli>

  beforeAll(async () => {
    serviceEnv.SANDBOX_PORT = String(await freePort())
    service = spawnCli(['serve'], serviceEnv)
    await waitForLogLine(service, 'service listening')
  })
  afterAll(async () => {
    await stopChild(service)
  })

  const besideService = (args: string[]) => runCli(args, { DATA_DIR: serviceEnv.DATA_DIR })
  const alone = (args: string[]) => runCli(args, aloneEnv)

  it.each([
    ['orders show', (reference: string) => ['orders', 'show', reference]],
    ['orders create', (reference: string) => ['orders', 'create', '--external-reference', reference]],
  ])('%s with a reference of 131,071 control characters is refused as create refuses it, service or not: exit 2', async (_name, command) => {
    const args = command('\u0001'.repeat(LONGEST_ARGUMENT))
    const expected = { code: 2, stdout: '', stderr: CREATE_REFUSAL }
    expect(await besideService(args)).toEqual(expected)
    expect(await alone(args)).toEqual(expected)
  })

  it('runs a command of 2,500 references, some 3 MB as JSON, in the service as it runs alone', async () => {
    const references = Array.from({ length: 2_500 }, (_, i) => `${'\u0001'.repeat(190)}ref-${String(i).padStart(6, '0')}`)
    const args = ['reconcile', '--requeue', ...references, '--json']
    expect(JSON.stringify({ args }).length).toBeGreaterThan(2_800_000)
    const beside = await besideService(args)
    expect(beside.code).toBe(1)
    // every reference reached the command: --json lists each one it does not know, the line the first 20
    expect(JSON.parse(beside.stdout)).toEqual({ results: [], missing: references })
    expect(beside.stderr).toMatch(/^No order with external references \\u0001.*ref-000019 and 2,480 more \(--json lists them all\) \[order_not_found\]\n$/)
    expect(await alone(args)).toEqual(beside)
  })
})
