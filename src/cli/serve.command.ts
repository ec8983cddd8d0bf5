import type { Command } from 'commander'
import { main } from '../main.js'

export function registerServeCommand(program: Command): void {
  program
    .command('serve')
    .description('run the webhook receiver and the poller (what `npm start` runs)')
    .action(async () => {
      await main()
    })
}
