// The configuration cannot run, said problem by problem: `serve` and every command exit 2 with these lines
// (run-cli.ts knows it by its name, so that `--help` does not load the configuration's schema). Its first line ends in
// its code, as every other refusal of the CLI's does (`… [trade_not_recorded]`), so a script can tell it apart.
export class ConfigError extends Error {
  readonly code = 'config_invalid'
  constructor(readonly problems: readonly string[]) {
    super(`Invalid configuration [config_invalid]\n  - ${problems.join('\n  - ')}`)
    this.name = 'ConfigError'
  }
}
