// Every console page (GET) that reads the database, as an operator reaches it (console.routes.ts), for the tests that
// check each page under a database fault. The rows they name need not exist: each page's first statement is sent all
// the same. A page added to the console that reads the database belongs here.
const SHA = 'a'.repeat(64)

export const CONSOLE_DATABASE_PAGES = [
  '/console/',
  '/console/deliveries',
  '/console/deliveries/reapply?from=2026-01-01',
  '/console/deliveries/dismiss?reference=ref-fault',
  `/console/delivery?id=d-fault&body=${SHA}`,
  `/console/deliveries/d-fault/${SHA}`,
  `/console/delivery/reapply?id=d-fault&body=${SHA}`,
  `/console/deliveries/d-fault/${SHA}/reapply`,
  '/console/orders',
  '/console/orders/requeue',
  '/console/orders/1',
  '/console/reactions',
  '/console/reactions/first-attempts',
  '/console/reactions/retry-failed',
  '/console/reactions/1',
  '/console/reactions/1/retry',
  '/console/reactions/1/skip',
  '/console/reconcile',
] as const

/** The path a console page's log line names (the router's, under /console). */
export function loggedPath(page: string): string {
  return new URL(page, 'http://console').pathname.slice('/console'.length)
}
