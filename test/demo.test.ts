import { describe, expect, it } from 'vitest'
import { formatDemoReport, runDemo } from '../src/demo/run-demo.js'
import { runCli } from './helpers/cli-process.js'
import { testLogger } from './helpers/log-sink.js'

describe('the demo', () => {
  it('runs 50 trades of every kind through faults and ends with every order matching the platform', async () => {
    const report = await runDemo({ trades: 50, seed: 7, out: process.stderr, logger: testLogger() })
    expect(report.mismatches).toEqual([])
    expect(report.rows.map((row) => row.kind)).toEqual(['plain', 'milestone', 'cancelled', 'disputed', 'receiver down'])
    expect(report.rows.reduce((sum, row) => sum + row.matching, 0)).toBe(50)
    // the receiver-down trades' refunds reach their orders only through the poller
    expect(report.rows.find((row) => row.kind === 'receiver down')?.healedByPoller).toBe(10)
    expect(report.webhooks.dropped).toBeGreaterThan(0)
    // every transition reached the forwarder's receiver, signature verified, once by webhook-id
    for (const row of report.rows) {
      expect(row.transitions, `${row.kind} has transitions`).toBeGreaterThan(row.orders)
      expect(row.forwarded, `${row.kind}: forwarded events`).toBe(row.transitions)
    }
    expect(report.forward).toMatchObject({ invalid: 0, stillPending: 0 })
    expect(report.forward.requests).toBeGreaterThanOrEqual(report.rows.reduce((sum, row) => sum + row.transitions, 0))
    expect(formatDemoReport(report)).toContain('Every order matches the platform.')
  }, 180_000)

  it('reads well when piped: it says what it does from the start, in lines, with no redrawn bar', async () => {
    const result = await runCli(['demo', '--trades', '10'], {})
    expect(result.code, result.stderr).toBe(0)
    const lines = result.stdout.split('\n')
    expect(lines[0]).toBe('demo: starting 10 trades…')
    expect(lines).toContain('trades: 5/10')
    expect(lines).toContain('trades: 10/10')
    expect(result.stdout).not.toContain('\r')
    expect(result.stdout).toMatch(/^webhooks: \d+ events sent by the sandbox; \d+ deliveries dropped/m)
    expect(result.stdout).toContain('Every order matches the platform.')
    expect(result.stdout).toMatch(/^forwarder: (\d+) of \1 transitions received, signature verified, once each by webhook-id \(\d+ requests, \d+ repeats, 0 refused\)$/m)
  }, 180_000)
})
