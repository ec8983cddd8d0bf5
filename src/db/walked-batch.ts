/**
 * One batch of a retention walk along a table's primary key (src/retention/prune.ts): how many rows it looked at,
 * and the last of them (its id, where the next batch starts, and its time, by which the walk may end).
 */
export interface WalkedBatch<Id = string> {
  scanned: number
  lastId: Id | undefined
  lastAt: Date | undefined
}

/** The walk's part of a batch's row, as the database gave it: counts as text, the time as a Date or its text. */
export interface WalkedBatchRow<Id> {
  scanned: string
  lastId: Id | null
  lastAt: Date | string | null
}

export function walkedBatch<Id>(row: WalkedBatchRow<Id>): WalkedBatch<Id> {
  return {
    scanned: Number(row.scanned),
    lastId: row.lastId ?? undefined,
    lastAt: row.lastAt === null ? undefined : new Date(row.lastAt),
  }
}
