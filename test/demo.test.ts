import { describe, expect, it } from 'vitest'
import { formatDemoReport, runDemo } from '../src/demo/run-demo.js'
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
    expect(formatDemoReport(report)).toContain('Every order matches the platform.')
  })
})
