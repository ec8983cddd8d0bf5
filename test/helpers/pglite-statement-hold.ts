// Holds a statement of a command's on embedded PGlite, where no other session can hold a lock for it to wait on: its
// Postgres runs in a worker thread of the command's process (src/db/pglite-thread.ts). A trigger on a table, for the
// rows `when` picks, writes a file into the data directory, which the test waits for, then sleeps until the test
// writes another there: the worker is held inside the statement (or its COMMIT, for a deferred trigger) while the
// command's main thread takes the signals. The files are named after the trigger, so two holds on one data directory
// do not see each other's.
import { existsSync, writeFileSync } from 'node:fs'
import path from 'node:path'
import { type Kysely, sql } from 'kysely'
import type { Database } from '../../src/db/database.js'

export interface StatementHold {
  /** True once a statement has reached the trigger and waits there. */
  held: () => boolean
  /** Lets every statement held (and any later one) go on. */
  release: () => void
  /** Drops the trigger and its function, on a database opened again once the command is gone. */
  drop: (db: Kysely<Database>) => Promise<void>
}

/**
 * Creates, through `db` (the embedded database in `dataDir`, opened while no command runs), a trigger `name` on `table`
 * that holds each statement writing a row `when` picks until `release`: `before update` holds the statement itself,
 * `deferred` (a deferred constraint trigger, after update) holds the COMMIT of the statement's transaction.
 */
export async function holdStatementOnPglite(
  db: Kysely<Database>,
  dataDir: string,
  { name, table, when, at }: { name: string; table: keyof Database & string; when: string; at: 'before update' | 'deferred' },
): Promise<StatementHold> {
  // the embedded database's files: its data_directory, as the worker's Postgres sees it
  const files = path.join(dataDir, 'pglite')
  const heldFile = `${name}-held`
  const releaseFile = `${name}-release`
  await sql`
    create function ${sql.id(name)}() returns trigger language plpgsql as $$ begin
      execute format('copy (select 1) to %L', current_setting('data_directory') || ${sql.lit(`/${heldFile}`)});
      while (pg_stat_file(current_setting('data_directory') || ${sql.lit(`/${releaseFile}`)}, true)).size is null loop
        perform pg_sleep(0.05);
      end loop;
      return new;
    end $$`.execute(db)
  const trigger =
    at === 'deferred'
      ? sql`create constraint trigger ${sql.id(name)} after update on ${sql.table(table)} deferrable initially deferred for each row`
      : sql`create trigger ${sql.id(name)} before update on ${sql.table(table)} for each row`
  await sql`${trigger} when (${sql.raw(when)}) execute function ${sql.id(name)}()`.execute(db)
  return {
    held: () => existsSync(path.join(files, heldFile)),
    release: () => writeFileSync(path.join(files, releaseFile), ''),
    drop: async (database) => {
      await sql`drop trigger ${sql.id(name)} on ${sql.table(table)}`.execute(database)
      await sql`drop function ${sql.id(name)}()`.execute(database)
    },
  }
}
