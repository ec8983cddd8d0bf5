// A role a DBA gave `synchronous_commit = off` (ALTER ROLE … SET, for its batch jobs, say): a commit returned before
// its WAL was on disk, so a delivery was answered 200 before it was durable, and a crash of Postgres lost 7 of 20 so
// answered (an outside review, by hand). The compiled `serve`, on a database of the test's own: what its migrations
// and its ingest run under is read by triggers, in their sessions, and its start says what it overrode.
import type { ChildProcess } from 'node:child_process'
import { randomBytes, randomUUID } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import path from 'node:path'
import pg from 'pg'
import { afterAll, expect, it } from 'vitest'
import { jsonLogLines, postgresServeEnv, spawnCli, stopChild, waitForLogLine } from './helpers/cli-process.js'
import { describePostgres, postgresUrl, withPostgresClient } from './helpers/test-database.js'
import { signBody, tradePayload } from './helpers/webhook-delivery.js'

describePostgres('a role whose sessions start with synchronous_commit off (Postgres, the compiled serve)', () => {
  const name = `durable_${randomBytes(4).toString('hex')}`
  const dataDir = mkdtempSync(path.join(tmpdir(), 'synchronous-commit-'))
  let child: ChildProcess | undefined
  const admin = <T>(databaseUrl: string, run: (client: pg.Client) => Promise<T>): Promise<T> => withPostgresClient(run, databaseUrl)
  const urlOf = (database: string, user?: string) => {
    const url = new URL(postgresUrl!)
    url.pathname = `/${database}`
    if (user) url.username = user
    return url.toString()
  }

  afterAll(async () => {
    if (child) await stopChild(child, 'SIGKILL')
    rmSync(dataDir, { recursive: true, force: true })
    await admin(postgresUrl!, async (client) => {
      await client.query(`drop database if exists ${name} with (force)`)
      await client.query(`drop role if exists ${name}`)
    })
  })

  it('migrates and stores deliveries with synchronous_commit on, and the start says it was off for the role', async () => {
    await admin(postgresUrl!, async (client) => {
      await client.query(`create role ${name} login`)
      await client.query(`alter role ${name} set synchronous_commit = off`)
      await client.query(`create database ${name} owner ${name}`)
    })
    // what each statement of the role's sessions runs under, recorded by the superuser's triggers in a schema of theirs
    await admin(urlOf(name), async (client) => {
      await client.query('create schema observer')
      await client.query('create table observer.seen (what text, synchronous_commit text)')
      await client.query(`create function observer.ddl() returns event_trigger language plpgsql security definer as $$
        begin
          if session_user = '${name}' then
            insert into observer.seen values ('migration', current_setting('synchronous_commit'));
          end if;
        end $$`)
      await client.query('create event trigger observe_ddl on ddl_command_end execute function observer.ddl()')
    })

    child = spawnCli(['serve'], postgresServeEnv({ databaseUrl: urlOf(name, name), dataDir }))
    const lines = jsonLogLines(child)
    const { url } = (await waitForLogLine(child, 'service listening')) as { url: string }
    expect(lines.filter((line) => line.sessionDefaults).map((line) => [line.level, line.sessionDefaults, line.msg])).toEqual([
      [40, { synchronous_commit: 'off' }, expect.stringContaining("ALTER ROLE <the role of DATABASE_URL> SET synchronous_commit = 'on'")],
    ])

    await admin(urlOf(name), async (client) => {
      await client.query(`create function observer.row() returns trigger language plpgsql security definer as $$
        begin
          insert into observer.seen values ('delivery', current_setting('synchronous_commit'));
          return null;
        end $$`)
      await client.query('create trigger observe_row after insert on public.webhook_deliveries for each row execute function observer.row()')
    })
    for (let n = 0; n < 3; n++) {
      const body = JSON.stringify(tradePayload(`durable-${n}`, 'funded'))
      const response = await fetch(`${url}/webhooks/partner`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-partner-delivery-id': `dlv_${randomUUID()}`, 'x-partner-signature': signBody(body) },
        body,
      })
      expect(response.status).toBe(200)
    }

    const seen = await admin(urlOf(name), async (client) => {
      const { rows } = await client.query<{ what: string; synchronous_commit: string; statements: number }>(
        'select what, synchronous_commit, count(*)::int as statements from observer.seen group by 1, 2 order by 1, 2',
      )
      return rows
    })
    expect(seen.map((row) => [row.what, row.synchronous_commit])).toEqual([
      ['delivery', 'on'],
      ['migration', 'on'],
    ])
    expect(seen.find((row) => row.what === 'delivery')?.statements).toBe(3)
  })
})
