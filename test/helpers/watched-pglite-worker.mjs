// src/db/pglite-worker.mjs as Node's watch mode runs it since Node 24: the thread posts the files it imports
// to its parent on the same channel as the worker's own messages, before and between them.
import { parentPort } from 'node:worker_threads'

parentPort.postMessage({ 'watch:import': [import.meta.url] })
await import('../../src/db/pglite-worker.mjs')
parentPort.postMessage({ 'watch:import': ['node:path'] })
