// Prints the functions with the most self time in a V8 .cpuprofile (from `node --cpu-prof`), grouped
// by function and file: `npx tsx bench/profile-summary.ts file.cpuprofile [top]`.
import { readFileSync } from 'node:fs'

interface ProfileNode {
  id: number
  callFrame: { functionName: string; url: string; lineNumber: number }
}

const [file, topArg] = process.argv.slice(2)
if (!file) throw new Error('usage: profile-summary.ts file.cpuprofile [top]')
const profile = JSON.parse(readFileSync(file, 'utf8')) as { nodes: ProfileNode[]; samples: number[]; timeDeltas: number[] }
const byId = new Map(profile.nodes.map((node) => [node.id, node]))
const self = new Map<string, number>()
profile.samples.forEach((id, index) => {
  const frame = byId.get(id)!.callFrame
  const where = frame.url.replace(/^.*node_modules\//, '').replace(/^file:\/\/.*\/(src|bench)\//, '$1/')
  const key = `${frame.functionName || '(anonymous)'} ${where}:${frame.lineNumber}`
  self.set(key, (self.get(key) ?? 0) + (profile.timeDeltas[index] ?? 0))
})
const total = [...self.values()].reduce((sum, value) => sum + value, 0)
for (const [key, micros] of [...self.entries()].sort((a, b) => b[1] - a[1]).slice(0, Number(topArg ?? 25))) {
  console.log(`${((micros / total) * 100).toFixed(1).padStart(5)}%  ${key}`)
}
