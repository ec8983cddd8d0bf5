// Embedded PGlite on a thread of its own (pglite-worker.mjs), behind the part of PGlite's interface that
// Kysely's PGliteDialect and open-database.ts use: query, transaction, listen, dumpDataDir, close; and
// collectGarbage, which frees what the database's start left on its thread.
//
// PGlite runs Postgres as WebAssembly in the thread that calls it. In local mode that was the thread
// serving HTTP, and under a full-speed ingest the database's work was two thirds of it (bench/results/
// latest.md): one core did everything while the other waited. On its own thread the database takes the
// second core, and the HTTP thread only passes it statements and rows.
//
// What crosses between the threads is copied (structured clone): parameters, rows, and errors rebuilt from
// their fields (code, severity, detail ...), so database-errors.ts reads them as it reads PGlite's own.
// A query's options cross too, but only rowMode: parsers and serializers are functions, which cannot.
// If the thread stops (a crash, an abort of the WebAssembly, a write-ahead log it could not write), every
// statement waiting and every later one fails with "PGlite is closed", which the service answers as
// unavailable (503), and one error is logged.
import { accessSync, constants, type Dirent, readdirSync } from 'node:fs'
import { userInfo } from 'node:os'
import path from 'node:path'
import { Worker } from 'node:worker_threads'
import { leftByAnotherUser, ownerOf } from '../data-dir.js'
import type { Logger } from '../logger.js'
import { commitSent } from './commit-in-flight.js'
import { compileForShortRuns } from '../short-run.js'

/** What the worker starts from (its workerData). */
export interface PgliteWorkerData {
  /** 'memory://' or the directory PGlite keeps its cluster in. */
  location: string
  /** Postgres settings after PGlite's own (`-c name=value` pairs). */
  startParams: string[]
  /** A gzipped tarball of a data directory to start from (PGlite's loadDataDir). */
  template?: ArrayBuffer | undefined
}

export type PgliteRequest = { id: number } & (
  | { op: 'query'; sql: string; params: unknown[]; rowMode: 'array' | 'object' | undefined; tx: number | undefined }
  | { op: 'begin' }
  | { op: 'end'; tx: number; commit: boolean }
  | { op: 'listen'; channel: string }
  | { op: 'unlisten'; listen: number }
  | { op: 'dump' }
  | { op: 'close' }
  | { op: 'collect' }
)

type WithoutId<T> = T extends unknown ? Omit<T, 'id'> : never

export interface SerializedError {
  name: string
  message: string
  fields: Record<string, unknown>
}

type WorkerMessage =
  | { id: number; result?: unknown; error?: SerializedError }
  | { notify: number; payload: string }
  | { ready: true }
  | { failed: SerializedError }
  /** A flush to disk failed (the file's path inside the database, Node's error code): the database must stop. */
  | { flushFailed: { file: string; code: string } }
  /** A checkpoint of the worker's own failed (its SQLSTATE), or one succeeded after such a failure. */
  | { checkpointFailed: string }
  | { checkpointed: true }
  // Node's watch mode (`npm run dev`) has every thread post the files it imports to its parent, since Node 24
  | { 'watch:import': string[] }

export interface QueryResults<T> {
  rows: T[]
  affectedRows?: number
  fields: { name: string; dataTypeID: number }[]
}

export interface QueryOptions {
  rowMode?: 'array' | 'object'
}

export interface PgliteTransaction {
  query<T>(sql: string, params?: unknown[], options?: QueryOptions): Promise<QueryResults<T>>
  rollback(): Promise<void>
}

export interface PgliteThreadOptions {
  location: string
  startParams: string[]
  template?: Blob | undefined
  logger?: Logger | undefined
  /** Opened for one short command, not for the service: see compileForShortRuns. */
  shortRun?: boolean | undefined
  /** The worker's script, pglite-worker's by default (a test gives one that stops, to see what follows). */
  script?: URL | undefined
}

// the message database-errors.ts counts as "the database is not there" (503)
const CLOSED_MESSAGE = 'PGlite is closed'
const STOPPED_PREFIX = `${CLOSED_MESSAGE}: the embedded database's thread `

/** Why the embedded database's thread stopped, when `error` is a statement's failure for that reason. */
export function embeddedDatabaseStopReason(error: unknown): string | undefined {
  const message = error instanceof Error ? error.message : undefined
  return message?.startsWith(STOPPED_PREFIX) ? message.slice(STOPPED_PREFIX.length) : undefined
}

// A write-ahead log segment PGlite could not write (no space left on the disk): Postgres stops there (PANIC) and
// starts again from its log; PGlite (0.5) answers this one statement with the error and then runs in a loop on
// the next, answering nothing (measured on a full 60 MB tmpfs). The thread is closed at this error instead: the
// statements fail at once (503), and what was committed is in DATA_DIR for the next start.
function isWalWriteFailure({ message, fields }: SerializedError): boolean {
  return fields.code === '53100' && message.includes('pg_wal/')
}

// A flush to disk that failed (EIO from a failing disk): Postgres stops there (PANIC) and starts again from its log,
// since what it wrote may not be on disk; PGlite answered neither the statement nor any after it, and spun a core
// (strace injecting EIO into one fsync). The worker says so the moment it happens, and the thread is closed: what
// was answered before is on disk, the statement under way is answered 503, and its delivery is sent again.
function flushFailure({ file, code }: { file: string; code: string }): string {
  return `could not flush ${file} to disk (${code}); check the disk, then restart the service`
}

function rebuildError({ name, message, fields }: SerializedError): Error {
  const error = new Error(message)
  Object.assign(error, fields)
  error.name = name
  return error
}

// A database that cannot start from its directory says so, and what to do: PGlite's own word for damaged
// files (a control file removed, a directory copied half-way) is "Aborted(). Build with -sASSERTIONS for more
// info.", which came out as a failed migration
function startFailure(location: string, error: Error): Error {
  if (location.startsWith('memory://')) return error
  const notOurs = filesNotWritable(location)
  if (notOurs) return new Error(`the embedded database could not start from ${location}: ${notOurs}`)
  return new Error(
    `the embedded database could not start from ${location} (${error.message}): its files may be damaged or written by another version; restore DATA_DIR from a backup, or move it aside to start an empty one`,
  )
}

// How many of the database's files are looked at for one this user cannot write, at most (a database of local
// mode's size holds about a thousand).
const FILES_LOOKED_AT = 20_000

/**
 * Why files of the database cannot be used by this user, when some cannot be read and written: files a run as
 * another user left (`sudo npm start` once, then `npm start`). PGlite's own word for that was the same
 * "Aborted()" as for damaged files, and the advice was to restore a backup. Undefined when every file looked at is
 * this user's to write (or when nothing can be looked at).
 */
export function filesNotWritable(location: string): string | undefined {
  const found: string[] = []
  let count = 0
  let looked = 0
  const walk = (directory: string) => {
    let entries: Dirent[]
    try {
      entries = readdirSync(directory, { withFileTypes: true })
    } catch {
      return
    }
    for (const entry of entries) {
      if (looked++ >= FILES_LOOKED_AT) return
      const file = path.join(directory, entry.name)
      try {
        accessSync(file, constants.R_OK | constants.W_OK)
      } catch {
        count += 1
        if (found.length < 3) found.push(file)
        continue
      }
      if (entry.isDirectory()) walk(file)
    }
  }
  walk(location)
  if (count === 0) return undefined
  const examples = found.map((file) => `${path.relative(location, file)} (owned by ${ownerOf(file)})`).join(', ')
  return `${count} of its files cannot be read and written by this user (${userInfo().username}), e.g. ${examples}: ${leftByAnotherUser(path.dirname(location), count)}`
}

// the worker's file beside this one, in src/ and in dist/ alike: plain JavaScript, so that it runs without a
// loader from source too (pglite-worker.mjs says why)
function startWorker(data: PgliteWorkerData, transferList: ArrayBuffer[], script: URL | undefined): Worker {
  return new Worker(script ?? new URL('./pglite-worker.mjs', import.meta.url), { workerData: data, transferList })
}

export class PgliteThread {
  closed = false
  ready = false
  readonly waitReady: Promise<void>
  private worker: Worker | undefined
  private nextId = 1
  private readonly pending = new Map<number, { resolve: (value: unknown) => void; reject: (error: Error) => void }>()
  private readonly notifications = new Map<number, (payload: string) => void>()
  private stopReason: Error | undefined
  // closes the thread for good: every statement waiting and every later one fails with the reason
  private fail: ((reason: string) => void) | undefined

  constructor(private readonly options: PgliteThreadOptions) {
    this.waitReady = this.start()
    // a start that fails is reported to whoever waits; this keeps it from being an unhandled rejection
    this.waitReady.catch(() => {})
  }

  private async start(): Promise<void> {
    const { location, startParams, template, logger, script, shortRun } = this.options
    if (shortRun) compileForShortRuns()
    const templateBytes = template ? await template.arrayBuffer() : undefined
    const worker = startWorker({ location, startParams, template: templateBytes }, templateBytes ? [templateBytes] : [], script)
    this.worker = worker
    // the thread keeps the process alive only while it starts and while a call waits on it, as a database
    // connection would: a stop that waits for the start (to close the database) must not find the loop empty
    const started = new Promise<void>((resolve, reject) => {
      worker.on('message', (message: WorkerMessage) => {
        if ('id' in message) this.settle(message)
        else if ('notify' in message) this.notifications.get(message.notify)?.(message.payload)
        else if ('ready' in message) resolve()
        else if ('failed' in message) reject(startFailure(location, rebuildError(message.failed)))
        else if ('flushFailed' in message) this.fail?.(flushFailure(message.flushFailed))
        else if ('checkpointFailed' in message) {
          logger?.warn({ code: message.checkpointFailed }, "the embedded database's checkpoint failed: its write-ahead log (pg_wal) grows until one succeeds [checkpoint_failed]")
        } else if ('checkpointed' in message) logger?.info("the embedded database's checkpoints succeed again")
      })
      const stopped = (reason: string) => {
        const wasOpen = !this.closed
        this.closed = true
        // the first reason stands: the exit that follows an error, a close or the thread's own close says less
        this.stopReason ??= new Error(`${STOPPED_PREFIX}${reason}`)
        reject(this.stopReason)
        for (const { reject: fail } of this.pending.values()) fail(this.stopReason)
        this.pending.clear()
        this.worker?.unref()
        if (wasOpen) logger?.error({ reason }, 'the embedded database stopped')
      }
      this.fail = (reason) => {
        stopped(reason)
        void worker.terminate()
      }
      // the worker's own error is not logged: a message from inside the database may quote the data
      worker.on('error', (error) => stopped(`failed (${error.name})`))
      worker.on('exit', (code) => stopped(`exited with code ${code}`))
    })
    try {
      await started
      if (this.pending.size === 0) worker.unref()
    } catch (error) {
      // a database that cannot start leaves no thread behind: every call fails with the reason
      this.closed = true
      this.stopReason = error as Error
      await worker.terminate()
      throw error
    }
    this.ready = true
  }

  private settle(message: { id: number; result?: unknown; error?: SerializedError }): void {
    const waiting = this.pending.get(message.id)
    if (!waiting) return
    this.pending.delete(message.id)
    // once closed, the thread stays referenced until it has exited (close)
    if (this.pending.size === 0 && !this.closed) this.worker?.unref()
    if (message.error) {
      waiting.reject(rebuildError(message.error))
      if (isWalWriteFailure(message.error)) this.fail?.('could not write its write-ahead log (is the disk full?)')
    } else {
      waiting.resolve(message.result)
    }
  }

  private async call<T>(request: WithoutId<PgliteRequest>): Promise<T> {
    if (!this.ready) await this.waitReady
    if (this.closed) throw this.stopReason ?? new Error(CLOSED_MESSAGE)
    const worker = this.worker!
    const id = this.nextId++
    return new Promise<T>((resolve, reject) => {
      try {
        // throws (DataCloneError) for a value that cannot be copied to the thread, such as a function
        worker.postMessage({ ...request, id })
      } catch (error) {
        reject(error as Error)
        return
      }
      if (this.pending.size === 0) worker.ref()
      this.pending.set(id, { resolve: resolve as (value: unknown) => void, reject })
    })
  }

  query<T>(sql: string, params?: unknown[], options?: QueryOptions): Promise<QueryResults<T>> {
    return this.queryIn(undefined, sql, params, options)
  }

  private queryIn<T>(tx: number | undefined, sql: string, params: unknown[] = [], options?: QueryOptions): Promise<QueryResults<T>> {
    return this.call({ op: 'query', sql, params, rowMode: options?.rowMode, tx })
  }

  /**
   * Runs `callback` in one transaction: committed when it resolves, rolled back when it throws. When the
   * transaction cannot begin (the thread closed or stopped), `callback` still runs, on a transaction whose every
   * statement fails with the reason, and the reason is thrown. Kysely's PGlite dialect needs that: it waits for
   * the callback to start before it sends a statement, and a rejection before then was left unhandled (a stop
   * signal during a first start's migration ended `serve` with exit 1 and a stack trace) and its wait unanswered.
   */
  async transaction<T>(callback: (tx: PgliteTransaction) => Promise<T>): Promise<T> {
    let id: number
    try {
      id = await this.call<number>({ op: 'begin' })
    } catch (error) {
      const failing: PgliteTransaction = { query: () => Promise.reject(error as Error), rollback: async () => {} }
      await callback(failing).catch(() => {})
      throw error
    }
    let rolledBack = false
    const tx: PgliteTransaction = {
      query: (sql, params, options) => this.queryIn(id, sql, params, options),
      rollback: async () => {
        rolledBack = true
        await this.call({ op: 'end', tx: id, commit: false })
      },
    }
    let result: T
    try {
      result = await callback(tx)
    } catch (error) {
      if (!rolledBack) await this.call({ op: 'end', tx: id, commit: false }).catch(() => {})
      throw error
    }
    if (!rolledBack) {
      // its outcome unknown until it is answered (commit-in-flight.ts)
      const answered = commitSent()
      try {
        await this.call({ op: 'end', tx: id, commit: true })
      } finally {
        answered()
      }
    }
    return result
  }

  /** Calls `onNotify` with every NOTIFY's payload on `channel`; resolves to the function that stops it. */
  async listen(channel: string, onNotify: (payload: string) => void): Promise<() => Promise<void>> {
    const id = await this.call<number>({ op: 'listen', channel })
    this.notifications.set(id, onNotify)
    return async () => {
      this.notifications.delete(id)
      if (!this.closed) await this.call({ op: 'unlisten', listen: id })
    }
  }

  /** The data directory as a gzipped tarball (a template for `template`). */
  async dumpDataDir(): Promise<Blob> {
    const bytes = await this.call<Uint8Array>({ op: 'dump' })
    return new Blob([bytes])
  }

  /** A full garbage collection on the database's thread (what its start left behind). */
  async collectGarbage(): Promise<void> {
    await this.call({ op: 'collect' })
  }

  async close(): Promise<void> {
    if (this.closed) return
    await this.call({ op: 'close' })
    this.closed = true
    this.stopReason = new Error(CLOSED_MESSAGE)
    // held until the thread is gone: unreferenced, its end could leave the loop empty first, and a stop that waits
    // for this close never finished (`serve` stopped during its start exited 13, its stop cut short)
    this.worker?.ref()
    await this.worker?.terminate()
  }
}
