import type { Command } from 'commander'

export function registerServeCommand(program: Command): void {
  program
    .command('serve')
    .description('run the webhook receiver and the poller (what `npm start` runs)')
    .action(async () => {
      const { main } = await import('../main.js')
      await main()
    })
}
