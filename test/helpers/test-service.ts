// startService for an in-process test: an embedded database in memory:// (testConfig's default) starts from
// the suite's migrated cluster, as createTestDatabase's does, instead of an initdb and every migration of its
// own (6-15 s of a core a start on the 2-core machines). Postgres, or a DATA_DIR on disk, starts as it would.
// On a FakeClock the poller's jitter is fixed at its middle, so it sleeps POLL_INTERVAL_S exactly and a test
// can advance the clock by it (pollerSleeps in reconcile-poller.ts).
// The fork's own reaction handlers (partner-handlers.ts) are left out unless a test asks for them
// (`partnerHandlers: true`, as test/partner-handlers.test.ts does): a fork's handler would otherwise change what the
// project's tests see (one more handler for every event) and get their events, towards whatever system it calls.
import { type RunningService, startService } from '../../src/service.js'
import { pgliteTemplate } from './test-database.js'

export function startTestService(options: Parameters<typeof startService>[0]): ReturnType<typeof startService> {
  return startService({ pgliteTemplate: pgliteTemplate(true), partnerHandlers: false, ...(options.clock ? { random: () => 0.5 } : {}), ...options })
}

/** What the service's operator listener answers on /metrics. */
export async function scrapeMetrics(running: RunningService): Promise<string> {
  return (await fetch(`${running.adminUrl}/metrics`)).text()
}
