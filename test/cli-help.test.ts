import type { Command } from 'commander'
import { describe, expect, it } from 'vitest'
import { buildProgram } from '../src/cli/program.js'
import { runCapturedCommandLine } from '../src/cli/run-cli.js'
import { runCommandWith } from './helpers/cli-in-process.js'

function commandPaths(command: Command, prefix: string[] = []): string[][] {
  return command.commands.flatMap((sub) => [[...prefix, sub.name()], ...commandPaths(sub, [...prefix, sub.name()])])
}

const run = (args: string[]) => runCommandWith(args)

// every command filled in, as a command line naming it has it
const paths = commandPaths(await buildProgram(runCapturedCommandLine, undefined, [], { fill: 'all' }))

describe('the command line', () => {
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

  // the program's help is made from program.ts's list, without loading any command's file: it must read as the
  // help of the commands filled in
  it('lists every command in the program\'s help as it reads with the commands filled in', async () => {
    const filled = (await buildProgram(runCapturedCommandLine, undefined, [], { fill: 'all' })).helpInformation()
    expect(filled).toContain('migrate [options]')
    for (const args of [['--help'], ['help'], []]) {
      const result = await run(args)
      expect(args.length === 0 ? result.stderr : result.stdout).toBe(filled)
    }
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
