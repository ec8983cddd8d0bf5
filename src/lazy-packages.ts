// Packages loaded the first time they are used, not when a module that uses them is imported. Most CLI commands run on
// the embedded database, call neither the platform nor a receiver, and publish to no broker; yet their modules import
// the client's, the forwarder's, the Postgres pool's and the publisher's. Loading these three cost every command's
// start 300 ms of CPU (`node -e "require(name)"` against `node -e 0`, 2026-12-07: undici 170 ms, pg 90, amqplib 40).
// Each is CommonJS: this `require` gives the same instance an `import` does.
import { createRequire } from 'node:module'
import type Amqplib from 'amqplib'
import type Pg from 'pg'
import type * as Undici from 'undici'

const require = createRequire(import.meta.url)

function onFirstUse<T>(name: string): () => T {
  let loaded: T | undefined
  return () => {
    loaded ??= require(name) as T
    return loaded
  }
}

export const undici = onFirstUse<typeof Undici>('undici')
export const pgDriver = onFirstUse<typeof Pg>('pg')
export const amqplib = onFirstUse<typeof Amqplib>('amqplib')
