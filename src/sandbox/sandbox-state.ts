// The local sandbox's memory across restarts: its trades (milestones, disputes and proposals live in
// the trade record), the reference counter, which trades were funded, and the webhooks not yet
// delivered, in DATA_DIR. It is the platform's state, so it stays out of the receiver's database: deleting its
// files is resetting the platform, as with a fresh sandbox account.
//
// Two files: a snapshot of the whole state (`sandbox-state.json`) and a journal of the changes made since
// (`sandbox-state.json.journal`), one JSON line a change. A change is one line appended to the journal and flushed to
// disk (fdatasync) before the sandbox answers, so its cost is that of the change, whatever the number of trades
// (the whole state was rewritten after every change: 1.7 MB at 4,000 trades, twice a call). A start reads the
// snapshot, then applies the journal's lines in order. A journal that no snapshot names (the snapshot removed, or
// written before there was a journal) is not read: none of its lines could apply.
//
// Compaction: once the journal would grow past the snapshot's size (64 KiB at least), the next change rewrites
// the snapshot instead: a temporary file (mode 0600), flushed, then renamed over the old one, so a crash leaves
// either the old snapshot or the new one, never half of one; then the journal starts again empty. The snapshot
// names its journal (a random `journal` id) and each line names its snapshot (`base`): lines of an older
// snapshot (a crash between the rename and the new journal) are ignored, never applied twice.
//
// A crash in the middle of an append leaves a torn last line: it was never answered for, and the start drops it
// with a warning (then writes a new snapshot at the next change, never appending after it). Any other line that
// cannot be read stops the start, as a snapshot that cannot be read does.
//
// The temporary file is named after the writing process (`sandbox-state.json.<pid>.tmp`): one a killed process
// left behind is removed by the next sandbox created over the file (removeStaleTemporaryFiles).
import { randomBytes } from 'node:crypto'
import {
  closeSync,
  constants,
  fdatasyncSync,
  fsyncSync,
  ftruncateSync,
  lstatSync,
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
import type { Logger } from '../logger.js'
import { processIsAlive } from '../process-alive.js'

export interface SandboxState extends PlatformState {
  pendingWebhooks: PendingEvent[]
}

const STATE_VERSION = 1

// the journal may grow to the snapshot's size before the snapshot is rewritten, and to this much at least: a small
// state is not rewritten every few changes
const MIN_JOURNAL_BYTES = 64 * 1024

/** The journal of changes beside a snapshot file. */
export function sandboxJournalFile(file: string): string {
  return `${file}.journal`
}

/** Where local mode keeps the sandbox's state; none for an in-memory DATA_DIR. */
export function sandboxStateFile(dataDir: string): string | undefined {
  return dataDir.startsWith('memory://') ? undefined : path.join(dataDir, 'sandbox-state.json')
}

/**
 * Why the state cannot be used, in the project's codes: a file there that cannot be read (`sandbox_state_unreadable`:
 * a permission, a directory in its place) or that does not read as the sandbox's state (`sandbox_state_invalid`:
 * not JSON, a field out of shape, a journal line other than the last), both of which stop the start; a change that
 * cannot be written (`state_not_saved`, the code the sandbox answers that call with); a state another process keeps
 * (`sandbox_state_in_use`, sandbox-state-lock.ts), which stops the start too.
 */
export type SandboxStateErrorCode = 'sandbox_state_unreadable' | 'sandbox_state_invalid' | 'sandbox_state_in_use' | 'state_not_saved'

/**
 * The state cannot be read or written. Its message ends in its code in brackets, as every refusal of the CLI's does
 * (reaction-setup-error.ts, cli-context.ts's CommandFailedError): a start refused for it (`serve` in local mode) exits
 * 1 with that one line, which a script can match.
 */
export class SandboxStateError extends Error {
  override name = 'SandboxStateError'
  constructor(
    readonly code: SandboxStateErrorCode,
    message: string,
    options?: ErrorOptions,
  ) {
    super(`${message} [${code}]`, options)
  }
}

// why a file could not be read, in words and by its code: the bare `Cannot read …` did not say why
function readFailure(error: unknown): string {
  const code = (error as NodeJS.ErrnoException | undefined)?.code
  const words =
    code === 'EACCES' || code === 'EPERM'
      ? 'permission denied to this user'
      : code === 'EISDIR'
        ? 'a directory is in its place'
        : code === 'EIO'
          ? 'an input/output error'
          : undefined
  if (code === undefined) return (error as Error | undefined)?.message ?? String(error)
  return words ? `${words} (${code})` : code
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

const pendingSchema = z.object({
  eventId: text,
  event: text,
  tradeId: nullableText,
  status: nullableText,
  body: text,
  // a file from before the count was kept: as if no attempt had been made
  attempts: z.number().int().min(0).max(MAX_ATTEMPTS).default(0),
})

const stateSchema = z.object({
  version: z.literal(STATE_VERSION),
  // the id the journal's lines name (absent from a file written before there was a journal: none applies)
  journal: text.optional(),
  sequence: z.number().int().nonnegative(),
  trades: z.array(tradeSchema),
  funded: z.array(text),
  pendingWebhooks: z.array(pendingSchema),
})

// one change: the trades it changed (whole), which of them are funded, the reference counter, and the webhooks that
// started to be owed or had an attempt counted (`put`) or are owed no more (`drop`)
const recordSchema = z.object({
  base: text,
  sequence: z.number().int().nonnegative(),
  trades: z.array(tradeSchema),
  funded: z.array(text),
  put: z.array(pendingSchema),
  drop: z.array(text),
})
type JournalRecord = z.infer<typeof recordSchema>

/** What one save carries: the trades changed since the last one, and the webhooks owed now (all of them). */
export interface SandboxStateChange {
  sequence: number
  trades: TradeRecord[]
  /** Those of `trades` that were ever funded. */
  funded: string[]
  pendingWebhooks: PendingEvent[]
}

/** The saved state (the snapshot and its journal), or undefined when there is none yet; a file that cannot be read is an error. */
export function readSandboxState(file: string): SandboxState | undefined {
  return recoverSandboxState(file).state
}

interface Recovered {
  state: SandboxState | undefined
  /** The snapshot's journal id. */
  base: string | undefined
  snapshotBytes: number
  journalBytes: number
  /** The journal holds this snapshot's lines only, each whole: the next change may follow them. */
  journalUsable: boolean
  /** A torn last line was dropped. */
  tornLine: number | undefined
  /** A journal is there that no snapshot names, and was not read. */
  journalIgnored: boolean
}

function readSnapshot(file: string): { state: SandboxState; base: string | undefined; bytes: number } | undefined {
  let contents: string
  try {
    contents = readFileSync(file, 'utf8')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return undefined
    throw new SandboxStateError('sandbox_state_unreadable', `Cannot read the sandbox state file ${file}: ${readFailure(error)}`, { cause: error })
  }
  let parsed: unknown
  try {
    parsed = JSON.parse(contents)
  } catch (error) {
    throw new SandboxStateError('sandbox_state_invalid', `The sandbox state file ${file} is not JSON; ${resetHint}`, { cause: error })
  }
  const result = stateSchema.safeParse(parsed)
  if (!result.success) {
    throw new SandboxStateError('sandbox_state_invalid', `The sandbox state file ${file} is not valid at ${issuePath(result.error)}; ${resetHint}`)
  }
  const { version: _version, journal: base, ...state } = result.data
  return { state, base, bytes: Buffer.byteLength(contents) }
}

function issuePath(error: z.ZodError): string {
  const issue = error.issues[0]!
  const where = issue.path.length > 0 ? issue.path.map(String).join('.') : '(file)'
  return `${where}: ${issue.message}`
}

/** The snapshot with its journal's lines applied, and where the journal stands for the next change. */
function recoverSandboxState(file: string): Recovered {
  const snapshot = readSnapshot(file)
  const journal = sandboxJournalFile(file)
  // The journal's lines are changes to the snapshot that names it. Without one (the snapshot removed by hand, or one
  // written before there was a journal) no line can apply, so the journal is not read: a line it could not read
  // refused the start, telling the operator to move a snapshot that was not there. The first change writes a
  // snapshot and a new journal in its place.
  if (snapshot?.base === undefined) {
    return {
      state: snapshot?.state,
      base: undefined,
      snapshotBytes: snapshot?.bytes ?? 0,
      journalBytes: 0,
      journalUsable: false,
      tornLine: undefined,
      journalIgnored: isThere(journal),
    }
  }
  let contents: string
  // a journal the snapshot names may be missing: a process killed in a compaction between removing the old one and
  // creating the new one. Nothing was written to it, so the snapshot is the whole state; the next change writes a
  // snapshot and a new journal (appends open without O_CREAT, and the first change failed 503 state_not_saved)
  let journalThere = true
  try {
    contents = readFileSync(journal, 'utf8')
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== 'ENOENT') {
      throw new SandboxStateError('sandbox_state_unreadable', `Cannot read the sandbox state journal ${journal}: ${readFailure(error)}`, { cause: error })
    }
    contents = ''
    journalThere = false
  }
  const recovered: Recovered = {
    state: snapshot.state,
    base: snapshot.base,
    snapshotBytes: snapshot.bytes,
    journalBytes: Buffer.byteLength(contents),
    journalUsable: journalThere,
    tornLine: undefined,
    journalIgnored: false,
  }
  // the text after the last newline is a line being written when the writer stopped (or nothing)
  const lines = contents.split('\n')
  const records: JournalRecord[] = []
  lines.forEach((line, index) => {
    const last = index === lines.length - 1 || (index === lines.length - 2 && lines.at(-1) === '')
    if (line === '' && index === lines.length - 1) return
    const record = parseRecord(line)
    if (record.success) {
      if (record.data.base === recovered.base) records.push(record.data)
      // (an older snapshot's, left by a crash during a compaction: already in the snapshot)
      else recovered.journalUsable = false
      return
    }
    if (!last) {
      throw new SandboxStateError(
        'sandbox_state_invalid',
        `The sandbox state journal ${journal} is not valid at line ${index + 1}: ${record.reason}; ${journalResetHint(file)}`,
      )
    }
    recovered.tornLine = index + 1
    recovered.journalUsable = false
  })
  // a line that ends without its newline is followed by nothing, even when what there is of it reads as a whole one
  if (lines.at(-1) !== '') recovered.journalUsable = false
  if (records.length > 0) recovered.state = applyRecords(snapshot.state, records)
  return recovered
}

// whether something is at `file` (a file, a directory); what cannot be looked at counts as nothing, since nothing reads it
function isThere(file: string): boolean {
  try {
    return lstatSync(file, { throwIfNoEntry: false }) !== undefined
  } catch {
    return false
  }
}

function parseRecord(line: string): { success: true; data: JournalRecord } | { success: false; reason: string } {
  let parsed: unknown
  try {
    parsed = JSON.parse(line)
  } catch {
    return { success: false, reason: 'not JSON' }
  }
  const result = recordSchema.safeParse(parsed)
  return result.success ? { success: true, data: result.data } : { success: false, reason: issuePath(result.error) }
}

function applyRecords(state: SandboxState, records: readonly JournalRecord[]): SandboxState {
  // Maps keep the order things were first saved in: the trades' (as the platform lists them) and the webhooks'
  const trades = new Map(state.trades.map((trade) => [trade.trade_id, trade]))
  const funded = new Set(state.funded)
  const pending = new Map(state.pendingWebhooks.map((event) => [event.eventId, event]))
  let sequence = state.sequence
  for (const record of records) {
    sequence = record.sequence
    for (const trade of record.trades) {
      trades.set(trade.trade_id, trade)
      funded.delete(trade.trade_id)
    }
    for (const tradeId of record.funded) funded.add(tradeId)
    for (const event of record.put) pending.set(event.eventId, event)
    for (const eventId of record.drop) pending.delete(eventId)
  }
  return { sequence, trades: [...trades.values()], funded: [...funded], pendingWebhooks: [...pending.values()] }
}

const resetHint = 'move it away to start the sandbox empty (its trades are then forgotten)'
const journalResetHint = (file: string) =>
  `move it and ${path.basename(file)} away to start the sandbox empty (its trades are then forgotten)`

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

/**
 * Replaces the snapshot atomically: write a temporary file, flush it, rename it over the old one. `journal` is the
 * id the journal's lines that follow it will name. Answers the bytes written.
 */
export function writeSandboxState(file: string, state: SandboxState, journal?: string): number {
  mkdirSync(path.dirname(file), { recursive: true })
  const temporary = `${file}.${process.pid}.tmp`
  const contents = `${JSON.stringify({ version: STATE_VERSION, ...(journal === undefined ? {} : { journal }), ...state })}\n`
  try {
    // a leftover from a crash is removed first, so the file is created anew with mode 0600
    rmSync(temporary, { force: true })
    const descriptor = openSync(temporary, 'wx', 0o600)
    try {
      writeWhole(descriptor, contents)
      fsyncSync(descriptor)
    } finally {
      closeSync(descriptor)
    }
    renameSync(temporary, file)
    // the rename itself is on disk only once the directory is
    flushDirectory(file)
  } catch (error) {
    rmSync(temporary, { force: true })
    throw new SandboxStateError('state_not_saved', `Cannot write the sandbox state file ${file}`, { cause: error })
  }
  return Buffer.byteLength(contents)
}

function flushDirectory(file: string): void {
  const directory = openSync(path.dirname(file), 'r')
  try {
    fsyncSync(directory)
  } finally {
    closeSync(directory)
  }
}

function writeWhole(descriptor: number, contents: string): void {
  const bytes = Buffer.from(contents)
  for (let offset = 0; offset < bytes.length; ) offset += writeSync(descriptor, bytes, offset)
}

/**
 * Opens the state kept in `file` and its journal: what a previous run saved (undefined when there is none yet), and
 * the store that saves what changes from there. A torn last journal line is dropped with a warning.
 */
export function openSandboxState(file: string, logger: Logger): { state: SandboxState | undefined; store: SandboxStateStore } {
  removeStaleTemporaryFiles(file)
  const recovered = recoverSandboxState(file)
  if (recovered.journalIgnored) {
    logger.warn(
      { file: sandboxJournalFile(file), snapshot: file },
      'sandbox state journal: no snapshot names it (the snapshot was removed, or was written before there was a journal), so it is not read; the next change writes a snapshot and a new journal in its place',
    )
  }
  if (recovered.tornLine !== undefined) {
    logger.warn(
      { file: sandboxJournalFile(file), line: recovered.tornLine },
      'sandbox state journal: its last line was cut short (the sandbox stopped while writing it) and is dropped; that change had not been answered',
    )
  }
  return { state: recovered.state, store: new SandboxStateStore(file, recovered) }
}

/** Saves the sandbox's changes: a journal line each, the snapshot rewritten once the journal has grown past it. */
export class SandboxStateStore {
  private readonly journal: string
  private base: string | undefined
  private snapshotBytes: number
  private journalBytes: number
  private journalUsable: boolean
  private sequence: number
  // the attempts of each owed webhook as saved
  private saved: Map<string, number>

  constructor(
    private readonly file: string,
    recovered: Recovered,
  ) {
    this.journal = sandboxJournalFile(file)
    this.base = recovered.base
    this.snapshotBytes = recovered.snapshotBytes
    this.journalBytes = recovered.journalBytes
    this.journalUsable = recovered.journalUsable
    this.sequence = recovered.state?.sequence ?? 0
    this.saved = owedAttempts(recovered.state?.pendingWebhooks ?? [])
  }

  /**
   * Saves `change` (on disk when this returns), as a journal line, or as a new snapshot (`whole()`, the whole state)
   * when the journal is due for one. Throws SandboxStateError when it cannot: nothing of the change is then kept.
   */
  save(change: SandboxStateChange, whole: () => SandboxState): void {
    const put = change.pendingWebhooks.filter((event) => this.saved.get(event.eventId) !== event.attempts)
    const owed = new Set(change.pendingWebhooks.map((event) => event.eventId))
    const drop = [...this.saved.keys()].filter((eventId) => !owed.has(eventId))
    const unchanged = change.trades.length === 0 && put.length === 0 && drop.length === 0 && change.sequence === this.sequence
    if (unchanged) return
    const line = `${JSON.stringify({ base: this.base, sequence: change.sequence, trades: change.trades, funded: change.funded, put, drop })}\n`
    const lineBytes = Buffer.byteLength(line)
    if (this.journalUsable && this.journalBytes + lineBytes <= Math.max(this.snapshotBytes, MIN_JOURNAL_BYTES)) {
      this.append(line, lineBytes)
    } else {
      this.compact(whole())
    }
    this.sequence = change.sequence
    this.saved = owedAttempts(change.pendingWebhooks)
  }

  private append(line: string, lineBytes: number): void {
    let descriptor: number
    try {
      // no O_CREAT: a journal that is gone (removed by hand) is not started again without its snapshot
      descriptor = openSync(this.journal, constants.O_WRONLY | constants.O_APPEND)
    } catch (error) {
      this.journalUsable = false
      throw new SandboxStateError('state_not_saved', `Cannot write the sandbox state journal ${this.journal}`, { cause: error })
    }
    try {
      writeWhole(descriptor, line)
      fdatasyncSync(descriptor)
      this.journalBytes += lineBytes
    } catch (error) {
      // what part of the line reached the file is cut off again: the next line must not follow half of one (else
      // the next snapshot replaces the journal)
      try {
        ftruncateSync(descriptor, this.journalBytes)
        fdatasyncSync(descriptor)
      } catch {
        this.journalUsable = false
      }
      throw new SandboxStateError('state_not_saved', `Cannot write the sandbox state journal ${this.journal}`, { cause: error })
    } finally {
      closeSync(descriptor)
    }
  }

  private compact(state: SandboxState): void {
    const base = randomBytes(8).toString('hex')
    this.snapshotBytes = writeSandboxState(this.file, state, base)
    // saved from here: the old journal's lines name another snapshot and are ignored, whether or not it is replaced
    this.base = base
    this.journalUsable = false
    this.journalBytes = 0
    try {
      rmSync(this.journal, { force: true })
      const descriptor = openSync(this.journal, 'wx', 0o600)
      try {
        fsyncSync(descriptor)
      } finally {
        closeSync(descriptor)
      }
      flushDirectory(this.journal)
      this.journalUsable = true
    } catch {
      // the change is in the snapshot; without a journal, the next change writes a snapshot again
    }
  }
}

function owedAttempts(events: readonly PendingEvent[]): Map<string, number> {
  return new Map(events.map((event) => [event.eventId, event.attempts]))
}
