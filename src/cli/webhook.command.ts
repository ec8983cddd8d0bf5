// `webhook sign` prints the headers the platform would send for a body; `webhook send` delivers it
// like a platform test delivery. Without --secret they use the service's own first webhook secret
// (in local mode, the generated one), so nothing secret has to be typed on a command line.
import { randomUUID } from 'node:crypto'
import { existsSync } from 'node:fs'
import { open } from 'node:fs/promises'
import { type Command, InvalidArgumentError } from 'commander'
import { stopOnSignals } from '../stop-signals.js'
import type { Config, RunningServiceLookup } from '../config.js'
import { findRunningService } from '../local/running-service.js'
import { printable } from '../printable.js'
import { shortened } from '../shortened.js'
import { DELIVERY_ID_RULE, isDeliveryId } from '../webhooks/delivery-id.js'
import { signWebhookBody } from '../webhooks/verify-signature.js'
import { withoutPassword } from '../without-password.js'
import { innermostReason } from './failure-reason.js'
import { nonEmpty } from './cli-arguments.js'
import { CommandFailedError, markTookEffect, printJson, setExitCode, UsageError, write, writeError } from './cli-context.js'

// a receiver's answer is a short status document; past this it is not read further
const MAX_ANSWER_BYTES = 1024 * 1024
// and a longer one (a proxy's error page) is shown to a person only so far; --json has it whole
const SHOWN_ANSWER_CHARACTERS = 2_000
// a receiver that has not answered (or ended its answer) by then is given up on
const ANSWER_TIMEOUT_MS = 10_000
/**
 * The most of --file read, in bytes (16 MiB): what a receiver with the default settings takes of bodies at once
 * (MAX_INFLIGHT_BODY_BYTES), far past its WEBHOOK_BODY_LIMIT (256 KiB), so a body over a receiver's limit can still be
 * sent to see its 413, and one configured larger still gets its deliveries. Read whole, `--file /dev/zero` grew the
 * process to 2 GB and ended it with no line.
 */
const MAX_BODY_FILE_BYTES = 16 * 1024 * 1024

interface SignOptions {
  secret?: string
  file: string
  deliveryId?: string
  json?: boolean
}

// the config (zod and all) is loaded only by the commands that run
async function loadConfig(): Promise<Config> {
  return (await import('../config.js')).loadConfig()
}

async function signedHeaders(options: SignOptions, beside: ServiceBeside): Promise<{ body: Buffer; headers: Record<string, string> }> {
  const body = await readBodyFile(options.file)
  const secret = options.secret ?? (await serviceSecret(beside))
  // raw bytes: the signature covers the exact body as it will be sent; signed by the receiver's own pair
  // of verifySignature, so `webhook send` cannot drift from what the receiver accepts
  const signature = signWebhookBody(secret, body)
  return {
    body,
    headers: {
      'Content-Type': 'application/json',
      'X-Partner-Signature': signature,
      'X-Partner-Delivery-Id': options.deliveryId ?? `dlv_cli_${randomUUID()}`,
    },
  }
}

/**
 * --file's bytes, up to MAX_BODY_FILE_BYTES: read in steps, not as a whole, so a device or a FIFO that never ends
 * (`/dev/zero`, `<(yes)`) is refused at the bound like a file that size, before anything is signed.
 */
async function readBodyFile(file: string): Promise<Buffer> {
  const cannotRead = (error: unknown) => new UsageError(`Cannot read --file ${printable(file)}: ${printable((error as Error).message)}`, 'file_unreadable')
  const handle = await open(file, 'r').catch((error: unknown) => Promise.reject(cannotRead(error)))
  try {
    const step = Buffer.allocUnsafe(64 * 1024)
    const chunks: Buffer[] = []
    let length = 0
    for (;;) {
      const { bytesRead } = await handle.read(step, 0, step.length, null).catch((error: unknown) => Promise.reject(cannotRead(error)))
      if (bytesRead === 0) return Buffer.concat(chunks, length)
      // copied: a pipe's reads may be a few bytes each, and each kept as a view would hold a whole step
      chunks.push(Buffer.from(step.subarray(0, bytesRead)))
      length += bytesRead
      // a body of exactly the bound is taken; a byte more is not
      if (length > MAX_BODY_FILE_BYTES) {
        throw new UsageError(
          `--file ${printable(file)} holds more than ${MAX_BODY_FILE_BYTES.toLocaleString('en-US')} bytes, the most a body is read to: ` +
            'nothing was signed or sent',
          'file_too_large',
        )
      }
    }
  } finally {
    await handle.close()
  }
}

export function registerWebhookCommands(webhook: Command): void {
  webhook
    .command('sign')
    .description('print the headers the platform would send with this body')
    .requiredOption('--file <path>', 'the JSON body to sign')
    .option('--secret <secret>', 'webhook secret (default: the service’s first WEBHOOK_SECRETS entry)', nonEmpty)
    .option('--delivery-id <id>', 'X-Partner-Delivery-Id to use (default: a fresh one)', deliveryIdArgument)
    .option('--json', 'print the headers as JSON')
    .action(async (options: SignOptions) => {
      const { headers } = await signedHeaders(options, await serviceBeside())
      if (options.json) printJson(headers)
      else for (const [name, value] of Object.entries(headers)) write(`${name}: ${value}\n`)
    })

  webhook
    .command('send')
    .description('POST the body, signed, to a receiver (like a platform test delivery)')
    .requiredOption('--file <path>', 'the JSON body to send')
    .option(
      '--url <url>',
      'receiver URL (default: the running service’s, from DATA_DIR/serve.json; else from HOST, PORT and WEBHOOK_PATH)',
    )
    .option('--secret <secret>', 'webhook secret (default: the service’s first WEBHOOK_SECRETS entry)', nonEmpty)
    .option('--delivery-id <id>', 'X-Partner-Delivery-Id to use (default: a fresh one)', deliveryIdArgument)
    .option('--json', 'print the answer as JSON')
    .action(async (options: SignOptions & { url?: string }) => {
      const beside = await serviceBeside()
      const url = options.url ?? (await defaultWebhookUrl(beside))
      // shortened and without its password as a refusal shows an argument, before its line feeds are escaped
      // shown as a refusal shows an argument, its controls escaped: a line feed in it started a forged line of its own
      const shownUrl = printable(shortened(withoutPassword(url), 200))
      if (!/^https?:\/\//.test(url)) throw new UsageError(`--url must be an http(s) URL, got ${shownUrl}`)
      const { body, headers } = await signedHeaders(options, beside)
      // from here a stop signal may cut a delivery under way: said so, exit 130, as whether the receiver took it is not known
      const deliveryId = headers['X-Partner-Delivery-Id']
      stopOnSignals(() => {
        writeError(
          `Stopped by a signal before the receiver's answer: delivery ${deliveryId} may or may not have been taken; ` +
            `sending it again with --delivery-id ${deliveryId} is taken as a duplicate if it was [stopped]\n`,
        )
        process.exit(130)
      })
      let response: Response
      try {
        // a redirect is not followed: followed, a 301-303 sent the signature and delivery id to the other origin as a GET,
        // and printed that origin's 200 as if delivered; a 307/308 failed with a detached-buffer error after the POST
        response = await fetch(url, { method: 'POST', headers, body, redirect: 'manual', signal: AbortSignal.timeout(ANSWER_TIMEOUT_MS) })
      } catch (error) {
        throw new CommandFailedError('not_delivered', `Could not deliver to ${shownUrl}: ${printable(withoutPassword(failureReason(error)))}`)
      }
      if (response.status >= 300 && response.status < 400) {
        await response.body?.cancel().catch(() => {})
        const location = response.headers.get('location')
        throw new CommandFailedError(
          'redirected',
          `${shownUrl} answered ${response.status}, a redirect${location === null ? '' : ` to ${printable(shortened(withoutPassword(location), 200))}`}: ` +
            'not followed (the delivery is signed for the receiver at --url, as the platform sends it); give the URL the receiver takes deliveries at',
        )
      }
      let text: string | undefined
      try {
        // loaded here: raw-body and iconv-lite were a tenth of the modules every `--help` loaded
        text = await (await import('../http/read-answer.js')).readAnswer(response, MAX_ANSWER_BYTES)
      } catch (error) {
        throw new CommandFailedError('answer_not_read', `Could not read the answer of ${shownUrl}: ${printable(failureReason(error))}`)
      }
      if (text === undefined) {
        throw new CommandFailedError(
          'answer_too_large',
          `${shownUrl} answered ${response.status} with a body larger than ${MAX_ANSWER_BYTES.toLocaleString('en-US')} ` +
            'bytes, the most this command reads; the rest was not read',
        )
      }
      // the receiver took the delivery: an output lost from here loses only the report of it
      if (response.ok) await markTookEffect({ done: 'the receiver took the delivery', see: 'see it with `deliveries show`' })
      const answer = {
        status: response.status,
        deliveryId: headers['X-Partner-Delivery-Id'],
        body: parseJson(text),
      }
      if (options.json) printJson(answer)
      // the receiver's text: its line feeds and tabs escaped too, so it cannot print a line of its own
      else write(`${response.status} ${answer.deliveryId} ${printable(shortened(text, SHOWN_ANSWER_CHARACTERS))}\n`)
      if (!response.ok) setExitCode(1)
    })
}

/**
 * This environment's DATA_DIR and mode, read without loading its configuration (read as local mode, that would
 * generate local secrets beside a service in remote mode), and the service running from that DATA_DIR, if any.
 */
interface ServiceBeside {
  lookup: RunningServiceLookup
  running: ReturnType<typeof findRunningService>
}

async function serviceBeside(): Promise<ServiceBeside> {
  const { runningServiceLookup } = await import('../config.js')
  const lookup = runningServiceLookup(process.env)
  return { lookup, running: findRunningService(lookup.dataDir) }
}

/**
 * The first of WEBHOOK_SECRETS, as the service would read it from this environment; in local mode the generated
 * one (DATA_DIR/local-secrets.json). A service running from DATA_DIR in remote mode has secrets of its own
 * environment, which no file holds: a shell without a platform configured was read as local mode, generated
 * local secrets into that service's DATA_DIR, and signed with them, to be refused 401 `invalid_signature`.
 */
async function serviceSecret({ lookup, running }: ServiceBeside): Promise<string> {
  // a service file from before the mode was written: only local mode runs a sandbox
  const runningRemote = running !== undefined && (running.mode ?? (running.sandboxUrl === undefined ? 'remote' : 'local')) === 'remote'
  if (runningRemote && lookup.mode === 'local') {
    throw new UsageError(
      `The service running from ${lookup.dataDir} (pid ${running.pid}) is in remote mode: its webhook secret is in its own ` +
        'environment, not shared with commands. Give it with --secret, or run the command with the same WEBHOOK_SECRETS ' +
        'and PARTNER_API_BASE_URL as the service.',
      'secret_required',
    )
  }
  const { localSecretsPath, readLocalSecrets } = await import('../config.js')
  // local mode's secrets are made by the first process that needs them, `npm start` or a command: made by this one, the
  // secret signed with is one no service has yet, and a receiver running from elsewhere refuses it (401)
  const secretsFile = lookup.mode === 'local' && !lookup.dataDir.startsWith('memory://') ? localSecretsPath(lookup.dataDir) : undefined
  const existed = secretsFile !== undefined && existsSync(secretsFile)
  const config = await loadConfig()
  const secret = config.webhook.secrets[0]!
  const created = secretsFile !== undefined && !existed && config.localSecretsFile === secretsFile
  // (WEBHOOK_SECRETS set with no API key pair: the file was made for the pair, and the secret signed with is the variable's)
  if (created && readLocalSecrets(config.dataDir).webhookSecret === secret) {
    writeError(
      `Note: no local secrets in DATA_DIR ${config.dataDir}: created ${secretsFile} with a new webhook secret, and signing with it. ` +
        'A service started from this DATA_DIR (`npm start`) verifies it; a receiver with other secrets (another DATA_DIR, remote mode) ' +
        'refuses it: give its secret with --secret, or the DATA_DIR of its service.\n',
    )
  }
  return secret
}

// the running service's receiver (DATA_DIR/serve.json), else where this environment says it listens
async function defaultWebhookUrl({ running }: ServiceBeside): Promise<string> {
  if (running) return running.webhookUrl
  const config = await loadConfig()
  const host = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host
  return `http://${host}:${config.port}${config.webhook.path}`
}

// why the request failed: a timeout said as such, anything else in its innermost cause's words
function failureReason(error: unknown): string {
  if (error instanceof Error && error.name === 'TimeoutError') return `timed out after ${ANSWER_TIMEOUT_MS / 1000} s`
  return innermostReason(error)
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    return text
  }
}

/** A --delivery-id the receiver would take: one it refuses (400), or that forges a header line when printed, is a bad argument. */
function deliveryIdArgument(value: string): string {
  if (!isDeliveryId(value)) throw new InvalidArgumentError(`must be ${DELIVERY_ID_RULE}, as the receiver takes it`)
  return value
}
