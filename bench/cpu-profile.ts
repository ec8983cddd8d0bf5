// What a V8 .cpuprofile (`node --cpu-prof`) says, summed two ways: by function (self time, the function's own
// code) and by the package or source file nearest up the stack (busy time, so Node's own work, writing a
// socket or hashing, counts for the package that asked for it). Shares are of the busy samples: the idle ones
// (the event loop waiting) are left out of both. Used by bench/profile-summary.ts and by `npm run bench`.
import { readFileSync } from 'node:fs'

interface ProfileNode {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number }
  children?: number[]
}

interface CpuProfile {
  /** When profiling began, in µs of the machine's monotonic clock (process.hrtime's, in ns, in any process). */
  startTime: number
  nodes: ProfileNode[]
  samples: number[]
  timeDeltas: number[]
}

export interface ProfileShare {
  /** A function as `name file` (or `name file:line` with lines), or a package or source file. */
  key: string
  /** Its share of the busy samples' time, in percent. */
  percent: number
}

export interface ProfileSummary {
  /** The profile's time in all and the share of it that was busy (not idle), in ms and percent. */
  totalMs: number
  busyPercent: number
  /** The functions with the most self time, most first. */
  functions: ProfileShare[]
  /** The packages and source files with the most busy time, most first. */
  packages: ProfileShare[]
}

/** The µs of process.hrtime's clock now: what a profile's sample times are counted in. */
export const monotonicMicros = () => Number(process.hrtime.bigint() / 1000n)

export function summarizeProfile(
  file: string,
  {
    top = 25,
    lines = false,
    window,
  }: {
    top?: number
    /** Tell apart the functions of one name in one file by their line. */
    lines?: boolean
    /** Only the samples taken in this span (monotonicMicros() at both ends): a load run, without the start before it. */
    window?: { fromUs: number; toUs: number }
  } = {},
): ProfileSummary {
  const profile = JSON.parse(readFileSync(file, 'utf8')) as CpuProfile
  const byId = new Map(profile.nodes.map((node) => [node.id, node]))
  const parent = new Map<number, number>()
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id)

  const packageOf = (id: number): string => {
    for (let current: number | undefined = id; current !== undefined; current = parent.get(current)) {
      const url = byId.get(current)!.callFrame.url
      const inPackage = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url)
      if (inPackage) return inPackage[1]!
      if (/\/(src|bench)\//.test(url)) return url.replace(/^.*\/((src|bench)\/)/, '$1')
    }
    const name = byId.get(id)!.callFrame.functionName
    return name.startsWith('(') ? name : 'node internals'
  }

  const functions = new Map<string, number>()
  const packages = new Map<string, number>()
  let totalMicros = 0
  let busyMicros = 0
  let at = profile.startTime
  profile.samples.forEach((id, index) => {
    const micros = profile.timeDeltas[index] ?? 0
    at += micros
    if (window && (at < window.fromUs || at > window.toUs)) return
    totalMicros += micros
    const frame = byId.get(id)!.callFrame
    if (frame.functionName === '(idle)') return
    busyMicros += micros
    const where = frame.url.replace(/^.*node_modules\//, '').replace(/^file:\/\/.*\/(src|bench)\//, '$1/').replace(/^node:/, '')
    const key = `${frame.functionName || '(anonymous)'}${where ? ` ${where}${lines ? `:${frame.lineNumber}` : ''}` : ''}`
    functions.set(key, (functions.get(key) ?? 0) + micros)
    const owner = packageOf(id)
    packages.set(owner, (packages.get(owner) ?? 0) + micros)
  })
  const shares = (totals: Map<string, number>) =>
    [...totals.entries()]
      .sort((a, b) => b[1] - a[1])
      .slice(0, top)
      .map(([key, micros]) => ({ key, percent: Number(((micros / Math.max(1, busyMicros)) * 100).toFixed(1)) }))
  return {
    totalMs: Math.round(totalMicros / 1000),
    busyPercent: Number(((busyMicros / Math.max(1, totalMicros)) * 100).toFixed(1)),
    functions: shares(functions),
    packages: shares(packages),
  }
}
