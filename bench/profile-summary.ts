// Prints the functions with the most self time in a V8 .cpuprofile (from `node --cpu-prof`), grouped
// by function and file: `npx tsx bench/profile-summary.ts file.cpuprofile [top] [--packages]`.
// --packages: busy time (idle left out) by the package or source file nearest up the stack, so Node's own
// work (writing a socket, hashing) counts for the package that asked for it.
import { readFileSync } from 'node:fs'

interface ProfileNode {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number }
  children?: number[]
}

const args = process.argv.slice(2)
const byPackage = args.includes('--packages')
const [file, topArg] = args.filter((arg) => arg !== '--packages')
if (!file) throw new Error('usage: profile-summary.ts file.cpuprofile [top] [--packages]')
const profile = JSON.parse(readFileSync(file, 'utf8')) as { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] }
const byId = new Map(profile.nodes.map((node) => [node.id, node]))
const parent = new Map<number, number>()
for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id)

function packageOf(id: number): string {
  for (let current: number | undefined = id; current !== undefined; current = parent.get(current)) {
    const url = byId.get(current)!.callFrame.url
    const inPackage = /node_modules\/((?:@[^/]+\/)?[^/]+)/.exec(url)
    if (inPackage) return inPackage[1]!
    if (/\/(src|bench)\//.test(url)) return url.replace(/^.*\/((src|bench)\/)/, '$1')
  }
  const name = byId.get(id)!.callFrame.functionName
  return name.startsWith('(') ? name : 'node internals'
}

const self = new Map<string, number>()
profile.samples.forEach((id, index) => {
  const frame = byId.get(id)!.callFrame
  if (byPackage && frame.functionName === '(idle)') return
  const where = frame.url.replace(/^.*node_modules\//, '').replace(/^file:\/\/.*\/(src|bench)\//, '$1/')
  const key = byPackage ? packageOf(id) : `${frame.functionName || '(anonymous)'} ${where}:${frame.lineNumber}`
  self.set(key, (self.get(key) ?? 0) + (profile.timeDeltas[index] ?? 0))
})
const total = [...self.values()].reduce((sum, value) => sum + value, 0)
for (const [key, micros] of [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, Number(topArg ?? 25))) {
  console.log(`${((micros / total) * 100).toFixed(1).padStart(5)}%  ${key}`)
}
