// The configuration cannot run, said problem by problem: `serve` and every command exit 2 with these lines
// (run-cli.ts knows it by its name, so that `--help` does not load the configuration's schema).
export class ConfigError extends Error {
  constructor(readonly problems: readonly string[]) {
    super(`Invalid configuration:\n  - ${problems.join('\n  - ')}`)
    this.name = 'ConfigError'
  }
}
