// `serve` of a compiled tree with one in-process reaction handler registered that does nothing: the ingest
// benchmark's "one handler registered" without a second process at the far end (the forwarder's run has
// one). Run as `node bench/serve-noop-handler.mjs <dist>`; the environment is serve's. Plain JavaScript, so
// the measured process runs the compiled code alone, as `node dist/src/cli.js serve` does.
import { writeFileSync } from 'node:fs'
import path from 'node:path'
import process from 'node:process'
import { pathToFileURL } from 'node:url'

const dist = process.argv[2]
if (!dist) throw new Error('usage: serve-noop-handler.mjs <dist>')
const load = (file) => import(pathToFileURL(path.join(path.resolve(dist), file)).href)
const { main } = await load('src/main.js')
const { runCapturedCommandLine } = await load('src/cli/run-cli.js')
// BENCH_HANDLER_STARTS=<file>: when each event's call began (its id and the time in ms), written to the file as
// the process exits, for the bench to read commit-to-handler from the commits (bench/commit-latency.ts)
const startsFile = process.env.BENCH_HANDLER_STARTS
const ids = []
const atMs = []
if (startsFile) process.once('exit', () => writeFileSync(startsFile, JSON.stringify({ ids, atMs })))
await main({
  runCommand: runCapturedCommandLine,
  registerReactions: (reactions) =>
    reactions.on('trade.*', 'noop', async (event) => {
      if (startsFile) {
        ids.push(event.eventId)
        atMs.push(Date.now())
      }
    }),
})
