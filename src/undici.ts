// undici, loaded the first time a connection is made, not when a module that makes them is imported: loading it
// cost 170 ms of CPU (`node -e "require('undici')"` against `node -e 0`, 2026-12-07), and most CLI commands
// (`orders list`, `reactions list` ...) never call the platform or a receiver, though their modules import the
// client's and the forwarder's. The package is CommonJS: this `require` is the same instance an `import` gets.
import { createRequire } from 'node:module'
import type * as UndiciModule from 'undici'

let loaded: typeof UndiciModule | undefined

export function undici(): typeof UndiciModule {
  loaded ??= createRequire(import.meta.url)('undici') as typeof UndiciModule
  return loaded
}
