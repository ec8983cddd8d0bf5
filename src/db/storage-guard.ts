// The embedded database's disk. PGlite keeps its cluster in DATA_DIR, and a disk that fills up under it is worse
// than a full disk under Postgres: the first write-ahead log segment it cannot create leaves it running in a
// loop, answering nothing, until the process is killed (PGlite 0.5; measured on a 60 MB tmpfs). So the service
// looks at the directory's free space every second, and below DATA_DIR_MIN_FREE it takes no more deliveries:
// they are answered 503 (the platform sends them again) and /readyz turns 503, until space is freed. Nothing
// is refused once stored; what the poller and the reaction handlers write goes on (a few rows a transition).
import { statfs } from 'node:fs/promises'
import type { Logger } from '../logger.js'

/** How often the free space is read. At the ingest's full speed on PGlite, 1 s is a few MB of WAL. */
export const STORAGE_CHECK_INTERVAL_MS = 1_000

export interface StorageGuard {
  /** True while the directory's free space is under the minimum (false until the first reading). */
  readonly low: boolean
  /** The free space at the last reading, in bytes; undefined before it, or when it could not be read. */
  readonly freeBytes: number | undefined
  readonly minFreeBytes: number
  stop(): void
}

export interface StorageGuardOptions {
  directory: string
  minFreeBytes: number
  logger: Logger
  intervalMs?: number
  /** The free space of the directory's file system, in bytes (tests give their own). */
  readFreeBytes?: (directory: string) => Promise<number>
}

/** The free space of `directory`'s file system that an unprivileged writer may use, in bytes. */
export const freeBytesOf = async (directory: string) => {
  const stats = await statfs(directory)
  // what an unprivileged writer may still use (bavail), not what root may (bfree)
  return stats.bavail * stats.bsize
}

export function watchStorage({
  directory,
  minFreeBytes,
  logger,
  intervalMs = STORAGE_CHECK_INTERVAL_MS,
  readFreeBytes = freeBytesOf,
}: StorageGuardOptions): StorageGuard {
  let low = false
  let freeBytes: number | undefined
  let unreadable = false
  let stopped = false
  const fields = () => ({ dataDir: directory, freeMb: mb(freeBytes ?? 0), minFreeMb: mb(minFreeBytes) })

  const read = async () => {
    try {
      freeBytes = await readFreeBytes(directory)
      unreadable = false
    } catch (error) {
      // a file system that cannot be read keeps the guard as its last reading left it (the database reports the rest)
      if (!unreadable) logger.warn({ dataDir: directory, code: (error as NodeJS.ErrnoException).code }, 'cannot read the data directory\'s free space')
      unreadable = true
      freeBytes = undefined
      return
    }
    const nowLow = freeBytes < minFreeBytes
    if (nowLow && !low) logger.error(fields(), 'the data directory is almost full: deliveries are answered 503 until space is freed')
    if (!nowLow && low) logger.info(fields(), 'the data directory has space again: deliveries are taken')
    low = nowLow
  }

  let timer: NodeJS.Timeout | undefined
  const loop = async () => {
    await read()
    if (!stopped) timer = setTimeout(() => void loop(), intervalMs).unref()
  }
  void loop()

  return {
    get low() {
      return low
    },
    get freeBytes() {
      return freeBytes
    },
    minFreeBytes,
    stop() {
      stopped = true
      clearTimeout(timer)
    },
  }
}

const mb = (bytesCount: number) => Math.round(bytesCount / 1024 / 1024)
