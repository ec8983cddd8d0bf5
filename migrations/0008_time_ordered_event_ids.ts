import { type Kysely, sql } from 'kysely'

// Event ids in time order. order_status_history.event_id (every handler's idempotency key, the forwarder's
// webhook-id) was a random UUID, so each transition wrote its entry on a random page of the unique index on
// event_id, and of reaction_jobs' (event_id, handler): once such an index outgrows the cache, every commit
// dirties pages all over it, and after each checkpoint Postgres writes each of those pages whole to the WAL.
// With 5,000,000 transitions stored, the WAL per ingested delivery was 6,547 to 6,918 bytes with random ids
// and 2,554 to 2,933 with these (bench/event-id-order.ts, bench/results/latest.md). The new ids have the UUID version 7 layout (RFC 9562):
// 48 bits of Unix time in milliseconds, then random bits; Postgres 15 has no uuidv7() of its own. Ids
// already stored keep their values.
export async function up(db: Kysely<unknown>): Promise<void> {
  await sql`
    create function event_id_in_time_order() returns uuid language sql volatile parallel safe as $$
      -- a random (version 4) UUID whose first 6 bytes become the time; bits 52 and 53 turn version 4 into 7
      select encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        placing substring(int8send(floor(extract(epoch from clock_timestamp()) * 1000)::bigint) from 3)
        from 1 for 6), 52, 1), 53, 1), 'hex')::uuid
    $$`.execute(db)
  await sql`alter table order_status_history alter column event_id set default event_id_in_time_order()`.execute(db)
}

export async function down(db: Kysely<unknown>): Promise<void> {
  await sql`alter table order_status_history alter column event_id set default gen_random_uuid()`.execute(db)
  await sql`drop function event_id_in_time_order()`.execute(db)
}
