// V8's settings for a process that runs one short command.
import v8 from 'node:v8'

/**
 * For a process that runs one short command, not for the service: one that opens the embedded database for it
 * (PgliteThreadOptions.shortRun). WebAssembly compiled by V8's baseline compiler
 * only. By default V8 also recompiles the functions that run hot with its optimising compiler, on threads of its own, and PGlite's start runs enough of Postgres to set that off for a command that
 * then runs a few statements. Measured 2026-12-05, Node 20, 2 cores, `orders list` on an existing DATA_DIR: 2.06 s
 * of CPU and 279 MB peak RSS by default, 1.33 s and 200 MB this way (1.9 s and 1.55 s from start to exit); a first
 * command, which initialises the database, 5.8 s of CPU against 3.9 s. A long one loses little: 300,000 rows
 * inserted, indexed and half deleted took 22 % longer. Set before the database's thread starts; the service does not
 * set it. Node 22's V8 takes it (1.25-1.73 s and 213-217 MB, from 1.91-2.21 s and 275-279 MB). Node 24's does not
 * once started (2.4 s and 667 MB either way), but it takes a tiering budget no function of a short command spends,
 * which keeps the optimising compiler out the same way: see README, "A command on its own", for the figures. (A
 * command forwarded to the running service set it too while it went through fetch, whose HTTP parser is WebAssembly:
 * it now goes through node:http, local/service-request.ts.)
 */
export function compileForShortRuns(): void {
  v8.setFlagsFromString('--liftoff-only')
  v8.setFlagsFromString(`--wasm-tiering-budget=${2 ** 31 - 1}`)
}
