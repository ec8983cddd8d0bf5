// The ingest statement on embedded PGlite as `webhook_deliveries` grows under statistics taken while it was
// empty (`npx tsx bench/stale-statistics.ts [deliveries] [--analyze-every N]`): batches of 13 new matched
// deliveries, one statement at a time, and the time per delivery over each stretch of the run. With
// --analyze-every N the service's statistics watch (src/db/statistics-watch.ts) is run every N deliveries,
// as the service runs it every 10 s; without, the plan made on the empty table is kept to the end.
import { CompiledQuery } from 'kysely'
import { analyzeChangedTables } from '../src/db/statistics-watch.js'
import { migrateToLatest } from '../src/db/migrate.js'
import { openDatabase } from '../src/db/open-database.js'
import { recordDeliveriesAndApply } from '../src/orders/apply-observation.js'
import { observationSettings } from '../src/orders/observations.js'
import { matchedDelivery } from './matched-delivery.js'

const args = process.argv.slice(2)
const everyArg = args.indexOf('--analyze-every')
const analyzeEvery = everyArg >= 0 ? Number(args[everyArg + 1]) : undefined
const total = Number(args.find((arg, position) => /^\d+$/.test(arg) && (everyArg < 0 || position !== everyArg + 1)) ?? 39_000)
const ORDERS = 20_000
const BATCH = 13
const STRETCH = 6_500

const handle = openDatabase({ dataDir: 'memory://' })
const { db } = handle
await migrateToLatest(db)
const raw = (text: string) => db.executeQuery(CompiledQuery.raw(text, []))
await raw(`insert into orders (external_reference) select 'bench-' || i from generate_series(1, ${ORDERS}) i`)
// statistics taken while the deliveries were none, as an early analyze or VACUUM leaves them
await raw('vacuum analyze')

const settings = observationSettings({ poll: { staleAfterS: 300 } })
const item = (index: number) => matchedDelivery(index, ORDERS)

console.log(`${total} deliveries over ${ORDERS} orders, ${analyzeEvery ? `the statistics watch every ${analyzeEvery}` : 'no analyze'}`)
let index = 0
let stretchStart = performance.now()
let stretchFirst = 0
let nextAnalyze = analyzeEvery
while (index < total) {
  const batch = Array.from({ length: Math.min(BATCH, total - index) }, () => item(index++))
  await recordDeliveriesAndApply(db, batch, settings)
  if (nextAnalyze !== undefined && index >= nextAnalyze) {
    await analyzeChangedTables(db)
    nextAnalyze += analyzeEvery!
  }
  if (index - stretchFirst >= STRETCH || index === total) {
    const us = ((performance.now() - stretchStart) * 1000) / (index - stretchFirst)
    console.log(`deliveries ${stretchFirst + 1}-${index}: ${us.toFixed(0)} µs a delivery`)
    stretchFirst = index
    stretchStart = performance.now()
  }
}
await handle.close()
