// deploy/: the Prometheus alerting rules and the Grafana dashboard. Every metric name their PromQL uses
// must be one the service exports, so renaming a metric fails here rather than in a silent alert; and
// the rules' own unit tests (alerts.test.yml) run through promtool, which CI installs.
import { execFileSync } from 'node:child_process'
import { readFileSync } from 'node:fs'
import { parser } from '@prometheus-io/lezer-promql'
import { describe, expect, it } from 'vitest'
import { parse as parseYaml } from 'yaml'
import { createMetrics } from '../src/metrics/metrics.js'

const ALERTS_FILE = 'deploy/prometheus/alerts.yml'
const DASHBOARD_FILE = 'deploy/grafana/partner-escrow.json'
/** Series Prometheus writes itself for every target, not the service. */
const PROMETHEUS_SERIES = new Set(['up'])
/**
 * Series an alert reads only as its threshold or fallback, not as what it watches: PartnerEscrowPruningStalled
 * compares the age of the last pass (on the dashboard) with three PRUNE_INTERVAL_S, with the uptime when
 * no pass finished yet; PartnerEscrowPollerStalled the age of the last cycle with three POLL_INTERVAL_S and the
 * longest a cycle lasts.
 */
const ALERT_THRESHOLD_SERIES = new Set([
  'retention_interval_seconds',
  'poller_interval_seconds',
  'poller_longest_cycle_seconds',
  'partner_escrow_uptime_seconds',
])

interface AlertRule {
  alert: string
  expr: string
  labels?: Record<string, string>
  annotations?: Record<string, string>
}

function alertRules(): AlertRule[] {
  const file = parseYaml(readFileSync(ALERTS_FILE, 'utf8')) as { groups: { rules: AlertRule[] }[] }
  return file.groups.flatMap((group) => group.rules)
}

interface Dashboard {
  panels: { id: number; title: string; gridPos: GridPos; targets?: { expr: string }[] }[]
  templating: { list: { type: string; query?: unknown }[] }
}

interface GridPos {
  x: number
  y: number
  w: number
  h: number
}

function readDashboard(): Dashboard {
  return JSON.parse(readFileSync(DASHBOARD_FILE, 'utf8')) as Dashboard
}

/** The PromQL of the dashboard's panels, without the variables' selectors: what an operator sees drawn. */
function panelExpressions(): string[] {
  return readDashboard().panels.flatMap((panel) => (panel.targets ?? []).map((target) => target.expr))
}

/** Every PromQL expression of the dashboard: panel targets and the variables' label_values() selectors. */
function dashboardExpressions(): string[] {
  const dashboard = readDashboard()
  const targets = panelExpressions()
  const variables = dashboard.templating.list
    .filter((variable) => variable.type === 'query')
    .map((variable) => {
      const query = variable.query as { query: string }
      // Grafana's label_values(selector, label) is not PromQL: its selector is
      const selector = /^label_values\((.+),\s*\w+\)$/.exec(query.query)?.[1]
      if (!selector) throw new Error(`unexpected variable query: ${query.query}`)
      return selector
    })
  return [...targets, ...variables]
}

/** The metric names an expression selects, from PromQL's own grammar; throws on a syntax error. */
function metricNames(expression: string): string[] {
  // Grafana's interval variables stand where PromQL wants a duration
  const promql = expression.replaceAll(/\$__(rate_interval|interval|range)/g, '5m')
  const tree = parser.parse(promql)
  const names: string[] = []
  const errors: string[] = []
  tree.iterate({
    enter(node) {
      if (node.type.isError) errors.push(`at ${node.from}: ${promql.slice(node.from, node.from + 30)}`)
      if (node.name === 'VectorSelector') {
        const identifier = node.node.getChild('Identifier')
        if (!identifier) throw new Error(`a selector without a metric name in ${promql}`)
        names.push(promql.slice(identifier.from, identifier.to))
      }
    },
  })
  if (errors.length > 0) throw new Error(`PromQL syntax error in ${promql}: ${errors.join('; ')}`)
  return names
}

/** The series names Prometheus stores for each metric of a given type in the text format. */
const SERIES_SUFFIXES: Record<string, string[]> = {
  counter: [''],
  gauge: [''],
  untyped: [''],
  histogram: ['_bucket', '_sum', '_count'],
  summary: ['', '_sum', '_count'],
}

/**
 * Every series name a scrape of the service's registry can hold, every source given: read from the
 * `# TYPE` lines, so a labelled histogram nothing has observed yet counts with its suffixes.
 */
async function exportedNames(): Promise<Set<string>> {
  const metrics = createMetrics({
    databaseUp: async () => ({ readOnly: false }),
    dueOrders: async () => ({ ordersDue: 1, oldestDueAgeS: 30 }),
    parkedDeliveries: async () => ({ parked: 1, oldestParkedAgeS: 60 }),
    ordersNeedingAttention: async () => [{ attention: 'trade_not_found', orders: 1 }],
    poolStats: () => ({ total: 2, idle: 1, waiting: 0 }),
    reactionJobs: async () => ({ pending: 1, running: 0, failed: 1, oldestPendingAgeS: 5 }),
    oldestDelivery: async () => new Date(0),
    dataDirStorage: { freeBytes: () => 1, minFreeBytes: 1 },
    notificationsHeard: () => true,
    autovacuumOff: () => false,
    databaseClockOffset: async () => 2,
    pruneIntervalS: 3_600,
    pollIntervalS: 30,
    pollLongestCycleS: 580,
  })
  // a pass finished and a partner API answer was read: the gauges that wait for them have a sample
  metrics.retentionHooks.onPass(new Date(0))
  metrics.partnerApiHooks.onClockOffset(0)
  const scrape = await metrics.registry.metrics()
  const names = new Set<string>()
  for (const [, name, type] of scrape.matchAll(/^# TYPE (\S+) (\S+)$/gm)) {
    const suffixes = SERIES_SUFFIXES[type!]
    if (!suffixes) throw new Error(`unexpected metric type ${type} of ${name}`)
    for (const suffix of suffixes) names.add(`${name}${suffix}`)
  }
  return names
}

describe('alert rules and dashboard', () => {
  it('use only metric names the service exports', async () => {
    const exported = await exportedNames()
    const used = new Map<string, string[]>()
    const expressions = [
      ...alertRules().map((rule) => ({ where: `alert ${rule.alert}`, expr: rule.expr })),
      ...dashboardExpressions().map((expr) => ({ where: DASHBOARD_FILE, expr })),
    ]
    for (const { where, expr } of expressions) {
      for (const name of metricNames(expr)) used.set(name, [...(used.get(name) ?? []), where])
    }
    const unknown = [...used].filter(([name]) => !exported.has(name) && !PROMETHEUS_SERIES.has(name))
    expect(unknown.map(([name, where]) => `${name} (${[...new Set(where)].join(', ')})`)).toEqual([])
    // the dashboard, not only the alerts, shows these: an operator looking at a firing alert finds its panel
    const onDashboard = new Set(dashboardExpressions().flatMap(metricNames))
    for (const name of [
      'orders_needing_attention',
      'partner_api_clock_offset_seconds',
      'database_clock_offset_seconds',
      'reaction_jobs_pending',
      'reaction_oldest_pending_age_seconds',
      'reaction_latency_seconds_bucket',
      'reaction_attempts_total',
      'reaction_failures_total',
      'partner_escrow_build_info',
      'database_autovacuum_off',
    ]) {
      expect(onDashboard.has(name), `${name} has a dashboard panel`).toBe(true)
    }
    // the checks below keep this test honest: it did read the expressions and the scrape
    expect(expressions.length).toBeGreaterThan(20)
    for (const name of [
      'webhook_ingest_duration_seconds_bucket',
      'process_resident_memory_bytes',
      'nodejs_eventloop_lag_p99_seconds',
      'webhook_oldest_parked_age_seconds',
      'database_up',
      'database_read_only',
      'poller_last_cycle_age_seconds',
      'reaction_jobs_failed',
      'retention_rows_pruned_total',
      'webhook_oldest_delivery_timestamp_seconds',
      'retention_last_pass_age_seconds',
      'retention_interval_seconds',
      'orders_needing_attention',
      'partner_api_clock_offset_seconds',
      'database_clock_offset_seconds',
      'reaction_stream_positions_ahead',
    ]) {
      expect(used.has(name), `${name} is used`).toBe(true)
    }
  })

  it('draw every metric an alert rule reads on some dashboard panel', () => {
    // an operator paged by an alert finds its metric's history on the dashboard, not only in Prometheus
    const onPanels = new Set(panelExpressions().flatMap(metricNames))
    const missing = alertRules().flatMap((rule) =>
      metricNames(rule.expr)
        .filter((name) => !onPanels.has(name) && !ALERT_THRESHOLD_SERIES.has(name))
        .map((name) => `${name} (alert ${rule.alert})`),
    )
    expect(missing).toEqual([])
    // the check read every rule's expression, and the exceptions are still read by one
    const watched = new Set(alertRules().flatMap((rule) => metricNames(rule.expr)))
    expect(watched.size).toBeGreaterThan(15)
    for (const name of ALERT_THRESHOLD_SERIES) expect(watched.has(name), `${name} is read by an alert`).toBe(true)
  })

  it('lay the dashboard panels out in 24 columns, none over another, each id once', () => {
    const panels = readDashboard().panels
    const overlapping: string[] = []
    for (const [index, panel] of panels.entries()) {
      for (const other of panels.slice(index + 1)) {
        const a = panel.gridPos
        const b = other.gridPos
        if (a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h) {
          overlapping.push(`${panel.title} and ${other.title}`)
        }
      }
    }
    expect(overlapping).toEqual([])
    expect(panels.filter((panel) => panel.gridPos.x + panel.gridPos.w > 24).map((panel) => panel.title)).toEqual([])
    expect(new Set(panels.map((panel) => panel.id)).size).toBe(panels.length)
  })

  it('finds a renamed metric, a misspelt one inside a function, and a syntax error', async () => {
    const exported = await exportedNames()
    expect(metricNames('sum by (outcome) (rate(webhook_delivery_total{job="x"}[$__rate_interval]))')).toEqual([
      'webhook_delivery_total',
    ])
    expect(exported.has('webhook_delivery_total')).toBe(false)
    expect(
      metricNames('histogram_quantile(0.99, sum by (le) (rate(webhook_ingest_seconds_bucket[5m]))) > on(job) up'),
    ).toEqual(['webhook_ingest_seconds_bucket', 'up'])
    expect(() => metricNames('sum(rate(webhook_deliveries_total[5m])')).toThrow(/syntax error/)
  })

  it('give every alert a severity, a summary, a description and a runbook hint', () => {
    const rules = alertRules()
    expect(rules.map((rule) => rule.alert)).toEqual([
      'PartnerEscrowDown',
      'PartnerEscrowDatabaseDown',
      'PartnerEscrowDatabaseReadOnly',
      'PartnerEscrowDatabaseTablesMissing',
      'PartnerEscrowDataDirFull',
      'PartnerEscrowWebhookSignatureFailures',
      'PartnerEscrowWebhookSignatureMismatches',
      'PartnerEscrowWebhookSignaturesWhileQuiet',
      'PartnerEscrowWebhooksSilent',
      'PartnerEscrowParkedDeliveriesOld',
      'PartnerEscrowOldestDueOrderLate',
      'PartnerEscrowPollerStalled',
      'PartnerEscrowPruningStalled',
      'PartnerEscrowPartnerApiUnauthorized',
      'PartnerEscrowReactionsFailed',
      'PartnerEscrowAmqpUnroutable',
      'PartnerEscrowReactionsLate',
      'PartnerEscrowReactionPositionsAhead',
      'PartnerEscrowNotificationsNotHeard',
      'PartnerEscrowAutovacuumOff',
      'PartnerEscrowOrdersFlagged',
      'PartnerEscrowClockOffset',
      'PartnerEscrowDatabaseClockOffset',
    ])
    // an age is read as the replica measured it: time() minus a time it wrote is off by as much as its clock is
    expect(rules.filter((rule) => /\btime\(\)/.test(rule.expr)).map((rule) => rule.alert)).toEqual([])
    for (const rule of rules) {
      expect(['critical', 'warning'], rule.alert).toContain(rule.labels?.severity)
      for (const key of ['summary', 'description', 'runbook']) {
        expect(rule.annotations?.[key]?.length ?? 0, `${rule.alert} ${key}`).toBeGreaterThan(20)
      }
    }
  })
})

// promtool comes from Debian's prometheus package, which .ci/run installs: in CI its absence fails the run
const promtool = findPromtool()
const describePromtool = promtool || process.env.CI ? describe : describe.skip
if (!promtool && !process.env.CI) {
  console.warn('promtool is not installed: the alert rule unit tests are SKIPPED; CI runs them (apt-get install prometheus).')
}

describePromtool('promtool', () => {
  it('checks the rules and the example configuration, and passes every rule unit test', () => {
    if (!promtool) throw new Error('promtool is required in CI: .ci/run installs Debian\'s prometheus package')
    const run = (...args: string[]) =>
      execFileSync(promtool, args, { cwd: 'deploy/prometheus', encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] })
    expect(run('check', 'rules', 'alerts.yml')).toMatch(/SUCCESS: 23 rules found/)
    expect(run('check', 'config', 'prometheus.yml')).toMatch(/SUCCESS/)
    const output = run('test', 'rules', 'alerts.test.yml')
    expect(output).toMatch(/SUCCESS/)
    // a test per rule: every alert is expected to fire in at least one case
    const tests = parseYaml(readFileSync('deploy/prometheus/alerts.test.yml', 'utf8')) as {
      tests: { alert_rule_test: { alertname: string; exp_alerts: unknown[] }[] }[]
    }
    const cases = tests.tests.flatMap((test) => test.alert_rule_test)
    const fired = new Set(cases.filter((check) => check.exp_alerts.length > 0).map((check) => check.alertname))
    const quiet = new Set(cases.filter((check) => check.exp_alerts.length === 0).map((check) => check.alertname))
    const alerts = alertRules().map((rule) => rule.alert)
    expect([...fired].sort()).toEqual([...alerts].sort())
    expect([...quiet].sort()).toEqual([...alerts].sort())
  })
})

function findPromtool(): string | undefined {
  try {
    execFileSync('promtool', ['--version'], { stdio: 'ignore' })
    return 'promtool'
  } catch {
    return undefined
  }
}
