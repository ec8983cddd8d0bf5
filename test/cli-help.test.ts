import type { Command } from 'commander'
import { describe, expect, it } from 'vitest'
import { buildProgram } from '../src/cli/program.js'
import { runCapturedCommandLine } from '../src/cli/run-cli.js'
import { runCommandWith } from './helpers/cli-in-process.js'

function commandPaths(command: Command, prefix: string[] = []): string[][] {
  return command.commands.flatMap((sub) => [[...prefix, sub.name()], ...commandPaths(sub, [...prefix, sub.name()])])
}

const run = (args: string[]) => runCommandWith(args)

describe('the command line', () => {
  const paths = commandPaths(buildProgram(runCapturedCommandLine))

  it('has every command the operator guide names', () => {
    const names = paths.map((path) => path.join(' '))
    for (const expected of [
      'serve',
      'migrate',
      'orders create',
      'orders show',
      'orders list',
      'trades open',
      'trades fund',
      'trades get',
      'disputes open',
      'proposals create',
      'proposals respond',
      'deliveries list',
      'deliveries show',
      'deliveries reapply',
      'prune',
      'reactions list',
      'reactions show',
      'reactions retry',
      'reactions skip',
      'reactions release-stream',
      'reconcile',
      'webhook sign',
      'webhook send',
      'sandbox',
      'demo',
    ]) {
      expect(names).toContain(expected)
    }
  })

  it.each(paths.map((path) => [path.join(' '), path]))('prints help for `%s` and exits 0', async (_name, path) => {
    const result = await run([...(path as string[]), '--help'])
    expect(result.code).toBe(0)
    expect(result.stdout).toContain(`Usage: partner-escrow ${(path as string[]).join(' ')}`)
  })

  it('exits 2 with a message for an unknown command or option', async () => {
    const unknown = await run(['frobnicate'])
    expect(unknown.code).toBe(2)
    expect(unknown.stderr).toContain("unknown command 'frobnicate'")
    const option = await run(['orders', 'list', '--colour'])
    expect(option.code).toBe(2)
    expect(option.stderr).toContain("unknown option '--colour'")
  })
})
