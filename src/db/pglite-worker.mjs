// @ts-check
// The embedded database's own thread (started by pglite-thread.ts). PGlite is Postgres compiled to
// WebAssembly: on the thread that serves HTTP, every statement it runs holds up every request. Here it
// runs beside that thread, and the two share nothing but these messages:
//   { id, op: 'query', sql, params, rowMode, tx? }  → { id, result } | { id, error }
//   { id, op: 'begin' }                             → { id, result: txId } once inside the transaction
//   { id, op: 'end', tx, commit }                   → { id } after its COMMIT or ROLLBACK
//   { id, op: 'listen', channel }                   → { id, result: listenId }; then { notify: listenId, payload }
//   { id, op: 'unlisten', listen }, { id, op: 'dump' } (→ a gzipped tarball's bytes), { id, op: 'close' }
//   { id, op: 'collect' }                           → { id } after a full garbage collection of this thread
// It answers { ready: true } once the database is up, or { failed } if it cannot start; on disk it says
// { checkpointFailed: code } when a checkpoint of its own failed, and { checkpointed: true } at the next that did not.
//
// Plain JavaScript, its types in JSDoc (checked by tsc): as TypeScript, run from source, it needed tsx's
// loader registered again inside it (a loader given to the process does not reach a worker on Node 20), and
// with that second tsx a later `npm start` peaked at 394-396 MB instead of 339-360 (README, "Local mode").
/** @import { Transaction } from '@electric-sql/pglite' */
/** @import { MessagePort } from 'node:worker_threads' */
/** @import { PgliteRequest, PgliteWorkerData, SerializedError } from './pglite-thread.js' */
import { spawnSync } from 'node:child_process'
import { closeSync, fsyncSync, openSync, readdirSync } from 'node:fs'
import path from 'node:path'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { parentPort, workerData } from 'node:worker_threads'
import { PGlite } from '@electric-sql/pglite'

const port = /** @type {MessagePort} */ (parentPort)
const { location, startParams, template } = /** @type {PgliteWorkerData} */ (workerData)
const onDisk = !location.startsWith('memory://')

// Durability on disk. PGlite starts Postgres with fsync off (`-F` among its default parameters), and the file
// system it gives Postgres over Node's (Emscripten's NODEFS) has no fsync of its own: Postgres's fsync() of a file
// returns at once and its fdatasync() is a no-op in the WebAssembly's C library. A commit reached the operating
// system's cache, never the disk: an answered delivery would not survive a power loss or a kernel crash (strace of
// a commit and a CHECKPOINT: no fsync or fdatasync at all). So on disk Postgres runs with fsync on, syncing its
// write-ahead log with fsync() (the one that reaches the file system's operations), and the file system is given
// the fsync it lacks (durableFileSystem), which calls the real one on the file's own descriptor.
const pglite = new PGlite(location, {
  ...(template ? { loadDataDir: new Blob([template]) } : {}),
  startParams: [...PGlite.defaultStartParams, ...startParams, ...(onDisk ? ['-c', 'fsync=on', '-c', 'wal_sync_method=fsync'] : [])],
})

/**
 * Gives the file system holding `location` the fsync Postgres's fsync() calls (Emscripten's fd_sync calls the
 * stream's `fsync` where there is one, and returns success where there is none). Throws where that file system is
 * not found as expected (a PGlite that mounts it otherwise): the database must not run on disk without it.
 */
function durableFileSystem() {
  const FS = pglite.Module.FS
  /** @typedef {{ stream_ops?: Record<string, unknown>, tryFSOperation?: (operation: () => void) => void }} NodeFileSystem */
  /** @type {{ mountpoint?: string, opts?: { root?: string }, type?: NodeFileSystem } | undefined} */
  const mount = FS.root.mount.mounts.find((/** @type {{ opts?: { root?: string } }} */ each) => each.opts?.root === location)
  const fileSystem = mount?.type
  const tryOperation = fileSystem?.tryFSOperation
  if (!fileSystem?.stream_ops || !tryOperation) {
    throw new Error(`PGlite's file system for ${location} was not found: its writes cannot be flushed to disk`)
  }
  // A failure is told to the service's thread at once (pglite-thread.ts closes this one: a database whose writes
  // may not be on disk must stop, and PGlite, given the errno, answers nothing more), and given to Postgres as an
  // errno, as the file system's reads and writes give theirs (tryFSOperation)
  fileSystem.stream_ops.fsync = (/** @type {{ nfd?: number, path?: string }} */ stream) => {
    const descriptor = stream.nfd
    if (descriptor === undefined) return 0
    tryOperation(() => {
      try {
        fsyncSync(descriptor)
      } catch (error) {
        const file = path.relative(mount?.mountpoint ?? '/', stream.path ?? '') || '(a file of the database)'
        port.postMessage({ flushFailed: { file, code: String(/** @type {NodeJS.ErrnoException} */ (error).code ?? 'unknown') } })
        throw error
      }
    })
    return 0
  }
}

/**
 * Flushes the database's files to disk: what was written before the file system had its fsync (a new database's
 * files, a template unpacked, a database an older version of the service wrote). One syncfs of the file system that
 * holds them (`sync --file-system`, coreutils): a journal commit for all of them, where an fsync of each of the 1,064
 * files of a freshly copied database took 424 ms against 59 ms, and many seconds under another program's writes
 * (a stop during the start waited for it past the service's 10-s limit). Each file in turn where that command is
 * missing or fails.
 * @param {string} directory
 */
function flushDatabase(directory) {
  if (spawnSync('sync', ['--file-system', directory], { stdio: 'ignore' }).status === 0) return
  flushTree(directory)
}

/**
 * Flushes every file and directory under `directory` to disk, one at a time.
 * @param {string} directory
 */
function flushTree(directory) {
  for (const entry of unlessUnreadable(() => readdirSync(directory, { withFileTypes: true })) ?? []) {
    const entryPath = path.join(directory, entry.name)
    if (entry.isDirectory()) flushTree(entryPath)
    else if (entry.isFile()) flushPath(entryPath)
  }
  flushPath(directory)
}

/** @param {string} target */
function flushPath(target) {
  const fd = unlessUnreadable(() => openSync(target, 'r'))
  if (fd === undefined) return
  try {
    fsyncSync(fd)
  } finally {
    closeSync(fd)
  }
}

/**
 * `read()`, or undefined where the entry cannot be read (no permission) or is gone: a file an operator left there is
 * not the database's, and one of the database's own that Postgres cannot read stops its start, naming it. Refusing
 * the start here told the operator to restore an intact database from a backup.
 * @template T
 * @param {() => T} read
 * @returns {T | undefined}
 */
function unlessUnreadable(read) {
  try {
    return read()
  } catch (error) {
    const code = /** @type {NodeJS.ErrnoException} */ (error).code
    if (code === 'EACCES' || code === 'EPERM' || code === 'ENOENT') return undefined
    throw error
  }
}

// Starting the database leaves garbage behind on this thread (its files unpacked, the WebAssembly loaded):
// 150-190 MB resident that V8 keeps until it decides the thread is idle, 16 s after a start on Node 24.
// The service asks for it to be collected once its start is done ('collect'). The collector is taken then,
// from a context made while it is exposed, and the flag is set back at once, so no other context gets it
// (unless the process was started with --expose-gc: then this thread has it already and the flag is left
// alone). Taken when first asked for, not when the thread starts: the flag is the process's, and every
// database the tests open starts a thread, while only a service's start collects. Where another thread set
// the flag back in between (three threads starting at once did, now and then: "gc is not defined"), there is
// no collector, and V8 collects in its own time.
/** @type {(() => void) | undefined} */
let collector

function collectGarbage() {
  collector ??= /** @type {(() => void) | undefined} */ (globalThis.gc ?? exposedCollector())
  collector?.()
}

function exposedCollector() {
  setFlagsFromString('--expose-gc')
  try {
    return runInNewContext("typeof gc === 'function' ? gc : undefined")
  } finally {
    setFlagsFromString('--no-expose-gc')
  }
}

/**
 * An open transaction: its PGlite handle and the function that ends it (true commits).
 * @typedef {{ tx: Transaction, end: (commit: boolean) => void, ended: Promise<void> }} OpenTransaction
 */
/** @type {Map<number, OpenTransaction>} */
const transactions = new Map()
/** @type {Map<number, () => Promise<void>>} */
const listeners = new Map()
let nextId = 1

// the rollback's reason inside PGlite's transaction(): thrown to make it roll back, not reported
const ROLLBACK = Symbol('rollback')

/**
 * @param {unknown} error
 * @returns {SerializedError}
 */
function serializeError(error) {
  if (error instanceof Error) {
    // PGlite's database errors carry the server's fields (code, severity, detail ...) as own properties
    /** @type {Record<string, unknown>} */
    const fields = {}
    for (const [key, value] of Object.entries(error)) {
      if (value === null || ['string', 'number', 'boolean'].includes(typeof value)) fields[key] = value
    }
    return { name: error.name, message: error.message, fields }
  }
  return { name: 'Error', message: String(error), fields: {} }
}

/**
 * @param {PgliteRequest} request
 * @returns {Promise<unknown>}
 */
async function handle(request) {
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
      closing = true
      clearTimeout(checkpointTimer)
      if (!pglite.closed) await pglite.close()
      return undefined
    case 'collect':
      collectGarbage()
      return undefined
  }
}

/**
 * Resolves with the transaction's id once PGlite is inside it (it holds the database: other statements
 * wait their turn). The transaction ends when 'end' comes: committed, or rolled back.
 * @returns {Promise<number>}
 */
function begin() {
  const id = nextId++
  return new Promise((resolve, reject) => {
    /** @type {(commit: boolean) => void} */
    let end
    /** @type {Promise<boolean>} */
    const decided = new Promise((settle) => (end = settle))
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
        (/** @type {unknown} */ error) => {
          if (error !== ROLLBACK) throw error
        },
      )
      .finally(() => transactions.delete(id))
    // a BEGIN that failed never entered the callback: the caller learns it from 'begin'
    ended.catch((/** @type {unknown} */ error) => {
      if (!begun) reject(error)
    })
  })
}

// Checkpoints. PGlite runs Postgres in single-user mode: no checkpointer process, so nothing checkpoints while it
// runs, and pg_wal under DATA_DIR grew with every write until the next start (measured: 416 MB at the peak over 200,000
// deliveries, bench/pglite-wal.ts; all 416 MB still there after a restart, kept for recycling under max_wal_size 1 GB).
// So this thread checkpoints by Postgres's own rule, looked at every second:
// - when the WAL being written is CheckPointSegments segments past the last checkpoint's redo point, where
//   CheckPointSegments is max_wal_size / (1 + checkpoint_completion_target) in segments, at least 1 (Postgres's
//   CalculateCheckpointSegments and XLogCheckpointNeeded; 4 of 16 MB with max_wal_size 128 MB and 0.9);
// - when checkpoint_timeout has passed since the last checkpoint and more than a WAL page was written after it (its
//   own record: Postgres skips a checkpoint with nothing written since the last one).
// A checkpoint removes or recycles the segments before its redo point (min_wal_size and max_wal_size, set by
// open-database.ts, bound what is kept for recycling). The look and the CHECKPOINT are statements outside any
// transaction: PGlite runs each of those only once no transaction is open (its transaction lock, which a
// transaction holds from its BEGIN to its COMMIT: every transaction of the service is a 'begin' here), so they come
// between whole transactions, never inside one; and one is not started while a transaction is open or the session
// is in a transaction block. A checkpoint flushes the cache's dirty pages: what was committed is in the data files,
// and a crash after it replays the log from its redo point.
const CHECKPOINT_CHECK_MS = 1_000
const WAL_PAGE_BYTES = 8_192

/** @typedef {{ segmentBytes: number, segmentsBetween: number, timeoutS: number }} CheckpointRule */
/** @type {CheckpointRule | undefined} */
let checkpointRule
/** @type {NodeJS.Timeout | undefined} */
let checkpointTimer
let closing = false
let checkpointFailing = false

/** @returns {Promise<CheckpointRule>} */
async function readCheckpointRule() {
  const { rows } = await pglite.query(
    `select (select setting::float8 from pg_settings where name = 'wal_segment_size') as segment_bytes,
       (select setting::float8 * 1024 * 1024 from pg_settings where name = 'max_wal_size') as max_wal_bytes,
       (select setting::float8 from pg_settings where name = 'checkpoint_completion_target') as completion_target,
       (select setting::float8 from pg_settings where name = 'checkpoint_timeout') as timeout_s`,
  )
  const { segment_bytes: segmentBytes, max_wal_bytes: maxWalBytes, completion_target: target, timeout_s: timeoutS } =
    /** @type {{ segment_bytes: number, max_wal_bytes: number, completion_target: number, timeout_s: number }} */ (rows[0])
  return { segmentBytes, segmentsBetween: Math.max(1, Math.floor(maxWalBytes / segmentBytes / (1 + target))), timeoutS }
}

/** Whether the rule above calls for a checkpoint now. */
async function checkpointDue() {
  checkpointRule ??= await readCheckpointRule()
  const { segmentBytes, segmentsBetween, timeoutS } = checkpointRule
  const { rows } = await pglite.query(
    `select pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 as written,
       pg_wal_lsn_diff(redo_lsn, '0/0')::float8 as redo,
       pg_wal_lsn_diff(pg_current_wal_lsn(), checkpoint_lsn)::float8 as since_checkpoint,
       extract(epoch from clock_timestamp() - checkpoint_time)::float8 as age_s
     from pg_control_checkpoint()`,
  )
  const { written, redo, since_checkpoint: sinceCheckpoint, age_s: ageS } =
    /** @type {{ written: number, redo: number, since_checkpoint: number, age_s: number }} */ (rows[0])
  const segmentsPast = Math.floor(written / segmentBytes) - Math.floor(redo / segmentBytes)
  return segmentsPast >= segmentsBetween || (ageS >= timeoutS && sinceCheckpoint > WAL_PAGE_BYTES)
}

async function checkpointIfDue() {
  if (closing || pglite.closed || !(await checkpointDue())) return
  // between the look and here a transaction may have begun: then at the next look
  if (closing || pglite.closed || transactions.size > 0 || pglite.isInTransaction()) return
  await pglite.query('checkpoint')
}

function scheduleCheckpoints() {
  checkpointTimer = setTimeout(() => {
    checkpointIfDue().then(
      () => {
        if (checkpointFailing) port.postMessage({ checkpointed: true })
        checkpointFailing = false
      },
      (/** @type {unknown} */ error) => {
        if (closing || pglite.closed) return
        // the code only: a message from inside the database may quote the data
        if (!checkpointFailing) port.postMessage({ checkpointFailed: String(serializeError(error).fields.code ?? 'unknown') })
        checkpointFailing = true
      },
    ).finally(() => {
      if (!closing && !pglite.closed) scheduleCheckpoints()
    })
  }, CHECKPOINT_CHECK_MS)
  checkpointTimer.unref()
}

port.on('message', (/** @type {PgliteRequest} */ request) => {
  handle(request).then(
    (result) => port.postMessage({ id: request.id, result }),
    (/** @type {unknown} */ error) => port.postMessage({ id: request.id, error: serializeError(error) }),
  )
})

pglite.waitReady
  .then(() => {
    if (!onDisk) return
    durableFileSystem()
    flushDatabase(location)
    scheduleCheckpoints()
  })
  .then(
    () => port.postMessage({ ready: true }),
    (/** @type {unknown} */ error) => port.postMessage({ failed: serializeError(error) }),
  )
