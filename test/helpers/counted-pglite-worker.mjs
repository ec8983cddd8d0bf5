// src/db/pglite-worker.mjs, each start of its thread noted in the file named by COUNTED_PGLITE_THREADS
// (`start <thread id>`): how many threads a database took.
import { appendFileSync } from 'node:fs'
import process from 'node:process'
import { threadId } from 'node:worker_threads'

if (process.env.COUNTED_PGLITE_THREADS) appendFileSync(process.env.COUNTED_PGLITE_THREADS, `start ${threadId}\n`)
await import('../../src/db/pglite-worker.mjs')
