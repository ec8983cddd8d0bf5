// The console's pages, as typed functions of their data. The `html` tag (console-html.ts: hono/html's) escapes
// every interpolated value (text and attribute alike) unless it is itself a template, and shows a bidirectional
// or invisible character in text as its escape: a delivery's attacker-chosen id, reference or body can only ever
// show as text, in its order. Nothing here writes raw().
import type { PartnerEnv } from '../config.js'
import { linkedElsewhere, type Order, type StatusChange, unsentCreate } from '../orders/order.js'
import { DUE_COUNT_CAP } from '../orders/poll-schedule.repository.js'
import { describeClockOffset } from '../partner-api/clock-offset.js'
import type { EventReaction, ReactionJob, ReactionJobFilter, ReactionJobState } from '../reactions/reaction-job.repository.js'
import type { ReactionEvent } from '../reactions/reaction-event.js'
import type { JobWaitedFor } from '../reactions/retried-text.js'
import type { ReportedRun } from '../reconcile/reconcile-run.repository.js'
import { type LeasedElsewhere, leasedElsewhereLine } from '../reconcile/leased-elsewhere.js'
import type { RunSummary } from '../reconcile/poller.js'
import {
  DELIVERY_OUTCOMES,
  type DeliveriesPerMinute,
  type DeliveryCursor,
  type DeliveryFilter,
  type DeliverySummary,
  type OutcomeCount,
  type StoredDelivery,
  WEBHOOK_OUTCOMES,
} from '../webhooks/delivery.repository.js'
import { invalidReason } from '../webhooks/invalid-reason.js'
import { ScopedStore } from '../scoped-store.js'
import type { Operator } from './console-auth.js'
import { type Html, html } from './console-html.js'

export type { Html }

/** Where the console's routes are, on the operator listener. */
export const CONSOLE_PATH = '/console'

// A reverse proxy may serve the console under a path of its own, taken off before the request reaches us
// (https://ops.example.com/escrow/console/ → /console/): it says which in X-Forwarded-Prefix (Traefik's
// StripPrefix does so itself; nginx: proxy_set_header X-Forwarded-Prefix /escrow). Every link, form, redirect
// and the session cookie's path then begin with it; before, they led to https://ops.example.com/console/…, which
// the proxy did not serve. A value that is not a plain path (segments of letters, digits and . _ ~ -) is ignored.
// It is kept for the request while the request is answered (scoped-store.ts), and only when there is one: a request
// without a prefix has nothing to keep.
const forwardedPrefix = new ScopedStore<string>()
const PLAIN_PATH = /^(\/[A-Za-z0-9._~-]+)+$/

/** Runs `handle` with the prefix the request's proxy gave (none, or one not a plain path: nothing), until `answered` settles. */
export function withForwardedPrefix(header: string | string[] | undefined, answered: () => PromiseLike<unknown>, handle: () => void): void {
  const prefix = typeof header === 'string' && PLAIN_PATH.test(header) && !header.split('/').some((segment) => segment === '.' || segment === '..') ? header : ''
  if (prefix === '') handle()
  else forwardedPrefix.run(prefix, handle, { done: answered() })
}

/** The console's path as the operator's browser sees it: CONSOLE_PATH behind the proxy's prefix, if any. */
export function consolePath(): string {
  return `${forwardedPrefix.getStore() ?? ''}${CONSOLE_PATH}`
}

const time = (value: Date | null | undefined) => (value ? value.toISOString().replace('.000Z', 'Z') : '—')
const age = (seconds: number) =>
  seconds < 90 ? `${Math.round(seconds)} s` : seconds < 5400 ? `${Math.round(seconds / 60)} min` : `${(seconds / 3600).toFixed(1)} h`

// A delivery's id is whatever the platform sent in X-Partner-Delivery-Id: in a path, an id `.` or `..` is a dot
// segment, which a browser resolves away (even written %2e) before the request is sent. So every link to a
// delivery carries its id in the query, where nothing resolves it. The path addresses
// (/deliveries/ID/SHA256[/reapply]) still answer for any other id.
function deliveryQuery(delivery: { deliveryId: string; bodySha256: string }): string {
  return new URLSearchParams({ id: delivery.deliveryId, body: delivery.bodySha256 }).toString()
}
export function deliveryPath(delivery: { deliveryId: string; bodySha256: string }): string {
  return `${consolePath()}/delivery?${deliveryQuery(delivery)}`
}
export function deliveryReapplyPath(delivery: { deliveryId: string; bodySha256: string }): string {
  return `${consolePath()}/delivery/reapply?${deliveryQuery(delivery)}`
}
export const orderPath = (id: number) => `${consolePath()}/orders/${id}`
export const reactionPath = (id: string) => `${consolePath()}/reactions/${id}`

export function layout(title: string, operator: Operator | undefined, body: Html): Html {
  return html`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${title} · partner-escrow console</title>
<link rel="stylesheet" href="${consolePath()}/console.css">
</head>
<body>
<header>
  <strong>partner-escrow</strong>
  ${
    operator
      ? html`<nav>
    <a href="${consolePath()}/">Overview</a>
    <a href="${consolePath()}/deliveries">Deliveries</a>
    <a href="${consolePath()}/orders">Orders</a>
    <a href="${consolePath()}/reactions">Reactions</a>
    <a href="${consolePath()}/reconcile">Reconcile</a>
  </nav>
  <form method="post" action="${consolePath()}/logout" class="logout">
    <span>${operator.name}</span>
    <input type="hidden" name="csrf" value="${operator.csrfToken}">
    <button type="submit">Log out</button>
  </form>`
      : ''
  }
</header>
<main>
<h1>${title}</h1>
${body}
</main>
</body>
</html>`
}

export function loginPage(problem?: string): Html {
  return layout(
    'Log in',
    undefined,
    html`${problem ? html`<p class="problem">${problem}</p>` : ''}
<form method="post" action="${consolePath()}/login" class="login">
  <label>Admin token <input type="password" name="token" autocomplete="current-password" required autofocus></label>
  <label>Your name (for the action log) <input type="text" name="name" maxlength="64"></label>
  <button type="submit">Log in</button>
</form>
<p class="hint">The token is ADMIN_TOKEN; in local mode, <code>adminToken</code> in DATA_DIR/local-secrets.json (the start-up banner prints it once).</p>`,
  )
}

export function messagePage(title: string, operator: Operator | undefined, message: string): Html {
  return layout(title, operator, html`<p class="problem">${message}</p>`)
}

export interface OverviewData {
  perMinute: DeliveriesPerMinute[]
  since: Date
  /**
   * This replica's counts since its start (in memory, not the service's): signatures matching no secret, and requests
   * unsigned or with a malformed signature (anyone's); the replica's name (host:pid) and when it started counting.
   */
  signatureFailures: { mismatch: number; unsigned: number; replica: string; since: Date } | undefined
  ordersDue: number
  oldestDueAgeS: number
  parked: number
  oldestParkedAgeS: number
  attention: { attention: string; orders: number }[]
  reactions: { pending: number; running: number; failed: number; oldestPendingAgeS: number }
  failedByHandler: { handler: string; jobs: number }[]
  runs: ReportedRun[]
  /** The longest a reconcile cycle runs, named beside a run shown unfinished. */
  longestCycleMs: number
  actions: readonly ActionRecord[]
}

export interface ActionRecord {
  at: Date
  operator: string
  action: string
  result: string
}

export function overviewPage(operator: Operator, data: OverviewData): Html {
  const needsHuman: Html[] = []
  const flagged = data.attention.reduce((sum, row) => sum + row.orders, 0)
  if (flagged > 0) {
    needsHuman.push(
      html`<li><a href="${consolePath()}/orders?attention=1">${flagged} order(s) flagged</a>
        (${data.attention.map((row) => `${row.attention}: ${row.orders}`).join(', ')}):
        the platform does not know their trade (trade_not_found) or answered another trade's or order's record
        (trade_mismatch), and they are no longer polled: <a href="${consolePath()}/orders/requeue">requeue them</a> once fixed.
        Or their trade create got no answer and no webhook linked a trade (trade_create_unknown): look for a trade with
        their reference in the partner portal (its next webhook links it); if there is none, send the create again
        with <code>trades open REFERENCE --retry</code>.
        Or their stored trade id cannot be put in a request (unusable_trade_id): nothing is sent for them, so act on
        the trade in the platform's dashboard; requeued, they are flagged again.</li>`,
    )
  }
  if (data.reactions.failed > 0) {
    needsHuman.push(
      html`<li><a href="${consolePath()}/reactions?state=failed">${data.reactions.failed} failed reaction(s)</a>
        (${data.failedByHandler.map((row) => `${row.handler}: ${row.jobs}`).join(', ')}): each holds back its order's later events
        for its handler. Fix the cause, then retry them (or skip one).</li>`,
    )
  }
  if (data.parked > 0) {
    needsHuman.push(
      html`<li><a href="${consolePath()}/deliveries?outcome=unmatched">${data.parked} parked deliveries</a> (oldest ${age(data.oldestParkedAgeS)}):
        webhooks for external references with no order; create the orders (then re-apply), or, for a reference that
        is not yours (a trade another system opened), set its deliveries aside (Dismiss on a parked delivery's page, or
        <code>deliveries dismiss REFERENCE</code>; ORDER_REFERENCE_PATTERN keeps them out) rather than create an order for it.</li>`,
    )
  }
  const hourTotals = new Map<string, number>()
  for (const row of data.perMinute) hourTotals.set(row.outcome, (hourTotals.get(row.outcome) ?? 0) + row.deliveries)
  for (const outcome of ['trade_mismatch', 'unknown_status', 'invalid'] as const) {
    const count = hourTotals.get(outcome) ?? 0
    if (count > 0) {
      needsHuman.push(
        html`<li><a href="${consolePath()}/deliveries?outcome=${outcome}">${count} ${outcome} deliveries</a> in the last hour.</li>`,
      )
    }
  }
  const stopped = data.runs.find((run) => run.stoppedReason === 'unauthorized')
  if (stopped) {
    needsHuman.push(
      stopped.clockOffsetS === null
        ? html`<li>Reconcile run ${stopped.id} was refused by the platform (401): check the API credentials (PARTNER_API_KEY_ID, PARTNER_API_SECRET, PARTNER_ENV).</li>`
        : html`<li>Reconcile run ${stopped.id} was refused by the platform (401): ${describeClockOffset(stopped.clockOffsetS)}.</li>`,
    )
  }
  if (data.signatureFailures?.mismatch) {
    needsHuman.push(
      html`<li>${data.signatureFailures.mismatch} webhook signatures matching no secret on this replica (${data.signatureFailures.replica}) since its start: check WEBHOOK_SECRETS.</li>`,
    )
  }

  const minutes = [...new Set(data.perMinute.map((row) => row.minute.getTime()))].sort((a, b) => b - a)
  const outcomes = DELIVERY_OUTCOMES.filter((outcome) => hourTotals.has(outcome))
  const countAt = (minute: number, outcome: string) =>
    data.perMinute.find((row) => row.minute.getTime() === minute && row.outcome === outcome)?.deliveries ?? 0

  return layout(
    'Overview',
    operator,
    html`<section class="${needsHuman.length ? 'attention' : 'calm'}">
  <h2>Needs a human</h2>
  ${needsHuman.length ? html`<ul>${needsHuman}</ul>` : html`<p>Nothing: no flagged orders, no failed reactions, no parked deliveries, no refused runs.</p>`}
</section>
<section class="cards">
  <div><span class="figure">${data.ordersDue >= DUE_COUNT_CAP ? `${DUE_COUNT_CAP.toLocaleString('en')}+` : data.ordersDue}</span> orders due to poll<br>oldest due ${age(data.oldestDueAgeS)}</div>
  <div><span class="figure">${data.parked}</span> parked deliveries</div>
  <div><span class="figure">${flagged}</span> flagged orders</div>
  <div><span class="figure">${data.reactions.pending + data.reactions.running}</span> <a href="${consolePath()}/reactions?state=pending">reactions to run</a><br>${
    data.reactions.pending + data.reactions.running > 0 ? `oldest ${age(data.reactions.oldestPendingAgeS)}` : 'none waiting'
  }</div>
  <div><span class="figure">${data.reactions.failed}</span> <a href="${consolePath()}/reactions?state=failed">failed reactions</a></div>
  <div><span class="figure">${data.signatureFailures?.mismatch ?? '—'}</span> signatures matching no secret on this replica since its start<br>${
    data.signatureFailures
      ? html`${data.signatureFailures.unsigned} unsigned or malformed (anyone’s)<br><span class="hint">replica ${data.signatureFailures.replica}, counting since
    ${time(data.signatureFailures.since)}; each replica counts its own: the service’s total is
    <code>sum(increase(webhook_signature_failures_total{signature="mismatch"}[10m]))</code> across replicas, which the alerts
    PartnerEscrowWebhookSignatureFailures and PartnerEscrowWebhookSignatureMismatches read</span>`
      : ''
  }</div>
</section>
<section>
  <h2>Deliveries per minute, last hour</h2>
  ${
    minutes.length === 0
      ? html`<p>No delivery since ${time(data.since)}.</p>`
      : html`<table>
    <thead><tr><th>minute (UTC)</th>${outcomes.map((outcome) => html`<th>${outcome}</th>`)}</tr></thead>
    <tbody>${minutes.map(
      (minute) =>
        html`<tr><td>${new Date(minute).toISOString().slice(11, 16)}</td>${outcomes.map((outcome) => html`<td class="number">${countAt(minute, outcome) || ''}</td>`)}</tr>`,
    )}</tbody>
    <tfoot><tr><th>hour</th>${outcomes.map((outcome) => html`<th class="number">${hourTotals.get(outcome)}</th>`)}</tr></tfoot>
  </table>`
  }
</section>
<section>
  <h2>Last reconcile runs</h2>
  ${runsTable(data.runs, data.longestCycleMs)}
</section>
<section>
  <h2>Console actions since start</h2>
  ${
    data.actions.length === 0
      ? html`<p>None.</p>`
      : html`<table><thead><tr><th>when</th><th>who</th><th>action</th><th>result</th></tr></thead>
    <tbody>${data.actions.map((action) => html`<tr><td>${time(action.at)}</td><td>${action.operator}</td><td>${action.action}</td><td>${action.result}</td></tr>`)}</tbody></table>`
  }
</section>`,
  )
}

function runsTable(runs: ReportedRun[], longestCycleMs: number): Html {
  if (runs.length === 0) return html`<p>No reconcile run yet.</p>`
  const count = (value: number | null) => (value === null ? '-' : String(value))
  return html`<table>
<thead><tr><th>run</th><th>replica</th><th>started</th><th>seconds</th><th>polled</th><th>changed</th><th>errors</th><th>stopped</th></tr></thead>
<tbody>${runs.map(
    (run) =>
      html`<tr><td>${run.id}</td><td>${run.replica}</td><td>${time(run.startedAt)}</td><td class="number">${
        run.finishedAt
          ? ((run.finishedAt.getTime() - run.startedAt.getTime()) / 1000).toFixed(1)
          : run.state === 'unfinished'
            ? html`<span class="problem">unfinished</span>`
            : 'running'
      }</td><td class="number">${count(run.polled)}</td><td class="number">${count(run.changed)}</td><td class="number">${count(run.errors)}</td><td>${run.stoppedReason ?? ''}${
        run.clockOffsetS === null ? '' : html`<br><span class="problem">${describeClockOffset(run.clockOffsetS)}</span>`
      }</td></tr>`,
  )}</tbody></table>${
    runs.some((run) => run.state === 'unfinished')
      ? html`<p>Unfinished: no end recorded ${Math.round(longestCycleMs / 1000)} s after the start, past the longest a cycle runs: its process stopped (killed, its host lost) or lost the database. Its counts are unknown (-), and its orders came due again when their lease ran out.</p>`
      : ''
  }`
}

/** The filter as query-string fields, for links and hidden inputs. */
export function filterFields(filter: DeliveryFilter): [string, string][] {
  const fields: [string, string][] = []
  if (filter.tradeId) fields.push(['trade', filter.tradeId])
  if (filter.externalReference) fields.push(['reference', filter.externalReference])
  if (filter.deliveryId) fields.push(['delivery', filter.deliveryId])
  if (filter.outcome) fields.push(['outcome', filter.outcome])
  if (filter.eventType) fields.push(['event', filter.eventType])
  if (filter.from) fields.push(['from', filter.from.toISOString()])
  if (filter.to) fields.push(['to', filter.to.toISOString()])
  if (filter.startAfter) fields.push(['start', encodeCursor(filter.startAfter)])
  return fields
}

const queryString = (fields: [string, string][]) => new URLSearchParams(fields).toString()
const hiddenFields = (fields: [string, string][]) =>
  fields.map(([name, value]) => html`<input type="hidden" name="${name}" value="${value}">`)

function filterForm(filter: DeliveryFilter): Html {
  const input = (name: string, label: string, value: string | undefined, type = 'text') =>
    html`<label>${label} <input type="${type}" name="${name}" value="${value ?? ''}"></label>`
  return html`<form method="get" action="${consolePath()}/deliveries" class="filter">
  ${input('reference', 'External reference', filter.externalReference)}
  ${input('trade', 'Trade id', filter.tradeId)}
  ${input('delivery', 'Delivery id', filter.deliveryId)}
  ${input('event', 'Event kind', filter.eventType)}
  <label>Outcome <select name="outcome"><option value="">any</option>${WEBHOOK_OUTCOMES.map(
    (outcome) => html`<option value="${outcome}" ${filter.outcome === outcome ? 'selected' : ''}>${outcome}</option>`,
  )}</select></label>
  ${input('from', 'Received from (UTC)', filter.from?.toISOString())}
  ${input('to', 'until (UTC)', filter.to?.toISOString())}
  <button type="submit">Search</button>
</form>`
}

export function encodeCursor(cursor: DeliveryCursor): string {
  return Buffer.from(JSON.stringify([cursor.receivedAt, cursor.deliveryId, cursor.bodySha256])).toString('base64url')
}

export function deliveriesPage(
  operator: Operator,
  { filter, deliveries, next }: { filter: DeliveryFilter; deliveries: DeliverySummary[]; next: DeliveryCursor | undefined },
): Html {
  const fields = filterFields(filter)
  return layout(
    'Deliveries',
    operator,
    html`${filterForm(filter)}
<p class="actions">${
      filter.from || filter.to
        ? html`<a href="${consolePath()}/deliveries/reapply?${queryString(fields)}">Bulk re-apply these… (dry run first)</a>`
        : html`Bulk re-apply: give a time range (from, to or both) first.`
    }</p>
${
  deliveries.length === 0
    ? html`<p>No delivery matches.${spacedFieldsHint([
        ['External reference', filter.externalReference],
        ['Trade id', filter.tradeId],
        ['Delivery id', filter.deliveryId],
        ['Event kind', filter.eventType],
      ])}</p>`
    : html`<table class="deliveries">
<thead><tr><th>received (UTC)</th><th>delivery</th><th>event</th><th>external reference</th><th>trade</th><th>status</th><th>outcome</th></tr></thead>
<tbody>${deliveries.map(
        (delivery) => html`<tr>
  <td>${time(delivery.receivedAt)}</td>
  <td><a href="${deliveryPath(delivery)}">${delivery.deliveryId}</a></td>
  <td>${delivery.eventType}</td>
  <td>${delivery.externalReference ?? '—'}</td>
  <td>${delivery.tradeId ?? '—'}</td>
  <td>${delivery.observedStatus ?? '—'}</td>
  <td><span class="outcome ${delivery.outcome}">${delivery.outcome}</span></td>
</tr>`,
      )}</tbody></table>`
}
${next ? html`<p><a rel="next" href="${consolePath()}/deliveries?${queryString([...fields, ['after', encodeCursor(next)]])}">Older →</a></p>` : ''}`,
  )
}

/**
 * Deeper than this, a body is shown as sent: each level indents every line below it, so a signed body of
 * 126 kB nested 3,500 deep would re-indent to a page of 441 MB.
 */
const PRETTY_MAX_DEPTH = 16

const JSON_WHITESPACE = ' \t\n\r'
// where a number, true, false or null ends
const JSON_DELIMITERS = '{}[],:"' + JSON_WHITESPACE

/**
 * Valid JSON text laid out as JSON.stringify(value, null, 2) would, token for token as sent: JSON.parse and
 * JSON.stringify showed a body other than the one received (of two equal keys only the last, 12345678901234567890
 * rounded to 12345678901234567000, 1e400 as null, 1.50 as 1.5, `\u00e9` decoded). Undefined when objects or
 * arrays nest deeper than `maxDepth`.
 */
function reindentedJson(text: string, maxDepth: number): string | undefined {
  let out = ''
  let depth = 0
  const newline = () => `\n${'  '.repeat(depth)}`
  for (let i = 0; i < text.length; ) {
    const c = text[i]!
    if (c === '"') {
      let end = i + 1
      while (text[end] !== '"') end += text[end] === '\\' ? 2 : 1
      out += text.slice(i, end + 1)
      i = end + 1
    } else if (JSON_WHITESPACE.includes(c)) {
      i++
    } else if (c === '{' || c === '[') {
      if (++depth > maxDepth) return undefined
      let next = i + 1
      while (JSON_WHITESPACE.includes(text[next]!)) next++
      if (text[next] === (c === '{' ? '}' : ']')) {
        depth--
        out += `${c}${text[next]}`
        i = next + 1
      } else {
        out += c + newline()
        i++
      }
    } else if (c === '}' || c === ']') {
      depth--
      out += newline() + c
      i++
    } else if (c === ',') {
      out += `,${newline()}`
      i++
    } else if (c === ':') {
      out += ': '
      i++
    } else {
      let end = i + 1
      while (end < text.length && !JSON_DELIMITERS.includes(text[end]!)) end++
      out += text.slice(i, end)
      i = end
    }
  }
  return out
}

/** A body shown as text: JSON re-indented (a view only; the stored bytes are untouched), anything else as sent. */
function prettyBody(rawBody: string): string {
  try {
    JSON.parse(rawBody)
  } catch {
    return rawBody
  }
  return reindentedJson(rawBody, PRETTY_MAX_DEPTH) ?? rawBody
}

/** Why a delivery stored as `invalid` was, in words (outside text: the caller's template escapes it). */
export function invalidReasonOf(delivery: StoredDelivery): string {
  return delivery.rawBody === null ? 'not known: the raw body it is read from was pruned' : invalidReason(delivery.rawBody)
}

export function deliveryPage(
  operator: Operator,
  {
    delivery,
    order,
    bodies,
    bodyRetentionDays,
  }: { delivery: StoredDelivery; order: Order | undefined; bodies: number; bodyRetentionDays?: number | undefined },
): Html {
  return layout(
    'Delivery',
    operator,
    html`<dl class="fields">
  <dt>X-Partner-Delivery-Id</dt><dd><code>${delivery.deliveryId}</code></dd>
  <dt>Body SHA-256</dt><dd><code>${delivery.bodySha256}</code>${bodies > 1 ? html` (this id was reused: ${bodies} bodies stored)` : ''}</dd>
  <dt>Received</dt><dd>${time(delivery.receivedAt)}</dd>
  <dt>Event kind</dt><dd>${delivery.eventType}</dd>
  <dt>Outcome</dt><dd><span class="outcome ${delivery.outcome}">${delivery.outcome}</span>${delivery.appliedAt ? html` (applied ${time(delivery.appliedAt)})` : ''}</dd>
${delivery.outcome === 'invalid' ? html`  <dt>Why invalid</dt><dd>${invalidReasonOf(delivery)}</dd>
` : ''}  <dt>Trade</dt><dd>${delivery.tradeId ?? '—'} ${delivery.observedStatus ? html`reporting <strong>${delivery.observedStatus}</strong>` : ''}</dd>
  <dt>External reference</dt><dd>${delivery.externalReference ?? '—'}</dd>
  <dt>Order</dt><dd>${order ? html`<a href="${orderPath(order.id)}">#${order.id} ${order.externalReference}</a> (now ${order.tradeStatus ?? 'no status'})` : 'none'}</dd>
</dl>
<p class="hint">Headers: the service keeps the delivery id (above) and the verified body; the signature and other headers are not stored.</p>
<p class="actions"><a href="${deliveryReapplyPath(delivery)}">Re-apply…</a>${
      delivery.outcome === 'unmatched' && delivery.externalReference !== null && !order
        ? html` <a href="${consolePath()}/deliveries/dismiss?${queryString([['reference', delivery.externalReference]])}">Dismiss the parked deliveries of this reference…</a>`
        : ''
    }</p>
<h2>Raw body</h2>
${
  delivery.rawBody === null
    ? html`<p class="hint">Pruned: raw bodies are kept ${bodyRetentionDays === undefined ? 'for RETENTION_DAYS' : `${bodyRetentionDays} days`} after receipt. The row and its body hash stay, so a retry of this delivery is still a duplicate.</p>`
    : html`<pre class="body">${prettyBody(delivery.rawBody)}</pre>`
}`,
  )
}

/**
 * After "no match": the search fields whose text begins or ends with white space, which a search matches exactly
 * (a reference ' ref-x' is not 'ref-x'), named so a space pasted into a search box is seen.
 */
function spacedFieldsHint(fields: [string, string | undefined][]): Html {
  const spaced = fields.filter(([, value]) => value !== undefined && value !== value.trim())
  if (spaced.length === 0) return html``
  return html` ${spaced.map(([name, value], i) => html`${i > 0 ? ', ' : ''}${name} ${JSON.stringify(value)}`)} begins or ends with white space, and is matched exactly as written.`
}

/**
 * A reference in a confirm page's question, saying so when it begins or ends with white space, which a page does not
 * show: ' ref-x' is another reference than 'ref-x', and the action is on the one named.
 */
export function referenceShown(reference: string): Html {
  return html`<code>${reference}</code>${
    reference !== reference.trim() ? html` (exactly as written, with the white space it begins or ends with: ${JSON.stringify(reference)})` : ''
  }`
}

export function confirmPage(
  operator: Operator,
  { title, question, action, fields, actionId, button }: {
    title: string
    question: Html
    action: string
    fields: [string, string][]
    actionId: string
    button: string
  },
): Html {
  return layout(
    title,
    operator,
    html`<div class="confirm">${question}</div>
<form method="post" action="${action}">
  ${hiddenFields(fields)}
  <input type="hidden" name="action_id" value="${actionId}">
  <input type="hidden" name="csrf" value="${operator.csrfToken}">
  <button type="submit" class="danger">${button}</button>
  <a href="${consolePath()}/">Cancel</a>
</form>`,
  )
}

export function resultPage(operator: Operator, title: string, record: ActionRecord, repeated: boolean, links: Html = html``): Html {
  return layout(
    title,
    operator,
    html`${repeated ? html`<p class="problem">This action was already carried out; nothing was done again.</p>` : ''}
<p class="result">${record.result}</p>
<p class="hint">${record.action}, by ${record.operator} at ${time(record.at)}.</p>
${links}`,
  )
}

/** After a bulk re-apply: the next run's confirm page, starting after the last delivery this one re-applied. */
export function bulkReapplyNextLink(filter: DeliveryFilter, next: DeliveryCursor | undefined): Html {
  if (!next) return html`<p>That was every matching delivery.</p>`
  return html`<p><a href="${consolePath()}/deliveries/reapply?${queryString(filterFields({ ...filter, startAfter: next }))}">Re-apply the next ones →</a> (a dry run first)</p>`
}

/**
 * What re-applying the deliveries of one outcome does (reapplyDelivery): a delivery is applied to the order its
 * reference has now, and one with no order is parked, a dismissed one left dismissed. The dismissed were said to be
 * "applied again: a status the order already has changes nothing", with no order to apply them to: they stayed dismissed.
 */
function whatReapplyingDoes({ outcome, deliveries, withOrder }: OutcomeCount): string {
  const without = deliveries - withOrder
  if (outcome === 'ignored' || outcome === 'invalid') return 'nothing: not trade events'
  if (outcome === 'unmatched') return `${withOrder} can now be applied to their order; ${without} stay parked`
  if (outcome === 'dismissed') {
    return [
      ...(withOrder > 0 ? [`${withOrder} applied to the order made since for their reference`] : []),
      ...(without > 0 ? [`${without} stay dismissed: no order has their reference`] : []),
    ].join('; ')
  }
  return [
    ...(withOrder > 0 ? [`${withOrder} applied again: a status the order already has changes nothing`] : []),
    ...(without > 0 ? [`${without} parked (unmatched): no order has their reference now`] : []),
  ].join('; ')
}

export function bulkDryRunText(counts: OutcomeCount[], limit: number, startAfter?: DeliveryCursor): Html {
  const total = counts.reduce((sum, row) => sum + row.deliveries, 0)
  return html`<p><strong>Dry run:</strong> ${total} deliveries match${startAfter ? html`, received after the last one the previous run re-applied (${startAfter.receivedAt})` : ''}${
    total > limit ? html` (the oldest ${limit} are re-applied per run; its result offers the next ${limit})` : ''
  }.</p>
<table><thead><tr><th>outcome now</th><th>deliveries</th><th>with an order now</th><th>what re-applying does</th></tr></thead>
<tbody>${counts.map(
    (row) => html`<tr><td>${row.outcome}</td><td class="number">${row.deliveries}</td><td class="number">${row.withOrder}</td><td>${whatReapplyingDoes(row)}</td></tr>`,
  )}</tbody></table>`
}

export function ordersPage(
  operator: Operator,
  { orders, nextLink, filter }: { orders: Order[]; nextLink: string | undefined; filter: { reference?: string | undefined; trade?: string | undefined; status?: string | undefined; attention: boolean } },
): Html {
  return layout(
    'Orders',
    operator,
    html`<form method="get" action="${consolePath()}/orders" class="filter">
  <label>External reference <input name="reference" value="${filter.reference ?? ''}"></label>
  <label>Trade id <input name="trade" value="${filter.trade ?? ''}"></label>
  <label>Status <input name="status" value="${filter.status ?? ''}"></label>
  <label><input type="checkbox" name="attention" value="1" ${filter.attention ? 'checked' : ''}> flagged only</label>
  <button type="submit">Search</button>
</form>
<p class="actions"><a href="${consolePath()}/orders/requeue">Requeue every flagged order…</a></p>
${
  orders.length === 0
    ? html`<p>No order matches.${spacedFieldsHint([
        ['External reference', filter.reference],
        ['Trade id', filter.trade],
        ['Status', filter.status],
      ])}</p>`
    : html`<table><thead><tr><th>order</th><th>external reference</th><th>trade</th><th>env</th><th>status</th><th>source</th><th>next poll (UTC)</th><th>attempts</th><th>attention</th></tr></thead>
<tbody>${orders.map(
        (order) => html`<tr>
  <td><a href="${orderPath(order.id)}">#${order.id}</a></td><td>${order.externalReference}</td><td>${order.tradeId ?? '—'}</td><td>${order.partnerEnv ?? '—'}</td>
  <td>${order.tradeStatus ?? '—'}</td><td>${order.statusSource ?? '—'}</td><td>${time(order.nextPollAt)}</td>
  <td class="number">${order.pollAttempts}</td><td>${order.attention ? html`<span class="outcome attention">${order.attention}</span>` : ''}</td>
</tr>`,
      )}</tbody></table>`
}
${nextLink ? html`<p><a rel="next" href="${nextLink}">Older →</a></p>` : ''}`,
  )
}

// the platform environment a linked order's trade lives in (orders.partner_env): one of the other PARTNER_ENV is left
// as it is, neither polled nor moved (README, "Going live")
function orderEnvironment(order: Order, partnerEnv: PartnerEnv): Html {
  if (order.partnerEnv === null) return html`${partnerEnv} (not recorded: linked before it was kept, taken as this service's)`
  const elsewhere = linkedElsewhere(order, partnerEnv)
  if (elsewhere) return html`<strong>${elsewhere}</strong> · not polled nor moved while this service runs with PARTNER_ENV=${partnerEnv}`
  return html`${order.partnerEnv}`
}

export function orderPage(
  operator: Operator,
  {
    order,
    history,
    reactions,
    deliveries,
    olderDeliveries,
    partnerEnv,
  }: {
    order: Order
    history: StatusChange[]
    reactions: EventReaction[]
    deliveries: DeliverySummary[]
    /** Where the deliveries search goes on past the newest shown here: undefined when they are all shown. */
    olderDeliveries?: DeliveryCursor | undefined
    partnerEnv: PartnerEnv
  },
): Html {
  return layout(
    `Order #${order.id}`,
    operator,
    html`<dl class="fields">
  <dt>External reference</dt><dd>${order.externalReference}</dd>
  <dt>Trade</dt><dd>${order.tradeId ?? '—'} ${order.tradeReference ? html`(${order.tradeReference})` : ''} · create ${order.tradeCreateState}${unsentCreate(order) ? ' (marked, not sent)' : ''}</dd>
  ${order.tradeId === null ? '' : html`<dt>Environment</dt><dd>${orderEnvironment(order, partnerEnv)}</dd>`}
  <dt>Status</dt><dd><strong>${order.tradeStatus ?? 'none yet'}</strong> ${order.statusSource ? html`by ${order.statusSource} at ${time(order.statusChangedAt)}` : ''}</dd>
  <dt>Poll schedule</dt><dd>${order.nextPollAt ? html`next poll ${time(order.nextPollAt)}` : 'not scheduled'} · ${order.pollAttempts} failed attempts</dd>
  <dt>Attention</dt><dd>${
    order.attention
      ? html`<span class="outcome attention">${order.attention}</span>
      <form method="get" action="${consolePath()}/orders/requeue" class="inline"><input type="hidden" name="reference" value="${order.externalReference}"><button type="submit">Requeue…</button></form>`
      : 'none'
  }</dd>
  <dt>Created</dt><dd>${time(order.createdAt)}</dd>
</dl>
<h2>Timeline</h2>
${
  history.length === 0
    ? html`<p>No status change yet.</p>`
    : html`<table class="timeline"><thead><tr><th>when (UTC)</th><th>from</th><th>to</th><th>channel</th><th>delivery</th><th>reactions caused</th></tr></thead>
<tbody>${history.map(
        (change) => html`<tr><td>${time(change.recordedAt)}</td><td>${change.fromStatus ?? '—'}</td><td>${change.toStatus}</td><td>${change.source}</td><td>${change.deliveryId ?? ''}</td><td>${reactionLinks(
          reactions.filter((job) => job.eventId === change.eventId),
        )}</td></tr>`,
      )}</tbody></table>`
}
<h2>Deliveries for this reference</h2>
${
  deliveries.length === 0
    ? html`<p>None.</p>`
    : html`<table><thead><tr><th>received (UTC)</th><th>delivery</th><th>status</th><th>outcome</th></tr></thead>
<tbody>${deliveries.map(
        (delivery) => html`<tr><td>${time(delivery.receivedAt)}</td><td><a href="${deliveryPath(delivery)}">${delivery.deliveryId}</a></td><td>${delivery.observedStatus ?? '—'}</td><td>${delivery.outcome}</td></tr>`,
      )}</tbody></table>${
        // the newest page only: the rest of them in the deliveries search, from where this list stops
        olderDeliveries
          ? html`<p>The newest ${deliveries.length} shown. <a rel="next" href="${consolePath()}/deliveries?${queryString([
              ['reference', order.externalReference],
              ['after', encodeCursor(olderDeliveries)],
            ])}">Older deliveries of this reference →</a></p>`
          : ''
      }`
}`,
  )
}

export function reconcilePage(
  operator: Operator,
  { runs, longestCycleMs, actionId, available }: { runs: ReportedRun[]; longestCycleMs: number; actionId: string; available: boolean },
): Html {
  return layout(
    'Reconcile',
    operator,
    html`${
      available
        ? html`<form method="post" action="${consolePath()}/reconcile/run" class="confirm">
  <p>Run one reconcile cycle now: claim the orders that are due, poll the platform for each, apply what it answers. Safe beside the running poller (claims are leased).</p>
  <input type="hidden" name="action_id" value="${actionId}">
  <input type="hidden" name="csrf" value="${operator.csrfToken}">
  <button type="submit" class="danger">Run one cycle now</button>
</form>`
        : html`<p class="problem">Not available until the service is ready.</p>`
    }
<h2>Last runs</h2>
${runsTable(runs, longestCycleMs)}`,
  )
}

/**
 * A cycle's result as `reconcile --once` says it (text: escaped where shown): the counts, the claims given back
 * (`released`) and each poll result's count, the orders the cycle flagged trade_create_unknown, and the due orders
 * another poller's lease held. It left out the per-result counts, `released` and the flagged orders, which the
 * command prints: a cycle that flagged three orders read `claimed 0, polled 0, changed 0, errors 0`.
 */
export function cycleResult(summary: RunSummary, leased?: LeasedElsewhere): string {
  const leasedLine = leased && leasedElsewhereLine(leased, "the Reconcile page's last runs")
  const counts = Object.entries(summary.results)
    .filter(([, count]) => count > 0)
    .map(([result, count]) => `${result} ${count}`)
    .join(', ')
  const flagged = summary.flaggedCreates
  return (
    `run ${summary.runId ?? '-'}: claimed ${summary.claimed}, polled ${summary.polled}, changed ${summary.changed}, errors ${summary.errors}` +
    (summary.released ? `, released ${summary.released}` : '') +
    (counts ? ` (${counts})` : '') +
    (summary.stoppedReason ? `; stopped: ${summary.stoppedReason}` : '') +
    (summary.clockOffsetS === null ? '' : ` (${describeClockOffset(summary.clockOffsetS)})`) +
    (summary.firstFailure ? `; first error, order ${summary.firstFailure.externalReference}: ${summary.firstFailure.reason}` : '') +
    (flagged.length > 0
      ? `; flagged trade_create_unknown: ${flagged.length} order(s) whose trade create got no answer and no webhook linked a trade ` +
        `(${flagged.slice(0, 20).join(', ')}${flagged.length > 20 ? ', …' : ''}): check the platform, then \`trades open REFERENCE --retry\` or \`trades link\`` +
        ' (the orders page, flagged only, lists them)'
      : '') +
    (leasedLine ? `; ${leasedLine}` : '')
  )
}

function reactionLinks(jobs: EventReaction[]): Html {
  if (jobs.length === 0) return html`—`
  return html`${jobs.map(
    (job, index) =>
      html`${index > 0 ? ', ' : ''}${
        // handled on its first attempt: no job row, nothing to open
        job.id === null ? job.handler : html`<a href="${reactionPath(job.id)}">${job.handler}</a>`
      } <span class="outcome ${job.state}">${job.state}</span>`,
  )}`
}

const REACTION_STATES_SHOWN: readonly ReactionJobState[] = ['failed', 'pending', 'running', 'done', 'skipped']

export function reactionsPage(
  operator: Operator,
  {
    filter,
    jobs,
    waits,
    nextLink,
    failed,
  }: {
    filter: ReactionJobFilter
    jobs: ReactionJob[]
    /** What each held-back pending job waits for (jobsWaitedFor): it runs after that one, not at its due time. */
    waits: ReadonlyMap<string, JobWaitedFor>
    nextLink: string | undefined
    failed: number
  },
): Html {
  return layout(
    'Reactions',
    operator,
    html`<form method="get" action="${consolePath()}/reactions" class="filter">
  <label>State <select name="state"><option value="">any</option>${REACTION_STATES_SHOWN.map(
    (state) => html`<option value="${state}" ${filter.state === state ? 'selected' : ''}>${state}</option>`,
  )}</select></label>
  <label>Handler <input name="handler" value="${filter.handler ?? ''}"></label>
  <button type="submit">Search</button>
</form>
<p class="hint">The jobs of (status change, handler) that needed more than one look, newest first: a retry, a dead letter, an event held back, a handler that ran long, and the operator's actions. A change its handler took on the first attempt leaves no job: see <a href="${consolePath()}/reactions/first-attempts${filter.handler ? `?${new URLSearchParams({ handler: filter.handler }).toString()}` : ''}">done on the first attempt</a>, and its order's page. A failed job holds back its order's later events for its handler until it is retried or skipped.</p>
${failed > 0 ? html`<p class="actions"><a href="${consolePath()}/reactions/retry-failed">Retry every failed reaction (${failed})…</a></p>` : ''}
${
  jobs.length === 0
    ? html`<p>No reaction job matches.</p>`
    : html`<table class="reactions"><thead><tr><th>job</th><th>created (UTC)</th><th>order</th><th>event</th><th>handler</th><th>state</th><th>attempts</th><th>next run (UTC)</th><th>last error</th></tr></thead>
<tbody>${jobs.map(
        (job) => html`<tr>
  <td><a href="${reactionPath(job.id)}">${job.id}</a></td><td>${time(job.createdAt)}</td>
  <td><a href="${orderPath(job.orderId)}">${job.externalReference ?? `#${job.orderId}`}</a></td>
  <td>${job.type} <span class="hint">#${job.sequence}</span></td><td>${job.handler}</td>
  <td><span class="outcome ${job.state}">${job.state}</span></td><td class="number">${job.attempts}</td>
  <td>${
    waits.has(job.id)
      ? html`waits for ${waitedForLink(waits.get(job.id)!)} (${waits.get(job.id)!.state}), an earlier event of its order`
      : job.state === 'pending' || job.state === 'running'
        ? time(job.runAt)
        : ''
  }</td>
  <td class="error">${job.lastError === null ? '' : shortError(job.lastError)}</td>
</tr>`,
      )}</tbody></table>`
}
${nextLink ? html`<p><a rel="next" href="${nextLink}">Older →</a></p>` : ''}`,
  )
}

/** The changes their handler took on the first attempt: no job row, recorded with their stream batch. */
export function firstAttemptsPage(
  operator: Operator,
  { handler, jobs, nextLink }: { handler: string | undefined; jobs: Omit<ReactionJob, 'id'>[]; nextLink: string | undefined },
): Html {
  return layout(
    'Reactions done on the first attempt',
    operator,
    html`<form method="get" action="${consolePath()}/reactions/first-attempts" class="filter">
  <label>Handler <input name="handler" value="${handler ?? ''}"></label>
  <button type="submit">Search</button>
</form>
<p class="hint">Status changes their handler took and handled on its first call, newest first. Each is recorded with the stream batch that ran it (no job row): done, after one attempt, when the batch was written back. <a href="${consolePath()}/reactions">The jobs</a> hold everything else.</p>
${
  jobs.length === 0
    ? html`<p>None recorded${handler ? ' for this handler' : ''}.</p>`
    : html`<table class="reactions"><thead><tr><th>done (UTC)</th><th>changed (UTC)</th><th>order</th><th>event</th><th>handler</th></tr></thead>
<tbody>${jobs.map(
        (job) => html`<tr>
  <td>${time(job.finishedAt)}</td><td>${time(job.createdAt)}</td>
  <td><a href="${orderPath(job.orderId)}">${job.externalReference ?? `#${job.orderId}`}</a></td>
  <td>${job.type} <span class="hint">#${job.sequence}</span> <code>${job.eventId}</code></td><td>${job.handler}</td>
</tr>`,
      )}</tbody></table>`
}
${nextLink ? html`<p><a rel="next" href="${nextLink}">Older →</a></p>` : ''}`,
  )
}

/** An error's first line, shortened: the job's page shows it whole. */
function shortError(error: string): string {
  const line = error.split('\n', 1)[0]!
  return line.length > 120 ? `${line.slice(0, 119)}…` : line
}

const waitedForLink = (waitsFor: JobWaitedFor): Html => html`<a href="${reactionPath(waitsFor.id)}">job ${waitsFor.id}</a>`

/** `waitsFor`: the earlier job of its order and handler that this pending one is held back behind (jobsWaitedFor). */
export function reactionPage(operator: Operator, job: ReactionJob & { event: ReactionEvent }, waitsFor: JobWaitedFor | null): Html {
  const { event } = job
  const actionable = job.state === 'failed' || job.state === 'pending'
  return layout(
    `Reaction ${job.id}`,
    operator,
    html`<dl class="fields">
  <dt>Handler</dt><dd><strong>${job.handler}</strong></dd>
  <dt>State</dt><dd><span class="outcome ${job.state}">${job.state}</span> after ${job.attempts} attempt(s)${job.finishedAt ? html` · finished ${time(job.finishedAt)}` : ''}</dd>
  <dt>Runs</dt><dd>${
    waitsFor
      ? html`once ${waitedForLink(waitsFor)} (sequence ${waitsFor.sequence}, ${waitsFor.state}) is done or skipped: one order's events reach a handler in order`
      : job.state === 'pending'
        ? html`next at ${time(job.runAt)}`
      : job.state === 'running'
          ? html`now, leased until ${time(job.leaseExpiresAt)}`
          : 'no more'
  }</dd>
  <dt>Event</dt><dd><code>${event.eventId}</code> <strong>${event.type}</strong></dd>
  <dt>Order</dt><dd><a href="${orderPath(event.orderId)}">#${event.orderId} ${event.externalReference}</a>, sequence ${event.sequence}</dd>
  <dt>Trade</dt><dd>${event.tradeId || '—'}</dd>
  <dt>Move</dt><dd>${event.from ?? '(none)'} → ${event.to} by ${event.source} at ${time(event.occurredAt)}</dd>
  <dt>Enqueued</dt><dd>${time(job.createdAt)} · updated ${time(job.updatedAt)}</dd>
</dl>
${
  actionable
    ? html`<p class="actions"><a href="${reactionPath(job.id)}/retry">Retry now…</a> · <a href="${reactionPath(job.id)}/skip">Skip…</a></p>`
    : ''
}
<h2>${job.state === 'skipped' ? 'Last error, or why it was skipped' : 'Last error'}</h2>
${job.lastError === null ? html`<p>None.</p>` : html`<pre class="body error">${job.lastError}</pre>`}`,
  )
}
