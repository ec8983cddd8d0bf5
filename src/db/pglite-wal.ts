// The embedded database's write-ahead log settings. PGlite runs Postgres without a checkpointer: its thread
// checkpoints by Postgres's rule from max_wal_size (pglite-worker.mjs), and each checkpoint removes the segments before
// its redo point past what min_wal_size and max_wal_size keep for recycling. With PGlite's own settings (Postgres's
// max_wal_size of 1 GB, min_wal_size 80 MB) 400 MB of pg_wal stayed after a long ingest (README, "What bounds the
// embedded database's disk").

/** DATA_DIR_MAX_WAL's default: the embedded database's max_wal_size. */
export const DEFAULT_MAX_WAL_BYTES = 128 * 1024 * 1024
/** Postgres's least max_wal_size: two 16-MB segments. */
export const MIN_MAX_WAL_BYTES = 32 * 1024 * 1024
/** What a checkpoint keeps of the log for recycling, at least (min_wal_size; Postgres's default is 80 MB). */
const MIN_WAL_MB = 32

/** Postgres's settings (`-c name=value`) for a max_wal_size of `maxWalBytes`, in whole MB. */
export function walStartParams(maxWalBytes: number): string[] {
  const maxWalMb = Math.max(MIN_MAX_WAL_BYTES, maxWalBytes) / 1024 / 1024
  const wholeMb = Math.floor(maxWalMb)
  return ['-c', `max_wal_size=${wholeMb}MB`, '-c', `min_wal_size=${Math.min(MIN_WAL_MB, wholeMb)}MB`]
}
