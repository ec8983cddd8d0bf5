// A stand-in for src/db/pglite-worker.mjs whose thread ends as a crashed database's would: it says it is
// ready, and the first statement it is sent ends the thread, unanswered.
import process from 'node:process'
import { parentPort } from 'node:worker_threads'

parentPort.postMessage({ ready: true })
parentPort.on('message', () => process.exit(7))
