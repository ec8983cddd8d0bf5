// Kysely's Migrator over the static list in migrations/. On Postgres the migrator takes an advisory
// lock, so two replicas starting at once apply each migration once; the other waits and finds it done.
import { type DatabaseIntrospector, type Kysely, sql, type TableMetadata } from 'kysely'
import { type Migration, type MigrationResultSet, Migrator } from 'kysely/migration'
import { migrations } from '../../migrations/index.js'
import type { Database } from './database.js'
import { describeDatabaseError, isSchemaMissing } from './database-errors.js'

// The migrator's own tables live in the connection's current schema, named explicitly: left unnamed,
// Kysely accepts a table of that name in ANY schema, so a second app (or test schema) in the same
// database would make it skip creating its own.
async function createMigrator(db: Kysely<Database>): Promise<Migrator> {
  const { rows } = await sql<{ schema: string | null }>`select current_schema() as schema`.execute(db)
  const schema = rows[0]?.schema
  // none of the search_path's schemas exists (migrateToLatest's probe says so first, with the database's refusal)
  if (!schema) throw new NoSchemaError(undefined)
  return new Migrator({
    db: withOwnSchemaCatalog(db),
    provider: { getMigrations: async () => eachInASavepoint },
    migrationTableSchema: schema,
  })
}

// Each migration in a savepoint of the migrations' transaction. The migrator gives its lock back after a failed
// migration, in a statement the aborted transaction refused (25P02), and that refusal was all it reported: a
// table of another application's with one of our names (42P07) ended `migrate` with "Migration (before any
// migration ran) failed: … (25P02)". Rolled back to its savepoint, the transaction takes the migrator's statement,
// and what failed is the migration's own error, under its name.
const eachInASavepoint: Record<string, Migration> = Object.fromEntries(
  Object.entries(migrations).map(([name, migration]) => [
    name,
    {
      ...migration,
      up: async (db: Kysely<unknown>) => {
        await sql`savepoint migration`.execute(db)
        try {
          await migration.up(db)
        } catch (error) {
          // a connection that is gone fails this too: the migration's own error is the one to report
          await sql`rollback to savepoint migration`.execute(db).catch(() => {})
          throw error
        }
        await sql`release savepoint migration`.execute(db)
      },
    },
  ]),
)

/** invalid_schema_name: what the database answers a table created where no schema of the search_path exists. */
const NO_SCHEMA = '3F000'

/**
 * A refusal of the migrator's own: what it found is the operator's to fix (DATABASE_URL, the database given, the build
 * run), and its message says how. No fault of the code's: a start's log line gives it without a stack (MigrationError).
 */
class MigrationRefusal extends Error {}

/** A database a newer build migrated: refused by the start, `migrate` and every command with this code. */
export class NewerBuildError extends MigrationRefusal {
  override name = 'NewerBuildError'
  readonly code = 'migrated_by_newer_build'
}

class NoSchemaError extends MigrationRefusal {
  constructor(cause: unknown) {
    super(
      `no schema of the connection's search_path exists to create the tables in (${NO_SCHEMA}): create it (CREATE SCHEMA …), ` +
        'or name an existing one in DATABASE_URL (options=-c search_path=…)',
      { cause },
    )
  }
}

/**
 * The service's tables are in a schema later on the search_path than the connection's own, which has none of them: a
 * DBA who gave the role a schema of its own (CREATE SCHEMA app AUTHORIZATION app, the pattern of Postgres's docs) on a
 * database migrated in public put it first on the default search_path ("$user", public), and the next start applied
 * every migration into it and ran on empty tables, the orders in public out of view. Only the search_path is looked
 * at: other schemas of the database may hold other services of this kind (README, a shared database).
 */
class MigratedElsewhereError extends MigrationRefusal {}

async function migratedElsewhere(db: Kysely<Database>): Promise<string | undefined> {
  const { rows } = await sql<{ schema: string; quoted: string; own: string }>`
    select n.nspname as schema, quote_ident(n.nspname) as quoted, quote_ident(current_schema()) as own
      from unnest(current_schemas(false)) with ordinality as path (name, position)
      join pg_catalog.pg_namespace n on n.nspname = path.name
      join pg_catalog.pg_class c on c.relnamespace = n.oid and c.relname = 'kysely_migration'
     where n.nspname <> current_schema() and has_table_privilege(c.oid, 'SELECT')
     order by path.position`.execute(db)
  for (const { schema, quoted, own } of rows) {
    // a table of that name made by another application's Kysely is not ours: ours holds our migrations' names
    const { rows: counted } = await sql<{ applied: number }>`
      select count(*)::int as applied from ${sql.id(schema, 'kysely_migration')} where name = any(${Object.keys(migrations)})`.execute(db.withoutPlugins())
    const applied = counted[0]?.applied ?? 0
    if (applied === 0) continue
    const pinned = (name: string) => `?options=${encodeURIComponent(`-c search_path=${name}`)}`
    return (
      `the connection's schema ${own} has none of this service's tables, and the schema ${quoted}, after it on the search_path, has them ` +
      `(${applied} migration${applied === 1 ? '' : 's'} applied): migrating would make new, empty tables in ${own} in front of them. ` +
      `To go on with those in ${quoted}, name it alone on the search_path in DATABASE_URL (${pinned(quoted)}); to start anew in ${own}, ` +
      `name that one alone (${pinned(own)})`
    )
  }
  return undefined
}

/** The database refused the migrator's first table: its report is the cause (its code, read-only's 25006 among them). */
class FirstTableRefused extends MigrationRefusal {}

// Before a first migration, the migrator creates its table, and where the database refuses it (no schema, 3F000; a
// read-only session, 25006; no CREATE on the default tablespace, 42501) it looks whether the table is there after
// all, in the transaction the refusal aborted: all it reported was that look's 25P02, and a read-only database, which
// a start waits out, failed it. The same statement first, in a savepoint rolled back whatever it does: the database's
// own refusal is the cause the service's log line reads by its code (loggableError), and what a start retries by.
async function requireFirstTable(db: Kysely<Database>): Promise<void> {
  await sql`savepoint first_table`.execute(db)
  const refusal = await sql`create table kysely_migration ()`.execute(db).then(
    () => undefined,
    (error: unknown) => error,
  )
  await sql`rollback to savepoint first_table`.execute(db)
  if (refusal === undefined) return
  const { message, code } = describeDatabaseError(refusal)
  if (code === undefined) throw refusal
  if (code === NO_SCHEMA) throw new NoSchemaError(refusal)
  const { rows } = await sql<{ schema: string }>`select quote_ident(current_schema()) as schema`.execute(db)
  const refused = (code === INSUFFICIENT_PRIVILEGE && (await tablespaceRefused(db))) || `${message} (${code})`
  throw new FirstTableRefused(`no table can be created in the schema ${rows[0]!.schema}: ${refused}`, { cause: refusal })
}

const INSUFFICIENT_PRIVILEGE = '42501'

// The right on the schema was looked at before (requireCreateWhereMigrationsWait): a 42501 left is the tablespace's,
// where default_tablespace names one the role may not create in
async function tablespaceRefused(db: Kysely<Database>): Promise<string | undefined> {
  const { rows } = await sql<{ tablespace: string; role: string; mayCreate: boolean }>`
    select quote_ident(current_setting('default_tablespace')) as tablespace, quote_ident(current_user) as role,
           has_tablespace_privilege(current_setting('default_tablespace'), 'CREATE') as "mayCreate"
      where current_setting('default_tablespace') in (select spcname from pg_catalog.pg_tablespace)`.execute(db)
  const found = rows[0]
  if (!found || found.mayCreate) return undefined
  const { tablespace, role } = found
  return (
    `the role ${role} may not create tables in the tablespace ${tablespace}, its default_tablespace (${INSUFFICIENT_PRIVILEGE}): ` +
    `GRANT CREATE ON TABLESPACE ${tablespace} TO ${role}, or give the role a default_tablespace it may use (ALTER ROLE ${role} SET default_tablespace = …)`
  )
}

// The migrator asks the catalog one thing: whether its two tables exist in our schema. Kysely's introspector
// answers by reading every column of every table in the database, and by resolving each table's name again on
// the way (pg_get_serial_sequence): a schema or table another application dropped meanwhile failed our start
// with 3F000 or 42P01, and in a database of thousands of tables each such read took 0.2-0.3 s (5,000 tables of
// 10 columns, on Postgres 15). `db` as it is, but for an introspector that reads our schema's table names only.
function withOwnSchemaCatalog(db: Kysely<Database>): Kysely<Database> {
  const tables = async (): Promise<TableMetadata[]> => {
    const { rows } = await sql<{ name: string; schema: string; isView: boolean; isForeign: boolean }>`
      select c.relname as name, n.nspname as schema, c.relkind = 'v' as "isView", c.relkind = 'f' as "isForeign"
      from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
      where n.nspname = current_schema() and c.relkind in ('r', 'v', 'p', 'f')`.execute(db.withoutPlugins())
    // the migrator reads no column
    return rows.map((row) => ({ ...row, columns: [] }))
  }
  const introspection: DatabaseIntrospector = {
    getSchemas: async () => {
      const { rows } = await sql<{ name: string }>`select current_schema() as name`.execute(db.withoutPlugins())
      return rows
    },
    getTables: tables,
  }
  return new Proxy(db, {
    get(target, property) {
      if (property === 'introspection') return introspection
      // Kysely's own members, on Kysely itself (they read its private fields)
      const value: unknown = Reflect.get(target, property, target)
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value
    },
  })
}

export interface MigrationReport {
  applied: string[]
}

// The migrator's lock is a session's advisory lock, which Kysely takes and gives back as two statements on one
// connection. Behind a pooler in transaction mode (PgBouncer) two statements outside a transaction may run on
// two server sessions: the lock stayed with the first, and every later start waited on it (an hour, Kysely's
// lock_timeout; our statement timeout ended it first as "Query read timeout"). Given a transaction, the
// migrator takes the lock, runs the migrations and gives it back inside it, on the one session the pooler keeps
// for it. A failed migration throws inside it, so the transaction is rolled back, as before. Processes that
// migrate at once wait for each other on a transaction lock taken first, and find the work done.
/** The advisory lock key that orders processes migrating at once ("migr" in ASCII). */
export const MIGRATION_LOCK_KEY = 0x6d696772

/**
 * Why the migrations did not run, named for the command line (src/cli/cli-context.ts, migrationRefusal):
 * `no_schema`, `schema_taken` and `migrated_elsewhere` are fixed in DATABASE_URL (its search_path names no schema, one
 * another application's tables are in, or one in front of the schema holding the service's tables); `migration_failed`
 * is anything else. `migrated_by_newer_build`: a migration this build does not have is applied (NewerBuildError).
 */
export type MigrationFailure = 'no_schema' | 'schema_taken' | 'migrated_elsewhere' | 'migrated_by_newer_build' | 'migration_failed'

export class MigrationError extends Error {
  override name = 'MigrationError'
  /**
   * Whether the migrations were refused for what the operator is to fix (a database a newer build migrated, the
   * search_path, an older Postgres, a database not in UTF-8, a right the role lacks), not failed: a message with a
   * code, logged without a stack (main.ts).
   */
  readonly refused: boolean
  constructor(
    readonly failure: MigrationFailure,
    message: string,
    { refused = false, ...options }: ErrorOptions & { refused?: boolean } = {},
  ) {
    super(message, options)
    this.refused = refused
  }
}

class MigrationFailed extends Error {
  constructor(readonly outcome: MigrationResultSet) {
    super('a migration failed')
  }
}

export function migrateToLatest(db: Kysely<Database>): Promise<MigrationReport> {
  return migrate(db, undefined)
}

/**
 * The migrations up to and including `name` and no later one, as a start runs them (under its lock, reading only the
 * connection's schema in the catalog): an older build's schema, for a test or benchmark of an upgrade from it.
 */
export function migrateTo(db: Kysely<Database>, name: string): Promise<MigrationReport> {
  return migrate(db, name)
}

async function migrate(db: Kysely<Database>, upTo: string | undefined): Promise<MigrationReport> {
  let outcome: MigrationResultSet
  try {
    // READ COMMITTED whatever the database's default: a process that waited below for another's migrations then
    // reads what they did, where a snapshot taken before the wait (REPEATABLE READ) saw none of it and applied
    // them again (25P02)
    outcome = await db.transaction().setIsolationLevel('read committed').execute(async (trx) => {
      // no statement_timeout, the role's or the database's included: a migration may index a large table for
      // minutes, and a process waiting here for another's migrations waits until they are done
      await sql`set local statement_timeout = 0`.execute(trx)
      // then a lock of the transaction's own: the migrator creates its tables before taking its lock, and two
      // processes creating them at once inside transactions would leave one aborted (its error caught, the
      // transaction unusable)
      // and waits for it however long another process's migrations take: a lock_timeout the role or the database
      // has (a DBA's guard against DDL queueing behind their queries) ended that wait, and the start, in as little
      // as it said. The migrations' own statements keep it.
      await sql`set local lock_timeout = 0`.execute(trx)
      await sql`select pg_advisory_xact_lock(${MIGRATION_LOCK_KEY}::bigint)`.execute(trx)
      await sql`set local lock_timeout to default`.execute(trx)
      await requireSupportedPostgres(trx)
      await requireUtf8(trx)
      const applied = await appliedMigrations(trx)
      const elsewhere = applied && !applied.tableMade ? await migratedElsewhere(trx) : undefined
      if (elsewhere) throw new MigratedElsewhereError(elsewhere)
      await requireCreateWhereMigrationsWait(trx, applied)
      requireNoNewerMigrations(applied)
      if (!applied?.tableMade) await requireFirstTable(trx)
      const migrator = await createMigrator(trx)
      const result = upTo === undefined ? await migrator.migrateToLatest() : await migrator.migrateTo(upTo)
      if (result.error) throw new MigrationFailed(result)
      return result
    })
  } catch (error) {
    outcome = error instanceof MigrationFailed ? error.outcome : { error, results: undefined }
  }
  const { error, results } = outcome
  if (error) {
    const failed = results?.find((result) => result.status === 'Error')?.migrationName
    // what failed, in words safe to print: a database's report only by its class and code (it may quote data)
    const database = describeDatabaseError(error)
    const noSchema = error instanceof NoSchemaError
    const elsewhere = error instanceof MigratedElsewhereError
    const reason = noSchema || elsewhere || error instanceof FirstTableRefused
      ? error.message
      : database.code === NAME_TAKEN
        ? nameTaken(error)
        : database.code
          ? `${database.message} (${database.code})`
          : error instanceof Error
            ? error.message
            : String(error)
    // a database's report stays the cause (its log line shows the code), and so does a connection's failure (a
    // command says the database cannot be reached in the driver's words, run-cli.ts); any other error's message is
    // in this one
    const keepsCause = database.code !== undefined || database.kind === 'unavailable'
    const failure: MigrationFailure = noSchema
      ? 'no_schema'
      : error instanceof NewerBuildError
        ? 'migrated_by_newer_build'
        : elsewhere
        ? 'migrated_elsewhere'
        : database.code === NAME_TAKEN
          ? 'schema_taken'
          : 'migration_failed'
    const refused = error instanceof MigrationRefusal || failure !== 'migration_failed'
    throw new MigrationError(failure, `Migration ${failed ?? '(before any migration ran)'} failed: ${reason}`, {
      refused,
      ...(keepsCause ? { cause: error } : {}),
    })
  }
  return { applied: (results ?? []).filter((r) => r.status === 'Success').map((r) => r.migrationName) }
}

// duplicate_table: a table or index of one of our names is already in the schema, another application's (a
// schema shared with it) or one made by hand
const NAME_TAKEN = '42P07'

function nameTaken(error: unknown): string {
  // the name is one of ours, from the migration's own statement; the rest of the server's words are not printed
  const name = error instanceof Error ? /^relation "([a-z0-9_]+)" already exists$/.exec(error.message)?.[1] : undefined
  return (
    `${name ? `"${name}", which it creates,` : 'a table or index it creates'} is already in the connection's schema, made by something ` +
    `other than this service's migrations (${NAME_TAKEN}): give the service a schema of its own (options=-c search_path=… in DATABASE_URL)`
  )
}

/** The oldest Postgres the migrations and statements run on: 13 (xid8 and pg_current_snapshot, gen_random_uuid). */
export const OLDEST_POSTGRES = 13

// An older server failed a migration halfway through the list, in the words of a missing function (42883)
async function requireSupportedPostgres(db: Kysely<Database>): Promise<void> {
  const { rows } = await sql<{ version: number }>`select current_setting('server_version_num')::int as version`.execute(db)
  const version = rows[0]?.version ?? 0
  if (version >= OLDEST_POSTGRES * 10_000) return
  throw new MigrationRefusal(`Postgres ${OLDEST_POSTGRES} or later is needed, and this database is ${Math.floor(version / 10_000)}: upgrade it, or give DATABASE_URL another`)
}

/**
 * The names applied in the connection's schema (none before its first migration), and whether the migrator's table is
 * there; undefined: no schema at all.
 */
type AppliedMigrations = { names: Set<string>; tableMade: boolean } | undefined

async function appliedMigrations(db: Kysely<Database>): Promise<AppliedMigrations> {
  // the schema by its name: ::regnamespace read it as an identifier, and a name that needs quoting ("Escrow-Prod")
  // came out lower-cased, a schema that does not exist (3F000)
  const { rows } = await sql<{ schema: string | null; migrated: boolean }>`
    select current_schema() as schema,
           exists (select from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                    where n.nspname = current_schema() and c.relname = 'kysely_migration') as migrated`.execute(db)
  const found = rows[0]
  if (!found || found.schema === null) return undefined
  if (!found.migrated) return { names: new Set(), tableMade: false }
  // without the camel-case plugin, which rewrote the schema's name as an identifier of ours ("Escrow-Prod" → "escrow-_prod")
  const { rows: applied } = await sql<{ name: string }>`select name from ${sql.id(found.schema, 'kysely_migration')} order by name`.execute(
    db.withoutPlugins(),
  )
  return { names: new Set(applied.map((row) => row.name)), tableMade: true }
}

// A role that may not create tables in its schema (Postgres 15 and later give PUBLIC no CREATE on the public
// schema; a DBA may give the service's role only the rights to read and write) failed the migrator's first table,
// and the look it took after, in the aborted transaction, reported only 25P02. Asked only when a migration waits:
// a role that only reads and writes runs the service once another has migrated.
async function requireCreateWhereMigrationsWait(db: Kysely<Database>, applied: AppliedMigrations): Promise<void> {
  // no schema at all: the migrator says so (NoSchemaError)
  if (!applied) return
  const waiting = Object.keys(migrations).filter((name) => !applied.names.has(name))
  if (waiting.length === 0) return
  const { rows } = await sql<{ quotedSchema: string; role: string; mayCreate: boolean }>`
    select quote_ident(current_schema()) as "quotedSchema", quote_ident(current_user) as role,
           has_schema_privilege(current_schema(), 'CREATE') as "mayCreate"`.execute(db)
  const found = rows[0]
  if (!found || found.mayCreate) return
  if (waiting.length === 0) return
  const { role, quotedSchema: schema } = found
  throw new MigrationRefusal(
    `the role ${role} may not create tables in the schema ${schema}, and ${waiting.length} migration${waiting.length === 1 ? '' : 's'} ` +
      `wait${waiting.length === 1 ? 's' : ''} (${waiting[0]}${waiting.length > 1 ? ' and on' : ''}): GRANT CREATE ON SCHEMA ${schema} TO ${role}, ` +
      'or run `migrate` once with a DATABASE_URL whose role may, and this one after it',
  )
}

// A database that a newer build migrated (a rolling upgrade rolled back, an older replica restarted beside newer
// ones) was refused by Kysely's migrator as "corrupted migrations: previously executed migration … is missing",
// which pointed at nothing: every start and command of this build failed so. The names it does not know are told.
function requireNoNewerMigrations(applied: AppliedMigrations): void {
  if (!applied) return
  const unknown = [...applied.names].filter((name) => !Object.hasOwn(migrations, name))
  if (unknown.length === 0) return
  const one = unknown.length === 1
  throw new NewerBuildError(
    `this database was migrated by a newer build of the service: ${unknown.join(', ')} ${one ? 'is' : 'are'} applied, and this build ` +
      `does not have ${one ? 'it' : 'them'}: run that build or a later one, or restore the database from before ${one ? 'it' : 'them'}`,
  )
}

// The platform's deliveries are UTF-8 JSON, kept as text. In a database of another encoding (LATIN1, say, a
// legacy one's) a delivery with a character it lacks (an emoji in a trade's title) could never be stored: it was
// answered 400 `invalid_payload` however often the platform sent it. Checked at every start, not only the first.
async function requireUtf8(db: Kysely<Database>): Promise<void> {
  const { rows } = await sql<{ encoding: string }>`select current_setting('server_encoding') as encoding`.execute(db)
  const encoding = rows[0]?.encoding ?? 'unknown'
  if (encoding === 'UTF8') return
  throw new MigrationRefusal(
    `the database's encoding is ${encoding}, where the platform's deliveries are UTF-8 (one with a character ${encoding} lacks could not be stored): ` +
      "give DATABASE_URL a database made with CREATE DATABASE … ENCODING 'UTF8' TEMPLATE template0",
  )
}

/** The database is not at this build's migrations: a command on Postgres does not migrate it (requireMigrated). */
export class NotMigratedError extends Error {
  override name = 'NotMigratedError'
  readonly code = 'not_migrated'
}

/**
 * Refuses a database that is not at this build's migrations, changing nothing. A command run against Postgres used
 * to migrate it: a mistyped DATABASE_URL put this service's tables into another application's database, and a newer
 * build's CLI, run for a read, moved production ahead of the replicas still running the older build (which then
 * refuse to start). On Postgres the migrations are the service's start's and `migrate`'s only.
 */
export async function requireMigrated(db: Kysely<Database>): Promise<void> {
  const applied = await appliedMigrations(db)
  requireNoNewerMigrations(applied)
  const missing = Object.keys(migrations).filter((name) => !applied?.names.has(name))
  if (missing.length === 0) return
  const next = 'run `migrate` (the service runs it as it starts) and then the command again; nothing was changed'
  // where `migrate` would refuse too: running it is not the advice
  const elsewhere = applied && !applied.tableMade ? await migratedElsewhere(db) : undefined
  if (elsewhere) throw new NotMigratedError(`${elsewhere.charAt(0).toUpperCase()}${elsewhere.slice(1)}; nothing was changed`)
  if (!applied?.names.size) {
    throw new NotMigratedError(`The database has none of this service's tables (no migration ran on it): check DATABASE_URL, or ${next}`)
  }
  throw new NotMigratedError(
    `The database is behind this build: ${missing.length === 1 ? 'migration' : 'migrations'} ${missing.join(', ')} not applied yet; ` +
      `once the service's replicas run this build, ${next}`,
  )
}

/**
 * The tables this build's migrations leave in the service's schema, besides the migrator's own (a test checks the
 * list against a migrated schema): /readyz looks that each is there.
 */
export const SERVICE_TABLES = [
  'orders',
  'webhook_deliveries',
  'order_status_history',
  'reconcile_runs',
  'reaction_jobs',
  'retention_progress',
  'reaction_streams',
  'reaction_stream_batches',
] as const

/**
 * The columns this build's migrations leave in each of the service's tables (a test checks them against a migrated
 * schema): /readyz looks that each is there. A database restored from an older build's dump, or in part, lacks some,
 * and every statement that names one fails (42703, database-errors.ts).
 */
export const SERVICE_COLUMNS: Readonly<Record<(typeof SERVICE_TABLES)[number], readonly string[]>> = {
  orders: [
    'id', 'external_reference', 'trade_id', 'trade_reference', 'trade_status', 'status_rank', 'is_terminal', 'status_source',
    'status_changed_at', 'trade_create_state', 'next_poll_at', 'poll_attempts', 'poll_lease_token', 'poll_lease_expires_at',
    'last_polled_at', 'attention', 'version', 'created_at', 'updated_at', 'visited_statuses', 'last_event_position',
    'trade_create_wait_ms', 'partner_env', 'poll_due_since', 'poll_retry_at',
  ],
  webhook_deliveries: [
    'delivery_id', 'received_at', 'event_type', 'trade_id', 'external_reference', 'observed_status', 'outcome', 'order_id',
    'raw_body', 'applied_at', 'body_sha256', 'trade_reference', 'order_version',
  ],
  order_status_history: [
    'id', 'order_id', 'from_status', 'to_status', 'source', 'delivery_id', 'recorded_at', 'event_id', 'sequence', 'trade_id',
    'external_reference', 'stream_position',
  ],
  reconcile_runs: ['id', 'replica', 'started_at', 'finished_at', 'polled', 'changed', 'errors', 'stopped_reason', 'clock_offset_s'],
  reaction_jobs: [
    'id', 'event_id', 'order_id', 'sequence', 'handler', 'state', 'attempts', 'run_at', 'lease_token', 'lease_expires_at',
    'last_error', 'created_at', 'updated_at', 'finished_at', 'outcome_token',
  ],
  retention_progress: ['task', 'done_through', 'updated_at'],
  reaction_streams: ['handler', 'position', 'history_id', 'lease_token', 'lease_expires_at', 'created_at', 'updated_at', 'types'],
  reaction_stream_batches: ['id', 'handler', 'to_position', 'to_history_id', 'done', 'events', 'finished_at'],
}

/**
 * What /readyz learns of the schema: the service's tables not in it, this build's migrations not applied, and the
 * columns (`table.column`) missing from tables that are there.
 */
export interface SchemaState {
  missingTables: string[]
  pendingMigrations: string[]
  missingColumns: string[]
}

/** Whether the schema is whole: every table, column and migration of this build there. */
export function schemaIsWhole(state: SchemaState): boolean {
  return state.missingTables.length === 0 && state.pendingMigrations.length === 0 && state.missingColumns.length === 0
}

/**
 * Which of the service's tables are missing from the connection's schema, which of this build's migrations are not
 * applied there, and which columns the tables there lack: a database replaced under the running service, one being
 * restored (between createdb and the end of pg_restore), or restored from an older build's dump or in part (a column
 * missing while its migration is recorded as applied). One read of the catalog and one of the migrator's table,
 * cheap enough for each of /readyz's looks; nothing is changed (the service does not migrate while it runs).
 */
export async function readSchemaState(db: Kysely<Database>): Promise<SchemaState> {
  // the schema by its name, unquoted, the tables of ours and the migrator's in it (none when it does not exist), and
  // the columns of ours, as table.column
  const { rows } = await sql<{ schema: string | null; present: string[]; columns: string[] }>`
    select current_schema() as schema,
           array(select c.relname::text from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                  where n.nspname = current_schema() and c.relname = any(${[...SERVICE_TABLES, 'kysely_migration']}::text[])) as present,
           array(select c.relname::text || '.' || a.attname::text
                   from pg_catalog.pg_attribute a join pg_catalog.pg_class c on c.oid = a.attrelid
                   join pg_catalog.pg_namespace n on n.oid = c.relnamespace
                  where n.nspname = current_schema() and c.relname = any(${[...SERVICE_TABLES]}::text[])
                    and a.attnum > 0 and not a.attisdropped) as columns`.execute(db)
  const { schema, present, columns } = rows[0] ?? { schema: null, present: [], columns: [] }
  const missingTables = SERVICE_TABLES.filter((table) => !present.includes(table))
  const presentColumns = new Set(columns)
  // (a table missing is said as such, not as each of its columns)
  const missingColumns = SERVICE_TABLES.filter((table) => present.includes(table)).flatMap((table) =>
    SERVICE_COLUMNS[table].filter((column) => !presentColumns.has(`${table}.${column}`)).map((column) => `${table}.${column}`),
  )
  let applied = new Set<string>()
  if (schema !== null && present.includes('kysely_migration')) {
    // without the camel-case plugin, which rewrote the schema's name as an identifier of ours (as appliedMigrations)
    const names = await sql<{ name: string }>`select name from ${sql.id(schema, 'kysely_migration')}`
      .execute(db.withoutPlugins())
      .catch((error: unknown) => {
        // dropped between the two reads (a restore's first step): as if never made
        if (isSchemaMissing(error)) return { rows: [] }
        throw error
      })
    applied = new Set(names.rows.map((row) => row.name))
  }
  const pendingMigrations = Object.keys(migrations).filter((name) => !applied.has(name))
  return { missingTables, pendingMigrations, missingColumns }
}

/** True when every known migration has been applied. */
export async function migrationsAreCurrent(db: Kysely<Database>): Promise<boolean> {
  const known = await (await createMigrator(db)).getMigrations()
  return known.every((migration) => migration.executedAt !== undefined)
}
