// The local sandbox's memory across restarts: its trades (milestones, disputes and proposals live in
// the trade record), the reference counter, which trades were funded, and the webhooks not yet
// delivered, in one JSON file in DATA_DIR. It is the platform's state, so it stays out of the receiver's
// database: deleting the file is resetting the platform, as with a fresh sandbox account.
//
// Written after every change: a temporary file (mode 0600), flushed to disk, then renamed over the
// old one, so a crash leaves either the old state or the new one, never half of one. The temporary file is
// named after the writing process (`sandbox-state.json.<pid>.tmp`): one a killed process left behind is
// removed by the next sandbox created over the file (removeStaleTemporaryFiles).
import {
  closeSync,
  fsyncSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  writeSync,
} from 'node:fs'
import path from 'node:path'
import { z } from 'zod'
import type { FullTradeRecord as TradeRecord } from '../partner-api/types.js'
import type { PlatformState } from './sandbox-platform.js'
import { MAX_ATTEMPTS, type PendingEvent } from './webhook-dispatcher.js'
import { processIsAlive } from '../process-alive.js'

export interface SandboxState extends PlatformState {
  pendingWebhooks: PendingEvent[]
}

const STATE_VERSION = 1

/** Where local mode keeps the sandbox's state; none for an in-memory DATA_DIR. */
export function sandboxStateFile(dataDir: string): string | undefined {
  return dataDir.startsWith('memory://') ? undefined : path.join(dataDir, 'sandbox-state.json')
}

export class SandboxStateError extends Error {
  override name = 'SandboxStateError'
}

const text = z.string()
const nullableText = z.string().nullable()
const party = z.enum(['buyer', 'seller'])
const outcome = z.enum(['buyer_win', 'seller_win', 'split'])

const proposalSchema = z.object({
  proposal_id: text,
  trade_id: text,
  outcome,
  split_buyer_pct: nullableText,
  party,
  status: z.enum(['pending', 'accepted', 'rejected']),
  created_at: text,
})

const tradeSchema = z.object({
  trade_id: text,
  reference: text,
  status: text,
  external_reference: text,
  title: text,
  amount: text,
  currency: text,
  seller_id: text,
  buyer_name: nullableText,
  buyer_phone: nullableText,
  milestones: z
    .array(
      z.object({
        milestone_id: text,
        title: text,
        amount: text,
        status: z.enum(['pending', 'delivered', 'released']),
      }),
    )
    .nullable(),
  dispute: z
    .object({
      dispute_id: text,
      trade_id: text,
      party,
      reason: text,
      category: nullableText,
      status: z.enum(['open', 'resolved']),
      proposals: z.array(proposalSchema),
      created_at: text,
    })
    .nullable(),
  // the amounts are absent from a file written before a resolution stated them
  resolution: z
    .object({
      outcome,
      buyer_pct: text,
      seller_pct: text,
      held_amount: text.optional(),
      buyer_amount: text.optional(),
      seller_amount: text.optional(),
    })
    .nullable(),
  created_at: text,
  updated_at: text,
}) satisfies z.ZodType<TradeRecord>

const stateSchema = z.object({
  version: z.literal(STATE_VERSION),
  sequence: z.number().int().nonnegative(),
  trades: z.array(tradeSchema),
  funded: z.array(text),
  pendingWebhooks: z.array(
    z.object({
      eventId: text,
      event: text,
      tradeId: nullableText,
      status: nullableText,
      body: text,
      // a file from before the count was kept: as if no attempt had been made
      attempts: z.number().int().min(0).max(MAX_ATTEMPTS).default(0),
    }),
  ),
})

/** The saved state, or undefined when there is none yet; a file that cannot be read is an error. */
export function readSandboxState(file: string): SandboxState | undefined {
  let contents: string
  try {
    contents = readFileSync(file, 'utf8')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw new SandboxStateError(`Cannot read the sandbox state file ${file}`, { cause: error })
  }
  let parsed: unknown
  try {
    parsed = JSON.parse(contents)
  } catch (error) {
    throw new SandboxStateError(`The sandbox state file ${file} is not JSON; ${resetHint}`, { cause: error })
  }
  const result = stateSchema.safeParse(parsed)
  if (!result.success) {
    const issue = result.error.issues[0]!
    const where = issue.path.length > 0 ? issue.path.map(String).join('.') : '(file)'
    throw new SandboxStateError(`The sandbox state file ${file} is not valid at ${where}: ${issue.message}; ${resetHint}`)
  }
  const { version: _version, ...state } = result.data
  return state
}

const resetHint = 'move it away to start the sandbox empty (its trades are then forgotten)'

/**
 * Removes the temporary files of writers that are gone (killed between writing one and renaming it). A live
 * process's is left alone: a sandbox created beside one running over the same file (whose listen then fails)
 * must not pull a file from under its rename. Best effort: what cannot be removed stays.
 */
export function removeStaleTemporaryFiles(file: string): void {
  const prefix = `${path.basename(file)}.`
  let names: string[]
  try {
    names = readdirSync(path.dirname(file))
  } catch {
    return
  }
  for (const name of names) {
    const pid = temporaryFilePid(name, prefix)
    if (pid === undefined || (pid !== process.pid && processIsAlive(pid))) continue
    rmSync(path.join(path.dirname(file), name), { force: true })
  }
}

function temporaryFilePid(name: string, prefix: string): number | undefined {
  if (!name.startsWith(prefix) || !name.endsWith('.tmp')) return undefined
  const digits = name.slice(prefix.length, -'.tmp'.length)
  return /^[1-9][0-9]*$/.test(digits) ? Number(digits) : undefined
}

/** Replaces the file atomically: write a temporary file, flush it, rename it over the old one. */
export function writeSandboxState(file: string, state: SandboxState): void {
  mkdirSync(path.dirname(file), { recursive: true })
  const temporary = `${file}.${process.pid}.tmp`
  const contents = `${JSON.stringify({ version: STATE_VERSION, ...state })}\n`
  try {
    // a leftover from a crash is removed first, so the file is created anew with mode 0600
    rmSync(temporary, { force: true })
    const descriptor = openSync(temporary, 'wx', 0o600)
    try {
      writeSync(descriptor, contents)
      fsyncSync(descriptor)
    } finally {
      closeSync(descriptor)
    }
    renameSync(temporary, file)
    // the rename itself is on disk only once the directory is
    const directory = openSync(path.dirname(file), 'r')
    try {
      fsyncSync(directory)
    } finally {
      closeSync(directory)
    }
  } catch (error) {
    rmSync(temporary, { force: true })
    throw new SandboxStateError(`Cannot write the sandbox state file ${file}`, { cause: error })
  }
}
