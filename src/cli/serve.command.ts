import type { Command } from 'commander'
import type { LocalCommandRunner } from '../local/local-cli.js'

export function registerServeCommand(program: Command, runCommand: LocalCommandRunner): void {
  program
    .command('serve')
    .description('run the webhook receiver and the poller (what `npm start` runs)')
    .action(async () => {
      const { main } = await import('../main.js')
      await main({ runCommand })
    })
}
