// The embedded database prepares the statements marked PREPARED once and runs them with EXECUTE, their
// values as literals: every value must come back exactly as sent, whatever characters it holds, and a value
// that cannot be a literal still runs (unprepared).
import { sql } from 'kysely'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DatabaseHandle, openDatabase, PREPARED } from '../src/db/open-database.js'
import { pgliteTemplate } from './helpers/test-database.js'

describe('prepared statements on PGlite', () => {
  let database: DatabaseHandle
  beforeAll(() => {
    database = openDatabase({ dataDir: 'memory://', pgliteTemplate: pgliteTemplate(false) })
  })
  afterAll(async () => {
    await database.close()
  })

  const prepared = async () =>
    (await sql<{ statement: string }>`select statement from pg_prepared_statements`.execute(database.db)).rows.map((row) => row.statement)

  it('prepares a marked statement once and gives every value back as sent', async () => {
    const texts = ["it's", '$v$', "$v$'); select 1; --", '$v$$vx$ \\ \\\\ \'\'', 'naïve ☃ \u2028', '', 'a'.repeat(20_000)]
    // a value that ends where the quote's tag begins: its last characters and the closing tag made the tag early
    texts.push('ends in $v', '$', 'holds $v$ and ends in $v1', '$v')
    for (const text of texts) {
      const { rows } = await sql<{ text: string; n: number; yes: boolean; at: Date; none: string | null }>`${sql.raw(PREPARED)}
        select ${text}::text as text, ${42}::int as n, ${true}::boolean as yes, ${new Date('2026-11-23T12:00:00.123Z')}::timestamptz as at,
          ${null}::text as none`.execute(database.db)
      expect(rows).toEqual([{ text, n: 42, yes: true, at: new Date('2026-11-23T12:00:00.123Z'), none: null }])
    }
    // one prepared statement for every run of the same text
    expect((await prepared()).filter((statement) => statement.includes('as none'))).toHaveLength(1)
  })

  it('runs a marked statement whose value cannot be a literal, unprepared', async () => {
    const { rows } = await sql<{ n: number }>`${sql.raw(PREPARED)} select cardinality(${[1, 2, 3]}::int[]) as n`.execute(database.db)
    expect(rows).toEqual([{ n: 3 }])
    expect((await prepared()).filter((statement) => statement.includes('cardinality'))).toEqual([])
  })

  it('meets a NUL or a lone surrogate as the unprepared statement does', async () => {
    const outcome = (marked: boolean, text: string) =>
      sql<{ refusedOrNot: string }>`${sql.raw(marked ? PREPARED : '')} select ${text}::text as refused_or_not`
        .execute(database.db)
        .then(
          ({ rows }) => ({ value: rows[0]?.refusedOrNot }),
          (error: { code?: string }) => ({ code: error.code }),
        )
    for (const text of ['before\u0000after', 'lone \uD800 high', 'lone \uDC00 low']) {
      expect(await outcome(true, text)).toEqual(await outcome(false, text))
    }
    expect((await prepared()).filter((statement) => statement.includes('refused_or_not'))).toEqual([])
  })

  it('runs an unmarked statement as it is', async () => {
    const { rows } = await sql<{ unmarked: string }>`select ${'plain'}::text as unmarked`.execute(database.db)
    expect(rows).toEqual([{ unmarked: 'plain' }])
    expect((await prepared()).filter((statement) => statement.includes('unmarked'))).toEqual([])
  })
})
