import type { Kysely } from 'kysely'

// reaction_streams.types: the types the handler takes (its patterns, sorted, comma-joined: `trade.*`,
// `trade.funded,trade.released`), as the replica that started last registered them. A stream's reader takes
// only the types it takes and moves its place past the others, so while replicas ran with different
// FORWARD_EVENTS (a rolling deploy that widened them), the one holding the stream with the narrower set moved past
// events the other would have forwarded, and nothing ever ran them. Now a replica reads a stream only while its
// types are the row's (stream-worker.ts). Null: not written yet, any reader's. Nullable, no default: a catalog
// change only.
export async function up(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('reaction_streams').addColumn('types', 'text').execute()
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await db.schema.alterTable('reaction_streams').dropColumn('types').execute()
}
