// `npm run bench -- soak [--duration 600] [--rate N] [--no-restart] [--handler]`: the real receiver (compiled, as the image runs it)
// on Postgres at half its measured maximum rate, with a Postgres restart in the middle. Reports answers
// by status, lost deliveries (every delivery answered 200 must be in the database: zero lost) and memory
// over time: RSS from /proc and the V8 heap in use from the receiver's own /metrics, sampled every tenth
// of the run, so a leak (a heap that keeps growing) can be told from a heap that grew once and stayed.
// --handler: the receiver runs one in-process no-op reaction handler (bench/serve-noop-handler.mjs), so its
// dispatcher reads and writes back a stream batch every few milliseconds for the whole run; the report, then
// bench/results/soak-handler.md, also counts the events handled.
// --forward: the receiver's handler is the forwarder instead, POSTing every transition to bench/server.ts's
// receiver in its own process (signed per Standard Webhooks); the report is bench/results/soak-forward.md.
import { execFileSync } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { once } from 'node:events'
import { writeFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import autocannon from 'autocannon'
import pg from 'pg'
import { deliveryHeaders } from './bench-secrets.js'
import { peakRssMb, rssMb, startBenchServer, startService } from './service-process.js'

const root = path.resolve(import.meta.dirname, '..')

function flag(args: string[], name: string): number | undefined {
  const index = args.indexOf(name)
  return index >= 0 ? Number(args[index + 1]) : undefined
}

async function heapUsedMb(adminPort: number): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${adminPort}/metrics`)).text()
  return Math.round(Number(/^nodejs_heap_size_used_bytes (\S+)/m.exec(text)?.[1] ?? 0) / 1024 / 1024)
}

export async function runSoak({ args }: { args: string[] }): Promise<void> {
  const durationS = flag(args, '--duration') ?? 600
  const baseUrl = process.env.BENCH_DATABASE_URL || 'postgres://postgres@127.0.0.1:5432/test'
  const schema = `soak_${randomBytes(4).toString('hex')}`
  const admin = new pg.Client({ connectionString: baseUrl })
  await admin.connect()
  await admin.query(`create schema ${schema}`)
  await admin.end()
  const url = new URL(baseUrl)
  url.searchParams.set('options', `-c search_path=${schema}`)

  execFileSync('npm', ['run', 'build', '--silent'], { cwd: root, stdio: 'ignore' })
  const forward = args.includes('--forward')
  // the handler whose events are counted: the in-process no-op, or the forwarder
  const handler = forward ? 'forwarder' : args.includes('--handler') ? 'noop' : undefined
  const withHandler = handler !== undefined
  const receiver = forward ? await startBenchServer('receiver', {}) : undefined
  const forwardEnv: Record<string, string> = receiver
    ? { FORWARD_URL: `http://127.0.0.1:${receiver.port}/forward`, FORWARD_SECRET: `whsec_${randomBytes(32).toString('base64')}` }
    : {}
  // each order takes five transitions; with the handler, enough orders that every delivery of a run moves one
  // (the first million are each an order's first), so the dispatcher has events to the end
  const orders = withHandler ? 1_000_000 : 50_000
  const { child, port, adminPort } = await startService(url.toString(), { orders, seen: 0 }, forwardEnv, undefined, {
    noopHandler: handler === 'noop',
  }).catch((error: unknown) => {
    receiver?.child.kill('SIGINT') // else its process would keep this one alive
    throw error
  })

  const statuses = ['created', 'funded', 'delivered', 'disputed', 'resolved']
  const answered200: string[] = []
  const byStatus: Record<string, number> = {}
  let counter = 0
  const drive = (seconds: number, overallRate?: number) =>
    autocannon({
      url: `http://127.0.0.1:${port}`,
      connections: 50,
      duration: seconds,
      ...(overallRate ? { overallRate } : {}),
      requests: [
        {
          method: 'POST',
          path: '/webhooks/partner',
          setupRequest: ((request: Record<string, unknown>, context: Record<string, unknown>) => {
            const index = counter++
            const order = (index % orders) + 1
            const deliveryId = `soak-${index}`
            const body = JSON.stringify({
              trade_id: `trd-${order}`,
              reference: `R-${order}`,
              status: statuses[Math.min(Math.floor(index / orders), statuses.length - 1)],
              external_reference: `bench-${order}`,
            })
            context.deliveryId = deliveryId
            request.body = body
            request.headers = deliveryHeaders(body, deliveryId)
            return request
          }) as never,
          onResponse: ((status: number, _body: string, context: Record<string, unknown>) => {
            byStatus[status] = (byStatus[status] ?? 0) + 1
            if (status === 200) answered200.push(String(context.deliveryId))
          }) as never,
        },
      ],
    })

  try {
    const maxRate = flag(args, '--rate') ?? Math.round((await drive(5)).requests.average)
    const rate = Math.max(1, Math.round(maxRate / 2))
    answered200.length = 0
    for (const key of Object.keys(byStatus)) delete byStatus[key]
    const rssStart = rssMb(child.pid!)
    // --no-restart: memory alone, on a Postgres that others share and that must not be restarted
    const restarts = !args.includes('--no-restart')
    const restartNote = restarts ? `Postgres restarts at ${Math.round(durationS / 2)} s` : 'no Postgres restart'
    process.stdout.write(`soak: ${durationS} s at ${rate} req/s (half of ${maxRate}); ${restartNote}\n`)
    const version = execFileSync('ls', ['/etc/postgresql'], { encoding: 'utf8' }).trim().split('\n')[0]!
    const restart = restarts
      ? setTimeout(() => {
          process.stdout.write('soak: restarting Postgres\n')
          execFileSync('pg_ctlcluster', ['--skip-systemctl-redirect', version, 'main', 'restart'])
        }, (durationS / 2) * 1000)
      : undefined
    const samples: { atS: number; rssMb: number; heapUsedMb: number }[] = []
    const sample = async (atS: number) => {
      samples.push({ atS, rssMb: rssMb(child.pid!), heapUsedMb: await heapUsedMb(adminPort).catch(() => Number.NaN) })
    }
    await sample(0)
    const sampling = setInterval(() => void sample(Math.round(samples.length * durationS / 10)), (durationS / 10) * 1000)
    const result = await drive(durationS, rate)
    clearTimeout(restart)
    clearInterval(sampling)
    const rssEnd = rssMb(child.pid!)
    const rssPeak = peakRssMb(child.pid!)

    const check = new pg.Client({ connectionString: url.toString() })
    await check.connect()
    const stored = await check.query('select count(*)::int as n from webhook_deliveries where delivery_id = any($1)', [answered200])
    // with the handler: its done jobs (a first attempt that succeeded is counted in its stream batch's record,
    // migrations/0011), and the transitions it has not taken yet when the load ended
    const handled = withHandler
      ? (
          await check.query(
            `select (select count(*)::int from reaction_jobs where handler = $1 and state = 'done')
               + (select coalesce(sum(events), 0)::int from reaction_stream_batches where handler = $1) as done,
             (select count(*)::int from reaction_jobs where handler = $1 and state <> 'done') as retrying,
             (select count(*)::int from reaction_streams s join order_status_history h on h.stream_position is not null
               and (h.stream_position, h.id) > (s.position, s.history_id) where s.handler = $1) as waiting`,
            [handler],
          )
        ).rows[0]
      : undefined
    await check.end()
    const lost = answered200.length - stored.rows[0].n
    const report = [
      '# Soak',
      '',
      `${new Date().toISOString()}: ${durationS} s at ${rate} req/s, ${restartNote}${handler === 'noop' ? ', one no-op reaction handler' : handler === 'forwarder' ? ', the forwarder as the one reaction handler (a receiver answering 204 at once)' : ''}; load average at the end ${os.loadavg().map((value) => value.toFixed(2)).join(', ')}.`,
      '',
      '| measure | value |',
      '| --- | --- |',
      `| requests | ${result.requests.total} |`,
      `| answers by status | ${Object.entries(byStatus).map(([status, count]) => `${status}: ${count}`).join(', ')} |`,
      `| connection errors / timeouts | ${result.errors} / ${result.timeouts} |`,
      `| RSS start → end | ${rssStart} MB → ${rssEnd} MB |`,
      `| peak RSS (VmHWM, the whole run) | ${rssPeak} MB |`,
      `| answered 200 | ${answered200.length} |`,
      `| answered 200 but not stored (lost) | ${lost} |`,
      ...(handled
        ? [`| reaction events handled by the ${handler === 'noop' ? 'no-op handler' : 'forwarder'} / failed and retrying / not yet taken at the end | ${handled.done} / ${handled.retrying} / ${handled.waiting} |`]
        : []),
      '',
      '## Memory over the run',
      '',
      '| second | RSS MB | V8 heap used MB |',
      '| --- | --- | --- |',
      ...samples.map((row) => `| ${row.atS} | ${row.rssMb} | ${row.heapUsedMb} |`),
      '',
    ].join('\n')
    process.stdout.write(report)
    const file = handler === 'noop' ? 'soak-handler.md' : handler === 'forwarder' ? 'soak-forward.md' : 'soak.md'
    writeFileSync(path.join(root, 'bench/results', file), report)
    if (lost !== 0) process.exitCode = 1
  } finally {
    child.kill('SIGTERM')
    await once(child, 'exit')
    if (receiver) {
      receiver.child.kill('SIGINT')
      await once(receiver.child, 'exit')
    }
    const cleanup = new pg.Client({ connectionString: baseUrl })
    await cleanup.connect()
    await cleanup.query(`drop schema if exists ${schema} cascade`)
    await cleanup.end()
  }
}
