// The embedded database's own thread (started by pglite-thread.ts). PGlite is Postgres compiled to
// WebAssembly: on the thread that serves HTTP, every statement it runs holds up every request. Here it
// runs beside that thread, and the two share nothing but these messages:
//   { id, op: 'query', sql, params, rowMode, tx? }  → { id, result } | { id, error }
//   { id, op: 'begin' }                             → { id, result: txId } once inside the transaction
//   { id, op: 'end', tx, commit }                   → { id } after its COMMIT or ROLLBACK
//   { id, op: 'listen', channel }                   → { id, result: listenId }; then { notify: listenId, payload }
//   { id, op: 'unlisten', listen }, { id, op: 'dump' } (→ a gzipped tarball's bytes), { id, op: 'close' }
// It answers { ready: true } once the database is up, or { failed } if it cannot start.
import { parentPort, workerData } from 'node:worker_threads'
import { PGlite, type Transaction } from '@electric-sql/pglite'
import type { PgliteRequest, PgliteWorkerData, SerializedError } from './pglite-thread.js'

const port = parentPort!
const { location, startParams, template } = workerData as PgliteWorkerData

const pglite = new PGlite(location, {
  ...(template ? { loadDataDir: new Blob([template]) } : {}),
  startParams: [...PGlite.defaultStartParams, ...startParams],
})

// an open transaction: its PGlite handle and the function that ends it (true commits)
interface OpenTransaction {
  tx: Transaction
  end: (commit: boolean) => void
  ended: Promise<void>
}
const transactions = new Map<number, OpenTransaction>()
const listeners = new Map<number, () => Promise<void>>()
let nextId = 1

// the rollback's reason inside PGlite's transaction(): thrown to make it roll back, not reported
const ROLLBACK = Symbol('rollback')

function serializeError(error: unknown): SerializedError {
  if (error instanceof Error) {
    // PGlite's database errors carry the server's fields (code, severity, detail ...) as own properties
    const fields: Record<string, unknown> = {}
    for (const [key, value] of Object.entries(error)) {
      if (value === null || ['string', 'number', 'boolean'].includes(typeof value)) fields[key] = value
    }
    return { name: error.name, message: error.message, fields }
  }
  return { name: 'Error', message: String(error), fields: {} }
}

async function handle(request: PgliteRequest): Promise<unknown> {
  switch (request.op) {
    case 'query': {
      const target = request.tx === undefined ? pglite : transactions.get(request.tx)?.tx
      if (!target) throw new Error('the transaction has ended')
      const { rows, affectedRows, fields } = await target.query(request.sql, request.params, { rowMode: request.rowMode })
      return { rows, affectedRows, fields }
    }
    case 'begin':
      return begin()
    case 'end': {
      const open = transactions.get(request.tx)
      if (!open) throw new Error('the transaction has ended')
      open.end(request.commit)
      await open.ended
      return undefined
    }
    case 'listen': {
      const id = nextId++
      listeners.set(id, await pglite.listen(request.channel, (payload) => port.postMessage({ notify: id, payload })))
      return id
    }
    case 'unlisten': {
      const unlisten = listeners.get(request.listen)
      listeners.delete(request.listen)
      if (unlisten && !pglite.closed) await unlisten()
      return undefined
    }
    case 'dump': {
      const dump = await pglite.dumpDataDir('gzip')
      return new Uint8Array(await dump.arrayBuffer())
    }
    case 'close':
      if (!pglite.closed) await pglite.close()
      return undefined
  }
}

// Resolves with the transaction's id once PGlite is inside it (it holds the database: other statements
// wait their turn). The transaction ends when 'end' comes: committed, or rolled back.
function begin(): Promise<number> {
  const id = nextId++
  return new Promise<number>((resolve, reject) => {
    let end!: (commit: boolean) => void
    const decided = new Promise<boolean>((settle) => (end = settle))
    let begun = false
    const ended = pglite
      .transaction(async (tx) => {
        begun = true
        transactions.set(id, { tx, end, ended })
        resolve(id)
        if (!(await decided)) throw ROLLBACK
      })
      .then(
        () => {},
        (error: unknown) => {
          if (error !== ROLLBACK) throw error
        },
      )
      .finally(() => transactions.delete(id))
    // a BEGIN that failed never entered the callback: the caller learns it from 'begin'
    ended.catch((error: unknown) => {
      if (!begun) reject(error)
    })
  })
}

port.on('message', (request: PgliteRequest) => {
  handle(request).then(
    (result) => port.postMessage({ id: request.id, result }),
    (error: unknown) => port.postMessage({ id: request.id, error: serializeError(error) }),
  )
})

pglite.waitReady.then(
  () => port.postMessage({ ready: true }),
  (error: unknown) => port.postMessage({ failed: serializeError(error) }),
)
