import { once } from 'node:events'
import { describe, expect, it } from 'vitest'
import {
  DEMO_ELSEWHERE_REFERENCE,
  DEMO_FAILING_HANDLER,
  DEMO_UNKNOWN_TRADE_REFERENCE,
  type DemoReport,
  formatDemoReport,
  runDemo,
} from '../src/demo/run-demo.js'
import { runCommandWith } from './helpers/cli-in-process.js'
import { runCli, spawnCli } from './helpers/cli-process.js'
import { testLogger } from './helpers/log-sink.js'

describe('the demo', () => {
  it('refuses more than 1,000 trades with exit 2 before it starts, as it holds every trade in memory', async () => {
    for (const trades of ['1001', '100000000']) {
      const child = spawnCli(['demo', '--trades', trades, '--no-console'], {})
      let stdout = ''
      let stderr = ''
      child.stdout!.on('data', (chunk) => (stdout += chunk))
      child.stderr!.on('data', (chunk) => (stderr += chunk))
      // a demo that started runs for minutes: it is stopped, and the test fails, rather than waited for
      const started = setTimeout(() => child.kill('SIGKILL'), 20_000)
      const [code] = (await once(child, 'exit')) as [number | null]
      clearTimeout(started)
      expect(code, `--trades ${trades}: ${stdout}${stderr}`).toBe(2)
      expect(stderr).toContain(`argument '${trades}' is invalid. must be a whole number from 1 to 1000`)
      expect(stdout).toBe('')
    }
  })

  // found from outside: "must be a whole number from 0, in decimal digits" said of a whole number in decimal digits
  it('refuses a seed past 2^53 - 1 naming the range, and a seed not in digits naming the digits', async () => {
    const past = await runCommandWith(['demo', '--seed', '9007199254740992', '--no-console'])
    expect(past.code).toBe(2)
    expect(past.stderr).toContain("argument '9007199254740992' is invalid. must be a whole number from 0 to 9007199254740991")
    const letters = await runCommandWith(['demo', '--seed', '1e3', '--no-console'])
    expect(letters.code).toBe(2)
    expect(letters.stderr).toContain("argument '1e3' is invalid. must be a whole number from 0, in decimal digits (0-9)")
  })

  it('says in its help that it runs 50 trades by default, ten of each kind', async () => {
    const help = await runCommandWith(['demo', '--help'])
    expect(help.code).toBe(0)
    // commander wraps the line to the terminal's width
    expect(help.stdout.replace(/\s+/g, ' ')).toContain('run trades of five kinds in turn (50 by default: ten of each) against the sandbox')
  })

  it('runs 50 trades, ten of each kind, through faults and ends with every order matching the platform', async () => {
    const report = await runDemo({ trades: 50, seed: 7, out: process.stderr, logger: testLogger(), keepConsole: true })
    try {
      await leavesSomethingWorthLookingAt(report)
    } finally {
      await report.console?.close()
    }
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
    // every request is accounted for: the table's transitions, the one of the order imported for the operator
    // (not in the table), repeats and refusals
    expect(report.forward.outsideTable).toEqual([{ reference: DEMO_UNKNOWN_TRADE_REFERENCE, events: 1 }])
    const transitions = report.rows.reduce((sum, row) => sum + row.transitions, 0)
    expect(report.forward.requests).toBe(transitions + 1 + report.forward.duplicates + report.forward.invalid)
    expect(formatDemoReport(report)).toContain('Every order matches the platform.')
  })

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
    expect(result.stdout).toMatch(
      /^forwarder: (\d+) of \1 transitions received, signature verified, once each by webhook-id \(\d+ requests, \d+ repeats, 0 refused; 1 event of demo-imported-unknown-trade, not in the table\)$/m,
    )
  })

  it('prints with --json the report alone on stdout, one JSON document: progress and log lines go to stderr', async () => {
    // seed 0 too, as the sandbox's --seed takes it
    const result = await runCli(['demo', '--trades', '5', '--seed', '0', '--json'], {})
    expect(result.code, result.stderr).toBe(0)
    const report = JSON.parse(result.stdout) as { mismatches: unknown[]; leftForOperator: { failedReactions: number } }
    expect(report.mismatches).toEqual([])
    // the disputed trade's notify-seller job ends failed, as the demo means it to: the report says so, and no
    // JSON log line among the progress lines reads as the demo breaking
    expect(report.leftForOperator.failedReactions).toBe(1)
    expect(result.stderr).not.toContain('"handler":"notify-seller"')
    expect(result.stderr).not.toContain('"level"')
    expect(result.stderr.split('\n')[0]).toBe('demo: starting 5 trades…')
    expect(result.stderr).toContain('5 trades against the sandbox, with faults (seed 0)')
  })
})

/**
 * The console the demo keeps open shows what needs a human (failed reactions, a parked delivery, a flagged
 * order), and retrying the failed reactions there works: the handler's service is back after the run.
 */
async function leavesSomethingWorthLookingAt(report: DemoReport): Promise<void> {
  expect(report.console).toBeDefined()
  const { url, token } = report.console!
  const get = async (path: string) => {
    const response = await fetch(new URL(path, url), { headers: { Authorization: `Bearer ${token}` } })
    expect(response.status, path).toBe(200)
    return response.text()
  }
  expect(report.leftForOperator.failedReactions).toBeGreaterThan(0)
  expect(report.leftForOperator.parkedReferences).toEqual([DEMO_ELSEWHERE_REFERENCE])
  expect(report.leftForOperator.flaggedReferences).toEqual([DEMO_UNKNOWN_TRADE_REFERENCE])
  const overview = await get('/console/')
  const attention = /<section class="attention">([\s\S]*?)<\/section>/.exec(overview)?.[1] ?? ''
  expect(attention).toContain(`${report.leftForOperator.failedReactions} failed reaction(s)</a>`)
  expect(attention).toContain(`${DEMO_FAILING_HANDLER}: ${report.leftForOperator.failedReactions}`)
  expect(attention).toContain('1 parked deliveries</a>')
  expect(attention).toContain('1 order(s) flagged</a>')
  expect(formatDemoReport(report)).toContain('left for an operator')

  const confirm = await get('/console/reactions/retry-failed')
  const fields = Object.fromEntries(
    [...confirm.replace(/<header>[\s\S]*?<\/header>/, '').matchAll(/<input type="hidden" name="([^"]+)" value="([^"]*)">/g)].map((match) => [match[1]!, match[2]!]),
  )
  const retried = await fetch(new URL('/console/reactions/retry-failed', url), {
    method: 'POST',
    headers: { Authorization: `Bearer ${token}`, 'Content-Type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams(fields).toString(),
  })
  expect(retried.status).toBe(200)
  expect(await retried.text()).toContain(`${report.leftForOperator.failedReactions} job(s) run again now`)
  // the dispatcher, still running, now succeeds: the handler's jobs end done
  const until = Date.now() + 60_000
  for (;;) {
    const page = await get(`/console/reactions?handler=${DEMO_FAILING_HANDLER}`)
    const states = [...page.matchAll(/<span class="outcome (\w+)">/g)].map((match) => match[1])
    if (states.length > 0 && states.every((state) => state === 'done')) break
    if (Date.now() > until) throw new Error(`${DEMO_FAILING_HANDLER} jobs not done after a retry: ${states.join(', ')}`)
    await new Promise((resolve) => setTimeout(resolve, 100))
  }
}
