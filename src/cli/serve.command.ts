import type { Command } from 'commander'
import type { LocalCommandRunner } from '../local/local-cli.js'

export function registerServeCommand(serve: Command, runCommand: LocalCommandRunner): void {
  serve.action(async () => {
      const { main } = await import('../main.js')
      await main({ runCommand })
    })
}
