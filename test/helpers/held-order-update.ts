// A write to orders held on embedded PGlite (Postgres in a worker thread of the command's process): a BEFORE UPDATE
// trigger on the rows `when` names writes a file into the data directory, which the test waits for, then sleeps until
// the test writes another there. The worker is held in the statement while the main thread takes the signals; a process
// that ends meanwhile leaves the write unmade.
import { existsSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { sql } from 'kysely'
import type { Reader } from './cli-database.js'

export interface HeldOrderUpdate {
  /** True once an UPDATE it holds has begun. */
  started(): boolean
  /** Lets the held UPDATE, and every later one, go on. */
  release(): void
  /** Takes the trigger off (while no command has the database open). */
  drop(): Promise<void>
}

/**
 * Holds the UPDATEs of orders whose new row matches `when` (SQL on `new`), in the database of `dataDir` that `read`
 * opens; `name` tells apart the files of holds made one after another in one data directory.
 */
export async function holdOrderUpdates(read: Reader, dataDir: string, when: string, name = 'test'): Promise<HeldOrderUpdate> {
  // the embedded database's files: its data_directory, as the worker's Postgres sees it
  const files = path.join(dataDir, 'pglite')
  const writing = `${name}-writing`
  const release = `${name}-release`
  await read(async (db) => {
    await sql`
      create function test_hold_write() returns trigger language plpgsql as $$ begin
        execute format('copy (select 1) to %L', current_setting('data_directory') || ${sql.lit(`/${writing}`)});
        while (pg_stat_file(current_setting('data_directory') || ${sql.lit(`/${release}`)}, true)).size is null loop
          perform pg_sleep(0.05);
        end loop;
        return new;
      end $$`.execute(db)
    await sql`create trigger test_hold_write before update on orders for each row when (${sql.raw(when)}) execute function test_hold_write()`.execute(db)
  })
  return {
    started: () => existsSync(path.join(files, writing)),
    release: () => writeFileSync(path.join(files, release), ''),
    drop: () =>
      read(async (db) => {
        await sql`drop trigger test_hold_write on orders`.execute(db)
        await sql`drop function test_hold_write()`.execute(db)
      }),
  }
}
