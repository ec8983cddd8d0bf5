// `webhook sign` prints the headers the platform would send for a body; `webhook send` delivers it
// like a platform test delivery. Without --secret they use the service's own first webhook secret
// (in local mode, the generated one), so nothing secret has to be typed on a command line.
import { randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
import type { Command } from 'commander'
import type { Config } from '../config.js'
import { readAnswer } from '../http/read-answer.js'
import { findRunningService } from '../local/running-service.js'
import { shortened } from '../shortened.js'
import { signWebhookBody } from '../webhooks/verify-signature.js'
import { printJson, setExitCode, UsageError, write, writeError } from './cli-context.js'

// a receiver's answer is a short status document; past this it is not read further
const MAX_ANSWER_BYTES = 1024 * 1024
// and a longer one (a proxy's error page) is shown to a person only so far; --json has it whole
const SHOWN_ANSWER_CHARACTERS = 2_000

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

async function signedHeaders(options: SignOptions): Promise<{ body: Buffer; headers: Record<string, string> }> {
  let body: Buffer
  try {
    body = readFileSync(options.file)
  } catch (error) {
    throw new UsageError(`Cannot read --file ${options.file}: ${(error as Error).message}`)
  }
  const secret = options.secret ?? (await loadConfig()).webhook.secrets[0]!
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

export function registerWebhookCommands(program: Command): void {
  const webhook = program.command('webhook').description('sign or send a webhook body as the platform would')

  webhook
    .command('sign')
    .description('print the headers the platform would send with this body')
    .requiredOption('--file <path>', 'the JSON body to sign')
    .option('--secret <secret>', 'webhook secret (default: the service’s first WEBHOOK_SECRETS entry)')
    .option('--delivery-id <id>', 'X-Partner-Delivery-Id to use (default: a fresh one)')
    .option('--json', 'print the headers as JSON')
    .action(async (options: SignOptions) => {
      const { headers } = await signedHeaders(options)
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
    .option('--secret <secret>', 'webhook secret (default: the service’s first WEBHOOK_SECRETS entry)')
    .option('--delivery-id <id>', 'X-Partner-Delivery-Id to use (default: a fresh one)')
    .option('--json', 'print the answer as JSON')
    .action(async (options: SignOptions & { url?: string }) => {
      const url = options.url ?? (await defaultWebhookUrl())
      if (!/^https?:\/\//.test(url)) throw new UsageError(`--url must be an http(s) URL, got ${url}`)
      const { body, headers } = await signedHeaders(options)
      let response: Response
      try {
        response = await fetch(url, { method: 'POST', headers, body, signal: AbortSignal.timeout(10_000) })
      } catch (error) {
        writeError(`Could not deliver to ${url}: ${(error as Error).cause ?? (error as Error).message}\n`)
        setExitCode(1)
        return
      }
      let text: string | undefined
      try {
        text = await readAnswer(response, MAX_ANSWER_BYTES)
      } catch (error) {
        writeError(`Could not read the answer of ${url}: ${(error as Error).cause ?? (error as Error).message}\n`)
        setExitCode(1)
        return
      }
      if (text === undefined) {
        writeError(
          `${url} answered ${response.status} with a body larger than ${MAX_ANSWER_BYTES.toLocaleString('en-US')} ` +
            'bytes, the most this command reads; the rest was not read\n',
        )
        setExitCode(1)
        return
      }
      const answer = {
        status: response.status,
        deliveryId: headers['X-Partner-Delivery-Id'],
        body: parseJson(text),
      }
      if (options.json) printJson(answer)
      else write(`${response.status} ${answer.deliveryId} ${shortened(text, SHOWN_ANSWER_CHARACTERS)}\n`)
      if (!response.ok) setExitCode(1)
    })
}

// the running service's receiver (DATA_DIR/serve.json), else where this environment says it listens
async function defaultWebhookUrl(): Promise<string> {
  const config = await loadConfig()
  const running = findRunningService(config.dataDir)
  if (running) return running.webhookUrl
  const host = config.host === '0.0.0.0' || config.host === '::' ? '127.0.0.1' : config.host
  return `http://${host}:${config.port}${config.webhook.path}`
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text)
  } catch {
    return text
  }
}
