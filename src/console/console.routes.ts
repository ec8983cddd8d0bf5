// The operator console: server-rendered pages on the operator listener (never the public one), for the
// person on call. Reading pages are GETs; every action is a GET confirm page, then a POST that carries
// the CSRF token and a one-time action id (posting the same form twice does the action once), and is
// logged with who did it.
//
// The SQL lives with the tables (webhooks/delivery.repository.ts, orders/order.repository.ts,
// reconcile/*.repository.ts, reactions/reaction-job.repository.ts); this file only calls it. Each action
// calls the same function as its CLI command (deliveries reapply, reconcile --requeue/--once, reactions
// retry/skip), so the console and the CLI cannot disagree on what an action does.
import { type JobWaitedFor, retriedText } from '../reactions/retried-text.js'
import { createHash, randomBytes } from 'node:crypto'
import { hostname } from 'node:os'
import { finished } from 'node:stream/promises'
import express, { type Request, type RequestHandler, type Response, Router } from 'express'
import helmet from 'helmet'
import type { Kysely } from 'kysely'
import { z } from 'zod'
import type { Clock } from '../clock.js'
import { withinAnswerBound } from '../db/answer-bound.js'
import type { Database } from '../db/database.js'
import { CONNECT_TIMEOUT_MS } from '../db/database-errors.js'
import { embeddedDatabaseStopReason } from '../db/pglite-thread.js'
import { errorAnswer } from '../http/error-handler.js'
import { continuingParser, leaveBodyUnread } from '../http/expect-continue.js'
import { limitLines } from '../limit-lines.js'
import type { Logger } from '../logger.js'
import type { CONSOLE_TOKEN_VIAS, Metrics } from '../metrics/metrics.js'
import type { ObservationSettings } from '../orders/apply-observation.js'
import { countOrdersNeedingAttention, findOrderById, findOrderByExternalReference, orderHistory, searchOrders } from '../orders/order.repository.js'
import { countDueOrders, countLeasedDue, requeueOrders } from '../orders/poll-schedule.repository.js'
import { isJobId } from '../reactions/job-id.js'
import { ClockOffError, type RunSummary } from '../reconcile/poller.js'
import { listReportedRuns } from '../reconcile/reconcile-run.repository.js'
import {
  countFailedJobsByHandler,
  findJob,
  formatFirstAttemptCursor,
  jobsOfEvents,
  jobsWaitedFor,
  listFirstAttemptsDone,
  parseFirstAttemptCursor,
  REACTION_JOB_STATES,
  reactionJobStats,
  retryFailedJobs,
  retryJob,
  searchJobs,
  skipJob,
} from '../reactions/reaction-job.repository.js'
import {
  countBodiesOfDelivery,
  countDeliveriesByOutcome,
  countDeliveriesPerMinute,
  countParkedDeliveries,
  type DeliveryCursor,
  dismissParkedDeliveries,
  type DeliveryFilter,
  findDelivery,
  listDeliveriesToReapply,
  searchDeliveries,
  type StoredDelivery,
  WEBHOOK_OUTCOMES,
} from '../webhooks/delivery.repository.js'
import { type ReapplyResult, reapplyDelivery } from '../webhooks/parked-deliveries.js'
import type { EventHandlers } from '../webhooks/event-handlers.js'
import { createConsoleAuth, type Operator, reachedOverHttps, requestFromOwnOrigin, SESSION_COOKIE } from './console-auth.js'
import { html } from './console-html.js'
import { CONSOLE_CSS } from './console-styles.js'
import {
  type ActionRecord,
  bulkDryRunText,
  bulkReapplyNextLink,
  CONSOLE_PATH,
  confirmPage,
  consolePath,
  cycleResult,
  deliveriesPage,
  deliveryPage,
  deliveryPath,
  deliveryReapplyPath,
  filterFields,
  firstAttemptsPage,
  type Html,
  invalidReasonOf,
  loginPage,
  messagePage,
  orderPage,
  ordersPage,
  overviewPage,
  reactionPage,
  reactionPath,
  reactionsPage,
  reconcilePage,
  referenceShown,
  resultPage,
  withForwardedPrefix,
} from './console-views.js'
import { createLoginThrottle } from './login-throttle.js'

export { CONSOLE_PATH }

/** Most deliveries one bulk re-apply runs (oldest first); the dry run says when more match. */
export const BULK_REAPPLY_LIMIT = 1_000
const PAGE_SIZE = 50
// a console form's body at most
const FORM_LIMIT_BYTES = 16 * 1024
/** Actions remembered for the repeat check and the overview's log. */
const REMEMBERED_ACTIONS = 1_000
/**
 * How long a page waits on the database in all, at most: for connections and for its statements' answers, one deadline
 * from the page's start (answer-bound.ts). The connect timeout's 5 s, so that under a hung database a page is
 * answered 503 as soon on a connection the pool held from before the hang as on a new one (it waited out the
 * statement timeout and its grace, 15 s by default). Pages only read; an action (POST) keeps the pool's wait, as a
 * write cut short by the client may still commit.
 */
export const CONSOLE_PAGE_ANSWER_MS = CONNECT_TIMEOUT_MS

export interface ConsoleDeps {
  /** ADMIN_TOKEN. */
  token: string
  db: Kysely<Database>
  logger: Logger
  clock: Clock
  metrics?: Metrics | undefined
  /** STALE_AFTER_S and the reaction handlers, as a re-applied delivery is applied (observations.ts). */
  observation: ObservationSettings
  /** RETENTION_DAYS, named on the page of a delivery whose body was pruned. */
  bodyRetentionDays?: number | undefined
  /** Runs one reconcile cycle now; answers undefined while the service is not ready to. */
  reconcileOnce?: (() => Promise<RunSummary | undefined>) | undefined
  /** The longest a reconcile cycle runs (longestCycleMs): a run with no end past it is shown unfinished, not running. */
  longestCycleMs: number
  /** The registered reaction handlers: only their streams' unread events count as pending (undefined: every stream's). */
  reactionHandlers?: readonly string[] | undefined
  /** The seller and buyer event handlers a re-applied delivery runs again (deliveries reapply's; none when absent). */
  eventHandlers?: EventHandlers | undefined
  /**
   * This replica's name as the reconcile runs name their poller's (host:pid), shown beside the figures only this
   * process holds (the signatures matching no secret); default `${hostname()}:${process.pid}`.
   */
  replica?: string | undefined
  /** The page's deadline (default CONSOLE_PAGE_ANSWER_MS): shorter in tests that wait it out page after page. */
  pageAnswerMs?: number | undefined
}

// Kept exactly as given, never trimmed: a reference (or a trade id, a handler) may begin or end with a space, and
// ' ref-x' is another reference than 'ref-x', as the receiver and the CLI keep it. Trimmed, every search field and
// every action's hidden field and link acted on the reference without its spaces: Dismiss set aside another
// reference's deliveries, or was refused as an order's, and Requeue cleared another order's flag.
const text = z
  .string()
  .max(512)
  // Postgres text cannot hold a NUL, so no stored value has one
  .refine((value) => !value.includes('\u0000'), 'must not hold a NUL character')
  .optional()
  .transform((value) => (value === '' ? undefined : value))

/** Whether a time written YYYY-MM-DD… names a day that exists (a year written with a sign: left to the year check). */
function isExistingDay(value: string): boolean {
  const day = /^(\d{4})-(\d{2})-(\d{2})/.exec(value)
  if (!day) return true
  const [year, month, date] = [Number(day[1]), Number(day[2]), Number(day[3])]
  // setUTCFullYear, not Date.UTC, which reads years 0 to 99 as 1900 to 1999
  const utc = new Date(0)
  utc.setUTCFullYear(year, month - 1, date)
  return utc.getUTCMonth() === month - 1 && utc.getUTCDate() === date
}

// The forms a console time is written in, all UTC: a day (2026-11-23, its midnight), or a day and a time to the
// minute, second or fraction (2026-11-23T03:00, …T03:00:15, …T03:00:15.250), a space for the T if you like, a Z at
// the end or none (toISOString's form, which the console's own links carry; a year written with a sign is its form
// past 9999, refused below as outside the years). Any other text was handed to Date, which read
// '2026-12-01 10:00' in the server's time zone and '1' as 2001-01-01, a bulk re-apply's range included.
const INSTANT_FORM = /^([+-]\d{6}|\d{4})-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,9})?)?Z?)?$/
const INSTANT_FORMS = 'YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS[.fff]], UTC, such as 2026-11-23T03:00'

const instant = z
  .string()
  .max(512)
  .optional()
  .transform((raw, context) => {
    const value = raw?.trim()
    if (value === undefined || value === '') return undefined
    if (!INSTANT_FORM.test(value)) {
      context.addIssue({ code: 'custom', message: `${JSON.stringify(value)} is not a time: write ${INSTANT_FORMS}` })
      return z.NEVER
    }
    const written = value.replace(' ', 'T')
    // a day alone is read by Date as UTC already; a day and a time without a Z would be read in the server's zone
    const date = new Date(written.includes('T') && !written.endsWith('Z') ? `${written}Z` : written)
    if (Number.isNaN(date.getTime())) {
      context.addIssue({ code: 'custom', message: `${JSON.stringify(value)} is not a time: write ${INSTANT_FORMS}` })
      return z.NEVER
    }
    // Date rolls a day past its month's end over (2026-02-31 read as March 3): a range from it, a bulk re-apply's
    // too, quietly began elsewhere than typed
    if (!isExistingDay(value)) {
      context.addIssue({ code: 'custom', message: `"${value}" names a day its month does not have` })
      return z.NEVER
    }
    // the database reads no year 0 and no year written with a sign (toISOString's form past 9999 and before 1):
    // such a time came back as its refusal, a JSON invalid_payload that named no field
    const year = date.getUTCFullYear()
    if (year < 1 || year > 9999) {
      context.addIssue({ code: 'custom', message: `"${value}" is outside years 1 to 9999` })
      return z.NEVER
    }
    return date
  })

const FilterQuery = z.object({
  trade: text,
  reference: text,
  delivery: text,
  event: text,
  outcome: z
    .enum(['', ...WEBHOOK_OUTCOMES])
    .optional()
    .transform((value) => (value === '' ? undefined : value)),
  from: instant,
  to: instant,
  // the deliveries search's page: older than this row; a bulk re-apply's next run: received after this row
  after: text,
  start: text,
})

class BadInput extends Error {}

// Express's router throws a URIError with status 400 for a path parameter decodeURIComponent refuses
function isUndecodableParam(error: unknown): boolean {
  return error instanceof URIError && (error as { status?: unknown }).status === 400
}

/** The first segment of a path that is not valid percent-encoding; the whole path if none is found. */
function undecodableSegment(path: string): string {
  const decodes = (segment: string) => {
    try {
      decodeURIComponent(segment)
      return true
    } catch {
      return false
    }
  }
  return path.split('/').find((segment) => !decodes(segment)) ?? path
}

/** The delivery a /delivery?id=ID&body=SHA256 address names: each given once, as text. */
function deliveryOfQuery(query: Request['query']): { deliveryId: string; bodySha256: string } {
  const { id, body } = query
  if (typeof id !== 'string') throw new BadInput('id: one delivery id is needed')
  if (typeof body !== 'string') throw new BadInput('body: one body SHA-256 is needed')
  return { deliveryId: id, bodySha256: body }
}

// orders.id is a Postgres integer: a larger id names no row, and the database would refuse it as a parameter
// (a reaction job's id: isJobId)
const ORDER_ID_MAX = 2 ** 31 - 1

function optionalText(value: unknown): string | undefined {
  const parsed = text.safeParse(value)
  if (!parsed.success) throw new BadInput(`reference: ${parsed.error.issues.map((issue) => issue.message).join('; ')}`)
  return parsed.data
}

/** Why a reference's deliveries are not dismissed: an order has it (the CLI's order_exists). */
function dismissRefusal(reference: string): string {
  return `An order has the reference ${reference}: its deliveries are applied, not dismissed; re-apply one from its page instead.`
}

/** A cursor's time as delivery.repository.ts writes it (microseconds, UTC), naming a day that exists. */
function isCursorTime(value: unknown): value is string {
  if (typeof value !== 'string' || !/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$/.test(value)) return false
  // the database has no year 0, which Date takes (a cursor of year 0000 was refused by the database, unnamed)
  if (value.startsWith('0000')) return false
  // Date rolls Feb 31 over into March: a time that exists comes back as it went in (to the millisecond)
  const milliseconds = `${value.slice(0, 23)}Z`
  const time = Date.parse(milliseconds)
  return !Number.isNaN(time) && new Date(time).toISOString() === milliseconds
}

/** A row's place in receipt order, as encodeCursor wrote it; `name` is the field's, for the error. */
function decodeCursor(value: string, name: string): DeliveryCursor {
  try {
    const [receivedAt, deliveryId, bodySha256] = JSON.parse(Buffer.from(value, 'base64url').toString('utf8')) as unknown[]
    // exactly what encodeCursor wrote, so the database is never handed a value it refuses
    if (
      !isCursorTime(receivedAt) ||
      typeof deliveryId !== 'string' ||
      deliveryId.includes('\u0000') ||
      typeof bodySha256 !== 'string' ||
      !/^[0-9a-f]{64}$/.test(bodySha256)
    )
      throw new Error('bad cursor')
    return { receivedAt, deliveryId, bodySha256 }
  } catch {
    throw new BadInput(`${name}: not a page cursor from this console`)
  }
}

function parseFilter(source: unknown): { filter: DeliveryFilter; after: DeliveryCursor | undefined } {
  const parsed = FilterQuery.safeParse(source)
  if (!parsed.success) throw new BadInput(parsed.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; '))
  const query = parsed.data
  return {
    filter: {
      tradeId: query.trade,
      externalReference: query.reference,
      deliveryId: query.delivery,
      outcome: query.outcome,
      eventType: query.event,
      from: query.from,
      to: query.to,
      startAfter: query.start === undefined ? undefined : decodeCursor(query.start, 'start'),
    },
    after: query.after === undefined ? undefined : decodeCursor(query.after, 'after'),
  }
}

export function consoleRoutes(deps: ConsoleDeps): Router {
  const { db, logger, clock } = deps
  const replica = deps.replica ?? `${hostname()}:${process.pid}`
  const pageAnswerMs = deps.pageAnswerMs ?? CONSOLE_PAGE_ANSWER_MS
  const auth = createConsoleAuth({ token: deps.token, now: () => clock.now() })
  const throttle = createLoginThrottle({ now: () => clock.now() })
  const done = new Map<string, ActionRecord>()
  const router = Router()

  // the path a reverse proxy serves the console under (consolePath), for everything the request renders
  router.use(CONSOLE_PATH, (req, res, next) => withForwardedPrefix(req.headers['x-forwarded-prefix'], () => finished(res), next))
  router.use(
    CONSOLE_PATH,
    helmet({
      contentSecurityPolicy: {
        useDefaults: false,
        directives: {
          defaultSrc: ["'self'"],
          scriptSrc: ["'none'"],
          styleSrc: ["'self'"],
          imgSrc: ["'self'"],
          formAction: ["'self'"],
          frameAncestors: ["'none'"],
          baseUri: ["'none'"],
          objectSrc: ["'none'"],
        },
      },
      frameguard: { action: 'deny' },
      // same-origin, not no-referrer: under no-referrer Chromium posts forms with Origin: null
      referrerPolicy: { policy: 'same-origin' },
      // loopback over plain HTTP: HSTS would pin a name to https it does not serve
      strictTransportSecurity: false,
    }),
    (_req, res, next) => {
      res.setHeader('Cache-Control', 'no-store')
      next()
    },
  )

  const send = async (res: Response, page: Html, status = 200) => {
    res.status(status).type('html').send(String(await page))
  }

  const remember = (actionId: string, operator: Operator, action: string, result: string): ActionRecord => {
    const record = { at: new Date(clock.now()), operator: operator.name, action, result }
    done.set(actionId, record)
    while (done.size > REMEMBERED_ACTIONS) done.delete(done.keys().next().value!)
    logger.info({ operator: operator.name, via: operator.via, action, result }, 'console action')
    return record
  }
  const newActionId = () => randomBytes(16).toString('hex')

  // The methods each console path answers: pages GET (and HEAD), actions POST. Any other method on a path the
  // console has is answered 405 with the path's Allow (OPTIONS: 204 with it); it used to meet the CSRF check
  // and be told to reload the page (403), or find no page (404).
  const methodsOf = new Map<string, string[]>()
  const allowing = (method: string, paths: string | string[]) => {
    for (const path of [paths].flat()) methodsOf.set(path, [...(methodsOf.get(path) ?? []), ...(method === 'GET' ? ['GET', 'HEAD'] : [method])])
  }
  const pageAt = (path: string | string[], ...handlers: RequestHandler[]) => {
    allowing('GET', path)
    router.get(path, ...handlers.map((handler): RequestHandler => (req, res, next) => withinAnswerBound(pageAnswerMs, () => handler(req, res, next))))
  }
  const actionAt = (path: string | string[], ...handlers: RequestHandler[]) => {
    allowing('POST', path)
    router.post(path, ...handlers)
  }
  // after a path's own routes: what they left is another method's
  const refuseOtherMethods = (paths: readonly string[]) => {
    for (const path of paths) {
      const allow = (methodsOf.get(path) ?? []).join(', ')
      router.all(path, async (req, res) => {
        leaveBodyUnread(req, res)
        res.setHeader('Allow', allow)
        if (req.method === 'OPTIONS') return res.status(204).end()
        await send(res, messagePage('Method not allowed', res.locals.operator as Operator | undefined, `${req.method} is not a method of this page: it answers ${allow}.`), 405)
      })
    }
  }

  pageAt(`${CONSOLE_PATH}/console.css`, (_req, res) => {
    res.type('css').send(CONSOLE_CSS)
  })

  // a client that sent `Expect: 100-continue` is told to send its form here (http/expect-continue.ts)
  const form = continuingParser(express.urlencoded({ extended: false, limit: FORM_LIMIT_BYTES, parameterLimit: 50 }), FORM_LIMIT_BYTES)

  // Wrong tokens, and tokens not checked while the throttle holds (login-throttle.ts): counted by the metric, and
  // logged once a second at most, the rest counted in the next line's `suppressed` (limit-lines.ts), so a guesser
  // cannot fill the log. Real time, not the clock: the lines' interval is timed with setTimeout.
  type Via = (typeof CONSOLE_TOKEN_VIAS)[number]
  const logWrongToken = limitLines((fields: { via: Via; path: string }) => logger.warn(fields, 'console login refused: wrong token'))
  const logThrottled = limitLines((fields: { via: Via; path: string; retryAfterS: number }) =>
    logger.warn(fields, 'console login refused: too many wrong tokens'),
  )
  const wrongToken = (req: Request, via: Via) => {
    throttle.wrongToken()
    deps.metrics?.consoleAuthRefused.inc({ via, reason: 'wrong_token' })
    logWrongToken({ via, path: req.path })
  }
  /** While the throttle holds, answers 429 (from the headers alone, its body unread, unless `bodyRead`) and returns true. */
  const throttled = async (req: Request, res: Response, via: Via, { bodyRead = false } = {}): Promise<boolean> => {
    const waitMs = throttle.waitMs()
    if (waitMs === 0) return false
    const retryAfterS = Math.ceil(waitMs / 1_000)
    deps.metrics?.consoleAuthRefused.inc({ via, reason: 'throttled' })
    logThrottled({ via, path: req.path, retryAfterS })
    if (!bodyRead) leaveBodyUnread(req, res)
    res.setHeader('Retry-After', String(retryAfterS))
    const problem = `Too many wrong tokens: no token, the right one included, is checked for ${retryAfterS} s more; try again then (too_many_attempts).`
    await send(res, loginPage(problem), 429)
    return true
  }

  pageAt(`${CONSOLE_PATH}/login`, async (_req, res) => send(res, loginPage()))
  // the throttle before the form: a token typed while it holds is not even read
  const unlessThrottled: RequestHandler = async (req, res, next) => {
    if (!(await throttled(req, res, 'login_page'))) next()
  }
  actionAt(`${CONSOLE_PATH}/login`, unlessThrottled, form, async (req, res) => {
    if (!requestFromOwnOrigin(req)) return send(res, messagePage('Refused', undefined, 'This form was posted from another site.'), 403)
    // and again once the form is here, with nothing awaited between this look and the token's check: logins
    // whose forms came after all their headers were each let through by the look before the form, 200 of
    // them checked in a second where 10 a minute are
    if (throttle.waitMs() > 0) {
      await throttled(req, res, 'login_page', { bodyRead: true })
      return
    }
    const body = (req.body ?? {}) as Record<string, unknown>
    // a form sent with no token guessed nothing: told so, and not counted against the throttle
    if (typeof body.token !== 'string' || body.token === '') return send(res, loginPage('Type the token.'), 400)
    const sessionId = auth.login(body.token, typeof body.name === 'string' ? body.name : '')
    if (!sessionId) {
      wrongToken(req, 'login_page')
      return send(res, loginPage('Wrong token.'), 401)
    }
    res.cookie(SESSION_COOKIE, sessionId, { httpOnly: true, sameSite: 'strict', path: consolePath(), secure: reachedOverHttps(req) })
    res.redirect(303, `${consolePath()}/`)
  })
  refuseOtherMethods([`${CONSOLE_PATH}/login`])

  const operatorOf = (res: Response) => res.locals.operator as Operator

  // Everything below needs the token, which is in the headers: a request without it is refused before its
  // form is read, and a client waiting for `100 Continue` is not told to send it. Only then is a POST's form
  // read, for its CSRF token (checked with our own origin).
  router.use(
    CONSOLE_PATH,
    async (req, res, next) => {
      // A live session settles it, whatever Authorization header came with it: a proxy in front (nginx auth_basic,
      // oauth2-proxy's --set-authorization-header, a ForwardAuth) adds its own to every request, which was taken
      // for a wrong token and the cookie ignored: every page a 401, each counted, and after ten the throttle
      // refused everyone's token logins for a minute.
      const session = auth.fromSession(req)
      if (session) {
        res.locals.operator = session
        return next()
      }
      // without one, a token in the header is a try the throttle counts; a session cookie is not (its id is not guessed)
      const triesToken = req.headers.authorization !== undefined
      if (triesToken && (await throttled(req, res, 'authorization'))) return
      const operator = auth.fromAuthorization(req)
      if (!operator) {
        if (triesToken) wrongToken(req, 'authorization')
        leaveBodyUnread(req, res)
        res.setHeader('WWW-Authenticate', 'Bearer realm="partner-escrow console"')
        return send(res, loginPage(), 401)
      }
      res.locals.operator = operator
      next()
    },
    form,
    async (req, res, next) => {
      // (no route takes another method's request: it is answered 405 or 404)
      if (req.method === 'POST') {
        const operator = operatorOf(res)
        const csrf = (req.body as Record<string, unknown> | undefined)?.csrf
        if (!requestFromOwnOrigin(req) || !auth.csrfTokenMatches(operator, csrf)) {
          logger.warn({ operator: operator.name, path: req.path }, 'console action refused: CSRF check failed')
          return send(res, messagePage('Refused', operator, 'This action lacks a valid form token (CSRF); reload the page and try again.'), 403)
        }
      }
      next()
    },
  )
  const bodyOf = (req: Request) => (req.body ?? {}) as Record<string, unknown>
  const actionIdOf = (req: Request) => {
    const id = bodyOf(req).action_id
    if (typeof id !== 'string' || !/^[0-9a-f]{32}$/.test(id)) throw new BadInput('action_id: missing; start the action from its confirm page')
    // an id is its action's and its target's: posted to another, it is another action, carried out, not answered with
    // the record of the one it was made for. The target is in the path, the query (/delivery/reapply?id=…) or the form
    // (a requeue's reference, a bulk re-apply's range), so all three make the key; the form's csrf and the id itself
    // do not. Only the path made it: the same id on another delivery's query, another reference or another range was
    // answered "already carried out", and that one was never acted on.
    const form = Object.entries(bodyOf(req))
      .filter(([name]) => name !== 'csrf' && name !== 'action_id')
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    const target = createHash('sha256').update(JSON.stringify([req.originalUrl, form])).digest('hex')
    return `${req.path} ${target} ${id}`
  }
  /**
   * The operator and the action's id, for an action not carried out yet; undefined once the first result is shown
   * again (the same confirm page's form posted twice: a reload, a double click, a retry after a lost answer).
   */
  const firstPost = async (req: Request, res: Response, title: string) => {
    const operator = operatorOf(res)
    const actionId = actionIdOf(req)
    const previous = done.get(actionId)
    if (previous === undefined) return { operator, actionId }
    await send(res, resultPage(operator, title, previous, true))
    return undefined
  }
  // A repeat of an action id finds the first post's record in `done`; one that comes while the first is
  // still being carried out (a double click: the browser drops the first answer, not its work) waits for it.
  const underWay = new Map<string, Promise<void>>()
  const oneAtATime = (action: (req: Request, res: Response) => Promise<unknown>) => async (req: Request, res: Response) => {
    const actionId = actionIdOf(req)
    while (underWay.has(actionId)) await underWay.get(actionId)
    const running = action(req, res).finally(() => underWay.delete(actionId))
    underWay.set(actionId, running.then(() => undefined, () => undefined))
    await running
  }

  actionAt(`${CONSOLE_PATH}/logout`, (req, res) => {
    const operator = operatorOf(res)
    if (operator.sessionId) auth.logout(operator.sessionId)
    res.clearCookie(SESSION_COOKIE, { path: consolePath() })
    res.redirect(303, `${consolePath()}/login`)
  })

  pageAt(`${CONSOLE_PATH}/`, async (_req, res) => {
    const now = new Date(clock.now())
    const since = new Date(now.getTime() - 60 * 60 * 1000)
    const [perMinute, due, parked, attention, reactions, failedByHandler, runs] = await Promise.all([
      countDeliveriesPerMinute(db, since),
      countDueOrders(db, now, deps.observation.partnerEnv),
      countParkedDeliveries(db, now),
      countOrdersNeedingAttention(db),
      reactionJobStats(db, now, deps.reactionHandlers),
      countFailedJobsByHandler(db),
      listReportedRuns(db, { limit: 10, longestCycleMs: deps.longestCycleMs }),
    ])
    // by kind: a mismatch is a signature made with a secret we do not hold (the platform's new one, or an
    // imitation), worth a human; a missing or malformed one is anyone's request to the public URL, and put the
    // item up for good with one unsigned POST, pointing at WEBHOOK_SECRETS for what no secret can fix
    // this process's counter, in memory: behind a load balancer each replica counts the requests it got, and the
    // page says whose they are and where the sum across replicas is (the metric, the alert)
    const signatureFailures = deps.metrics
      ? {
          ...(await deps.metrics.signatureFailures.get()).values.reduce(
            (sum, { labels, value }) =>
              labels.signature === 'mismatch' ? { ...sum, mismatch: sum.mismatch + value } : { ...sum, unsigned: sum.unsigned + value },
            { mismatch: 0, unsigned: 0 },
          ),
          replica,
          since: deps.metrics.startedAt,
        }
      : undefined
    await send(
      res,
      overviewPage(operatorOf(res), {
        perMinute,
        since,
        signatureFailures,
        ...due,
        ...parked,
        attention,
        reactions,
        failedByHandler,
        runs,
        longestCycleMs: deps.longestCycleMs,
        actions: [...done.values()].reverse().slice(0, 20),
      }),
    )
  })

  pageAt(`${CONSOLE_PATH}/deliveries`, async (req, res) => {
    const { filter, after } = parseFilter(req.query)
    const page = await searchDeliveries(db, filter, { after, limit: PAGE_SIZE })
    await send(res, deliveriesPage(operatorOf(res), { filter, ...page }))
  })

  pageAt(`${CONSOLE_PATH}/deliveries/reapply`, async (req, res) => {
    const { filter } = parseFilter(req.query)
    if (!filter.from && !filter.to) throw new BadInput('a bulk re-apply needs a time range: give "from", "to" or both')
    const counts = await countDeliveriesByOutcome(db, filter)
    await send(
      res,
      confirmPage(operatorOf(res), {
        title: 'Bulk re-apply',
        question: bulkDryRunText(counts, BULK_REAPPLY_LIMIT, filter.startAfter),
        action: `${consolePath()}/deliveries/reapply`,
        fields: filterFields(filter),
        actionId: newActionId(),
        button: 'Re-apply them',
      }),
    )
  })
  actionAt(`${CONSOLE_PATH}/deliveries/reapply`, oneAtATime(async (req, res) => {
    // a form without a range never made a record: the same form posted again is refused the same
    const posted = await firstPost(req, res, 'Bulk re-apply')
    if (posted === undefined) return
    const { operator, actionId } = posted
    const { filter } = parseFilter(bodyOf(req))
    if (!filter.from && !filter.to) throw new BadInput('a bulk re-apply needs a time range: give "from", "to" or both')
    const { deliveries, next } = await listDeliveriesToReapply(db, filter, BULK_REAPPLY_LIMIT)
    const tally = new Map<string, number>()
    const now = new Date(clock.now())
    for (const delivery of deliveries) {
      const result = await reapplyDelivery(db, delivery, deps.observation, now)
      const key = result.kind === 'reapplied' ? result.outcome : result.kind === 'invalid' ? 'stored as invalid, nothing applied' : 'not a trade event'
      tally.set(key, (tally.get(key) ?? 0) + 1)
    }
    const summary = [...tally].map(([outcome, count]) => `${outcome} ${count}`).join(', ')
    const record = remember(
      actionId,
      operator,
      `bulk re-apply (${filterFields(filter).map(([name, value]) => `${name}=${value}`).join(' ')})`,
      `${deliveries.length} deliveries re-applied${summary ? `: ${summary}` : ''}`,
    )
    // the next run starts after the last row of this one: each run the oldest 1,000 again never reached the rest
    await send(res, resultPage(operator, 'Bulk re-apply', record, false, bulkReapplyNextLink(filter, next)))
  }))

  // Setting aside the deliveries parked for a reference that is not this backend's (`deliveries dismiss`): the
  // overview's advice named the CLI command alone, so an operator with the console only had no way to clear them.
  const requiredReference = (value: unknown) => {
    const reference = optionalText(value)
    if (reference === undefined || reference === '') throw new BadInput('reference: give the external reference whose parked deliveries to dismiss')
    return reference
  }
  const DISMISS_PATH = `${CONSOLE_PATH}/deliveries/dismiss`
  pageAt(DISMISS_PATH, async (req, res) => {
    const operator = operatorOf(res)
    const reference = requiredReference(req.query.reference)
    const counted = await dismissParkedDeliveries(db, reference, { dryRun: true })
    if ('orderExists' in counted) return send(res, messagePage('Not dismissed', operator, dismissRefusal(reference)), 409)
    if (counted.dismissed === 0) return send(res, messagePage('Not found', operator, `No delivery is parked for ${reference}.`), 404)
    await send(
      res,
      confirmPage(operator, {
        title: 'Dismiss parked deliveries',
        question: html`Set aside the <strong>${counted.dismissed}</strong> parked deliveries of ${referenceShown(reference)}? An order
          created later for this reference will not take them, and they leave the parked count and its alert.`,
        action: `${consolePath()}/deliveries/dismiss`,
        fields: [['reference', reference]],
        actionId: newActionId(),
        button: 'Dismiss',
      }),
    )
  })
  actionAt(DISMISS_PATH, oneAtATime(async (req, res) => {
    const posted = await firstPost(req, res, 'Dismiss parked deliveries')
    if (posted === undefined) return
    const { operator, actionId } = posted
    const reference = requiredReference(bodyOf(req).reference)
    const result = await dismissParkedDeliveries(db, reference, { dryRun: false })
    // an order made for the reference since the confirm page: its deliveries are applied, not dismissed
    if ('orderExists' in result) return send(res, messagePage('Not dismissed', operator, dismissRefusal(reference)), 409)
    const record = remember(actionId, operator, `dismiss the parked deliveries of ${reference}`, `${result.dismissed} dismissed`)
    await send(res, resultPage(operator, 'Dismiss parked deliveries', record, false))
  }))

  // a delivery's address: /delivery?id=ID&body=SHA256 (every link: an id may be a dot segment, see deliveryPath),
  // or the path /deliveries/ID/SHA256 of before
  const DELIVERY_PATHS = [`${CONSOLE_PATH}/delivery`, `${CONSOLE_PATH}/deliveries/:deliveryId/:bodySha256`]
  const REAPPLY_PATHS = DELIVERY_PATHS.map((address) => `${address}/reapply`)
  const loadDelivery = async (req: Request) => {
    const { deliveryId, bodySha256 } =
      req.params.deliveryId === undefined ? deliveryOfQuery(req.query) : (req.params as { deliveryId: string; bodySha256: string })
    if (!/^[0-9a-f]{64}$/.test(bodySha256) || deliveryId.includes('\u0000')) return undefined
    return findDelivery(db, deliveryId, bodySha256)
  }

  pageAt(DELIVERY_PATHS, async (req, res) => {
    const delivery = await loadDelivery(req)
    if (!delivery) return send(res, messagePage('Not found', operatorOf(res), 'No such delivery.'), 404)
    const [order, bodies] = await Promise.all([
      delivery.orderId !== null
        ? findOrderById(db, delivery.orderId)
        : delivery.externalReference !== null
          ? findOrderByExternalReference(db, delivery.externalReference)
          : undefined,
      countBodiesOfDelivery(db, delivery.deliveryId),
    ])
    await send(res, deliveryPage(operatorOf(res), { delivery, order, bodies, bodyRetentionDays: deps.bodyRetentionDays }))
  })

  pageAt(REAPPLY_PATHS, async (req, res) => {
    const delivery = await loadDelivery(req)
    if (!delivery) return send(res, messagePage('Not found', operatorOf(res), 'No such delivery.'), 404)
    await send(
      res,
      confirmPage(operatorOf(res), {
        title: 'Re-apply a delivery',
        question: html`Re-apply delivery <code>${delivery.deliveryId}</code> (${delivery.eventType}, outcome now ${delivery.outcome})
          to the order of <code>${delivery.externalReference ?? '—'}</code>? A status the order already has changes nothing.`,
        action: deliveryReapplyPath(delivery),
        fields: [],
        actionId: newActionId(),
        button: 'Re-apply',
      }),
    )
  })
  actionAt(REAPPLY_PATHS, oneAtATime(async (req, res) => {
    const posted = await firstPost(req, res, 'Re-apply a delivery')
    if (posted === undefined) return
    const { operator, actionId } = posted
    const delivery = await loadDelivery(req)
    if (!delivery) return send(res, messagePage('Not found', operator, 'No such delivery.'), 404)
    const events = deps.eventHandlers ? { handlers: deps.eventHandlers, logger: deps.logger } : undefined
    const result = await reapplyDelivery(db, delivery, deps.observation, new Date(clock.now()), events)
    const record = remember(actionId, operator, `re-apply delivery ${delivery.deliveryId}`, reapplied(delivery, result))
    await send(res, resultPage(operator, 'Re-apply a delivery', record, false, html`<p><a href="${deliveryPath(delivery)}">Back to the delivery</a></p>`))
  }))

  const OrdersQuery = z.object({
    reference: text,
    trade: text,
    status: text,
    attention: text,
    before: z.coerce.number().int().positive().max(ORDER_ID_MAX).optional(),
  })
  pageAt(`${CONSOLE_PATH}/orders`, async (req, res) => {
    const parsed = OrdersQuery.safeParse(req.query)
    if (!parsed.success) throw new BadInput(parsed.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; '))
    const query = parsed.data
    const filter = { reference: query.reference, trade: query.trade, status: query.status, attention: query.attention === '1' }
    const { orders, nextBeforeId } = await searchOrders(
      db,
      { externalReference: filter.reference, tradeId: filter.trade, status: filter.status, needsAttention: filter.attention },
      { beforeId: query.before, limit: PAGE_SIZE },
    )
    const nextFields: [string, string][] = Object.entries(query).flatMap(([name, value]) =>
      name === 'before' || value === undefined ? [] : [[name, String(value)] as [string, string]],
    )
    const nextLink =
      nextBeforeId === undefined
        ? undefined
        : `${consolePath()}/orders?${new URLSearchParams([...nextFields, ['before', String(nextBeforeId)]]).toString()}`
    await send(res, ordersPage(operatorOf(res), { orders, nextLink, filter }))
  })

  pageAt(`${CONSOLE_PATH}/orders/requeue`, async (req, res) => {
    const reference = optionalText(req.query.reference)
    const operator = operatorOf(res)
    const flagged = reference ? undefined : (await countOrdersNeedingAttention(db)).reduce((sum, row) => sum + row.orders, 0)
    await send(
      res,
      confirmPage(operator, {
        title: 'Requeue flagged orders',
        question: reference
          ? html`Clear the flag of order ${referenceShown(reference)} and make it due for a poll now?`
          : html`Clear the flag of every flagged order (<strong>${flagged}</strong> now) and make them due for a poll now?`,
        action: `${consolePath()}/orders/requeue`,
        fields: reference ? [['reference', reference]] : [],
        actionId: newActionId(),
        button: 'Requeue',
      }),
    )
  })
  actionAt(`${CONSOLE_PATH}/orders/requeue`, oneAtATime(async (req, res) => {
    const posted = await firstPost(req, res, 'Requeue flagged orders')
    if (posted === undefined) return
    const { operator, actionId } = posted
    const reference = optionalText(bodyOf(req).reference)
    const results = await requeueOrders(db, { ...(reference ? { externalReferences: [reference] } : {}), now: new Date(clock.now()) })
    const requeued = results.filter((result) => result.outcome === 'requeued').length
    const record = remember(
      actionId,
      operator,
      reference ? `requeue order ${reference}` : 'requeue every flagged order',
      `${requeued} due now, ${results.length - requeued} cleared but not pollable${reference && results.length === 0 ? ' (no such order)' : ''}`,
    )
    await send(res, resultPage(operator, 'Requeue flagged orders', record, false))
  }))

  pageAt(`${CONSOLE_PATH}/orders/:id`, async (req, res) => {
    const id = Number(req.params.id)
    const order = Number.isSafeInteger(id) && id > 0 && id <= ORDER_ID_MAX ? await findOrderById(db, id) : undefined
    if (!order) return send(res, messagePage('Not found', operatorOf(res), 'No such order.'), 404)
    const [history, deliveries] = await Promise.all([
      orderHistory(db, order.id),
      searchDeliveries(db, { externalReference: order.externalReference }, { limit: PAGE_SIZE }),
    ])
    const reactions = await jobsOfEvents(
      db,
      history.map((change) => change.eventId),
    )
    await send(
      res,
      orderPage(operatorOf(res), {
        order,
        history,
        reactions,
        deliveries: deliveries.deliveries,
        olderDeliveries: deliveries.next,
        partnerEnv: deps.observation.partnerEnv ?? 'sandbox',
      }),
    )
  })

  // --- reactions: the jobs, and the operator's way out of the dead letter (the `reactions` CLI's functions) ---

  const ReactionsQuery = z.object({
    state: z
      .enum(['', ...REACTION_JOB_STATES])
      .optional()
      .transform((value) => (value === '' ? undefined : value)),
    handler: text,
    before: z.string().refine(isJobId, 'not a page cursor from this console').optional(),
  })
  pageAt(`${CONSOLE_PATH}/reactions`, async (req, res) => {
    const parsed = ReactionsQuery.safeParse(req.query)
    if (!parsed.success) throw new BadInput(parsed.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; '))
    const { state, handler, before } = parsed.data
    const filter = { state, handler }
    const [{ jobs, nextBeforeId }, stats] = await Promise.all([
      searchJobs(db, filter, { beforeId: before, limit: PAGE_SIZE }),
      reactionJobStats(db, new Date(clock.now()), deps.reactionHandlers),
    ])
    const fields: [string, string][] = [
      ...(state ? [['state', state] as [string, string]] : []),
      ...(handler ? [['handler', handler] as [string, string]] : []),
    ]
    const nextLink =
      nextBeforeId === undefined ? undefined : `${consolePath()}/reactions?${new URLSearchParams([...fields, ['before', nextBeforeId]]).toString()}`
    const waits = await jobsWaitedFor(db, jobs.flatMap((job) => (job.state === 'pending' ? [job.id] : [])))
    await send(res, reactionsPage(operatorOf(res), { filter, jobs, waits, nextLink, failed: stats.failed }))
  })

  const FirstAttemptsQuery = z.object({
    handler: text,
    before: z
      .string()
      .optional()
      .transform((value, context) => {
        if (value === undefined) return undefined
        const cursor = parseFirstAttemptCursor(value)
        if (!cursor) context.addIssue({ code: 'custom', message: 'not a page cursor from this console' })
        return cursor
      }),
  })
  pageAt(`${CONSOLE_PATH}/reactions/first-attempts`, async (req, res) => {
    const parsed = FirstAttemptsQuery.safeParse(req.query)
    if (!parsed.success) throw new BadInput(parsed.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; '))
    const { handler, before } = parsed.data
    const page = await listFirstAttemptsDone(db, { handler, before, limit: PAGE_SIZE + 1 })
    const jobs = page.slice(0, PAGE_SIZE)
    const next = page.length > PAGE_SIZE ? jobs.at(-1)!.cursor : undefined
    const fields: [string, string][] = handler ? [['handler', handler]] : []
    const nextLink =
      next === undefined
        ? undefined
        : `${consolePath()}/reactions/first-attempts?${new URLSearchParams([...fields, ['before', formatFirstAttemptCursor(next)]]).toString()}`
    await send(res, firstAttemptsPage(operatorOf(res), { handler, jobs, nextLink }))
  })

  pageAt(`${CONSOLE_PATH}/reactions/retry-failed`, async (_req, res) => {
    const operator = operatorOf(res)
    const failed = (await reactionJobStats(db, new Date(clock.now()), deps.reactionHandlers)).failed
    await send(
      res,
      confirmPage(operator, {
        title: 'Retry every failed reaction',
        question: html`Run every failed reaction job (<strong>${failed}</strong> now) again now, their attempts counted afresh?
          Do it once the cause is fixed: a handler that still fails comes back failed after its attempts.`,
        action: `${consolePath()}/reactions/retry-failed`,
        fields: [],
        actionId: newActionId(),
        button: 'Retry them',
      }),
    )
  })
  actionAt(`${CONSOLE_PATH}/reactions/retry-failed`, oneAtATime(async (req, res) => {
    const posted = await firstPost(req, res, 'Retry every failed reaction')
    if (posted === undefined) return
    const { operator, actionId } = posted
    const ids = await retryFailedJobs(db, new Date(clock.now()))
    const record = remember(
      actionId,
      operator,
      'retry every failed reaction',
      ids.length === 0 ? 'no failed reaction jobs' : `${ids.length} job(s) run again now: ${ids.slice(0, 20).join(', ')}${ids.length > 20 ? ', …' : ''}`,
    )
    await send(res, resultPage(operator, 'Retry every failed reaction', record, false, html`<p><a href="${consolePath()}/reactions?state=pending">The pending reactions</a></p>`))
  }))

  const jobIdOf = (req: Request): string | undefined => {
    const { id } = req.params as { id: string }
    return isJobId(id) ? id : undefined
  }

  pageAt(`${CONSOLE_PATH}/reactions/:id`, async (req, res) => {
    const id = jobIdOf(req)
    const job = id === undefined ? undefined : await findJob(db, id)
    if (!job) return send(res, messagePage('Not found', operatorOf(res), 'No such reaction job.'), 404)
    const waitsFor = (await jobsWaitedFor(db, job.state === 'pending' ? [job.id] : [])).get(job.id) ?? null
    await send(res, reactionPage(operatorOf(res), job, waitsFor))
  })

  const REACTION_ACTIONS = {
    retry: {
      title: 'Retry a reaction',
      question: 'run it again now, its attempts counted afresh',
      button: 'Retry now',
      run: retryJob,
      done: 'retried',
    },
    skip: {
      title: 'Skip a reaction',
      question: "give up on it: it is never run again, and its order's later events for its handler go ahead",
      button: 'Skip it',
      run: skipJob,
      done: 'skipped',
    },
  } as const
  for (const [verb, action] of Object.entries(REACTION_ACTIONS)) {
    pageAt(`${CONSOLE_PATH}/reactions/:id/${verb}`, async (req, res) => {
      const operator = operatorOf(res)
      const id = jobIdOf(req)
      const job = id === undefined ? undefined : await findJob(db, id)
      if (!job) return send(res, messagePage('Not found', operator, 'No such reaction job.'), 404)
      if (job.state !== 'failed' && job.state !== 'pending') {
        return send(res, messagePage(action.title, operator, `Job ${job.id} is ${job.state}: only a failed or pending job can be ${action.done}.`), 409)
      }
      await send(
        res,
        confirmPage(operator, {
          title: action.title,
          question: html`Reaction job <code>${job.id}</code>: <strong>${job.handler}</strong> for ${job.type} of order
            <code>${job.externalReference ?? `#${job.orderId}`}</code>, now ${job.state} after ${job.attempts} attempt(s). ${action.question}?`,
          action: `${reactionPath(job.id)}/${verb}`,
          fields: [],
          actionId: newActionId(),
          button: action.button,
        }),
      )
    })
    actionAt(`${CONSOLE_PATH}/reactions/:id/${verb}`, oneAtATime(async (req, res) => {
      const posted = await firstPost(req, res, action.title)
      if (posted === undefined) return
      const { operator, actionId } = posted
      const id = jobIdOf(req)
      if (id === undefined) return send(res, messagePage('Not found', operator, 'No such reaction job.'), 404)
      const outcome = await action.run(db, id, new Date(clock.now()))
      // only what was done is remembered (a repeat of the same form shows it) and listed as done; a refusal is
      // answered as it stands each time, the repeat of a 404 a 404 (it was a 200 showing the refusal, listed
      // under "Console actions since start" as if it had been done)
      const record =
        outcome.result === action.done
          ? remember(
              actionId,
              operator,
              `${verb} reaction ${id}`,
              verb === 'retry' ? retriedText(id, (outcome as { waitsBehind?: JobWaitedFor }).waitsBehind) : `job ${id} skipped`,
            )
          : {
              at: new Date(clock.now()),
              operator: operator.name,
              action: `${verb} reaction ${id}`,
              result:
                outcome.result === 'not_found'
                  ? `no reaction job ${id}`
                  : `job ${id} is ${outcome.state}: only a failed or pending job can be ${action.done}`,
            }
      await send(
        res,
        resultPage(operator, action.title, record, false, html`<p><a href="${reactionPath(id)}">Back to the job</a></p>`),
        outcome.result === action.done ? 200 : outcome.result === 'not_found' ? 404 : 409,
      )
    }))
  }

  pageAt(`${CONSOLE_PATH}/reconcile`, async (_req, res) => {
    const runs = await listReportedRuns(db, { limit: 20, longestCycleMs: deps.longestCycleMs })
    await send(
      res,
      reconcilePage(operatorOf(res), { runs, longestCycleMs: deps.longestCycleMs, actionId: newActionId(), available: deps.reconcileOnce !== undefined }),
    )
  })
  actionAt(`${CONSOLE_PATH}/reconcile/run`, oneAtATime(async (req, res) => {
    const posted = await firstPost(req, res, 'Reconcile')
    if (posted === undefined) return
    const { operator, actionId } = posted
    // the due orders the claim will leave to another poller's lease, counted before it as reconcile --once counts them
    const leased = deps.reconcileOnce ? await countLeasedDue(db, new Date(clock.now()), deps.observation.partnerEnv) : undefined
    let summary: RunSummary | undefined
    try {
      summary = await deps.reconcileOnce?.()
    } catch (error) {
      // this machine's clock far from the database's: no claim is made by it (db/clock-guard.ts)
      if (error instanceof ClockOffError) return send(res, messagePage('Reconcile', operator, error.message), 503)
      throw error
    }
    if (!summary) return send(res, messagePage('Reconcile', operator, 'Not available until the service is ready; try again shortly.'), 503)
    const record = remember(actionId, operator, 'run one reconcile cycle', cycleResult(summary, leased))
    await send(res, resultPage(operator, 'Reconcile', record, false, html`<p><a href="${consolePath()}/reconcile">Back to the runs</a></p>`))
  }))

  refuseOtherMethods([...methodsOf.keys()].filter((path) => path !== `${CONSOLE_PATH}/login`))

  router.use(CONSOLE_PATH, async (req, res) => {
    await send(res, messagePage('Not found', operatorOf(res), `No console page at ${req.path}.`), 404)
  })

  router.use(CONSOLE_PATH, async (error: unknown, req: Request, res: Response, next: (error: unknown) => void) => {
    const operator = res.locals.operator as Operator | undefined
    // the router could not decode a path parameter (/orders/%E0%A4%A): its own answer was the JSON error shape
    if (isUndecodableParam(error)) {
      return send(res, messagePage('Bad request', operator, `Not a valid percent-encoding in the address: ${undecodableSegment(req.path)}`), 400)
    }
    if (error instanceof BadInput) return send(res, messagePage('Bad request', operator, error.message), 400)
    if (res.headersSent) return next(error)
    // the database gone while a page was read or an action run: a page the operator can read, saying to try again,
    // not the JSON error shape (a 4xx of the body parsers keeps that shape, as the README says)
    const { status, body, headers } = errorAnswer(error, logger, req.path)
    if (headers) res.set(headers)
    if (status < 500) return res.status(status).json(body)
    // the embedded database's thread stopped for good (a crash, a full disk): waiting will not bring it back
    const stopped = embeddedDatabaseStopReason(error)
    if (stopped) {
      return send(res, messagePage('The database stopped', operator, `The embedded database stopped (its thread ${stopped}); restart the service (${body.error.code}).`), status)
    }
    if (status === 503 && !headers?.['Retry-After']) res.setHeader('Retry-After', '5')
    await send(res, messagePage(status === 503 ? 'Try again shortly' : 'Internal error', operator, `${body.error.message} (${body.error.code}).`), status)
  })

  return router
}

/** What re-applying one delivery did, as its action's record says it. */
function reapplied(delivery: StoredDelivery, result: ReapplyResult): string {
  switch (result.kind) {
    case 'reapplied':
      return `${result.outcome}${result.toStatus ? ` (order status ${result.toStatus})` : ''}`
    case 'invalid':
      return `nothing to re-apply: it was stored as invalid (${invalidReasonOf(delivery)}), and nothing of an invalid payload is applied`
    case 'not_a_trade_event':
      return `nothing to re-apply: a ${result.eventType} event, which no event handler takes`
    case 'handlers_run':
      return `${result.outcome} (the ${result.eventType} event's ${result.handlers === 1 ? 'handler' : `${result.handlers} handlers`} ran again)`
    case 'handler_failed':
      return `the ${result.eventType} handler failed again (its error is in the service's log): the delivery stays stored as ${delivery.outcome}`
    case 'body_pruned':
      return `nothing to re-apply: its body was pruned, and the ${result.eventType} handlers have nothing to run on`
  }
}
