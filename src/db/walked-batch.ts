/**
 * One batch of a retention walk along a table's primary key (src/retention/prune.ts): how many rows it looked at,
 * and the last of them (its id, where the next batch starts, and its time, by which the walk may end).
 */
export interface WalkedBatch<Id = string> {
  scanned: number
  lastId: Id | undefined
  lastAt: Date | undefined
}
