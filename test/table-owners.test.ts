// Every table has one owning module: the only source files whose queries name it (README, "Architecture").
// A query written elsewhere fails here with the file and the table, whether it is built with Kysely
// (selectFrom('orders'), a join) or written as SQL text (`update orders ...`).
import { readdirSync, readFileSync } from 'node:fs'
import { describe, expect, it } from 'vitest'

/** The files that may name each table in a query, and why a file outside the owner does. */
const OWNERS: Record<string, { owner: string[]; alsoReadBy?: Record<string, string> }> = {
  orders: {
    owner: ['src/orders/order.repository.ts', 'src/orders/poll-schedule.repository.ts', 'src/orders/apply-observation.ts'],
    alsoReadBy: {
      'src/webhooks/delivery.repository.ts': 'the bulk re-apply dry run counts deliveries whose order exists now (a join)',
      'src/reactions/reaction-stream.repository.ts':
        '`reactions rebase` moves last_event_position, a stream position (migrations/0009), with every other one in one transaction',
    },
  },
  order_status_history: {
    owner: ['src/orders/order.repository.ts', 'src/orders/apply-observation.ts'],
    alsoReadBy: {
      'src/reactions/reaction-job.repository.ts': 'a history row is the reaction event: jobs read it (the outbox)',
      'src/reactions/reaction-stream.repository.ts':
        'each handler reads the history as its stream of events; `reactions rebase` moves their stream positions',
    },
  },
  webhook_deliveries: {
    // the ingest statement records a trade delivery in the statement that applies it
    owner: ['src/webhooks/delivery.repository.ts', 'src/orders/apply-observation.ts'],
    alsoReadBy: {
      'src/db/statistics-watch.ts': "counts the deliveries not applied against the planner's figure of them, to analyze the table",
    },
  },
  reaction_jobs: {
    // a stream's batch writes its events' jobs in the statement that moves the stream on
    owner: ['src/reactions/reaction-job.repository.ts', 'src/reactions/reaction-stream.repository.ts'],
  },
  reaction_streams: {
    owner: ['src/reactions/reaction-stream.repository.ts'],
    alsoReadBy: {
      'src/reactions/reaction-job.repository.ts': "an event's first attempt is found in its handler's stream batches",
      'src/orders/apply-observation.ts': "a new event's position is never below a stream's place (a restore onto another server)",
    },
  },
  reaction_stream_batches: {
    // a stream's write-back records its first attempts that succeeded; the operator's views read them
    owner: ['src/reactions/reaction-stream.repository.ts', 'src/reactions/reaction-job.repository.ts'],
  },
  reconcile_runs: { owner: ['src/reconcile/reconcile-run.repository.ts'] },
}

const camel = (table: string) => table.replace(/_([a-z])/g, (_, letter: string) => letter.toUpperCase())

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' })
    .filter((file) => file.endsWith('.ts'))
    .map((file) => `${dir}/${file}`)
}

const withoutComments = (text: string) => text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/^\s*\/\/.*$/gm, '').replace(/\s\/\/ .*$/gm, '')

/** The tables a file's queries name. */
function tablesQueried(text: string): Set<string> {
  const code = withoutComments(text)
  const found = new Set<string>()
  for (const table of Object.keys(OWNERS)) {
    const kysely = new RegExp(`(selectFrom|updateTable|insertInto|deleteFrom|innerJoin|leftJoin|rightJoin|fullJoin)\\(\\s*'${camel(table)}\\b`)
    const text = new RegExp(`\\b(from|join|update|into)\\s+${table}\\b`, 'i')
    if (kysely.test(code) || text.test(code)) found.add(table)
  }
  return found
}

describe('table owners', () => {
  it('finds queries written either way (the check can fail)', () => {
    expect([...tablesQueried("db.selectFrom('orders').selectAll()")]).toEqual(['orders'])
    expect([...tablesQueried('sql`update webhook_deliveries set outcome = 1`')]).toEqual(['webhook_deliveries'])
    expect([...tablesQueried("qb.leftJoin('reactionJobs', 'a', 'b')")]).toEqual(['reaction_jobs'])
    expect([...tablesQueried('// update orders here, in a comment\nconst a = 1')]).toEqual([])
  })

  it('every query on a table is in the table’s owning module', () => {
    const strays: string[] = []
    for (const file of sourceFiles('src')) {
      for (const table of tablesQueried(readFileSync(file, 'utf8'))) {
        const { owner, alsoReadBy = {} } = OWNERS[table]!
        if (!owner.includes(file) && !(file in alsoReadBy)) strays.push(`${file} queries ${table}`)
      }
    }
    expect(strays).toEqual([])
  })

  it('names only files that exist and still query the table', () => {
    for (const [table, { owner, alsoReadBy = {} }] of Object.entries(OWNERS)) {
      for (const file of [...owner, ...Object.keys(alsoReadBy)]) {
        expect(tablesQueried(readFileSync(file, 'utf8')), `${file} for ${table}`).toContain(table)
      }
    }
  })
})
