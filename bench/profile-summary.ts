// Prints the functions with the most self time in a V8 .cpuprofile (from `node --cpu-prof`), grouped by function
// and file and line: `npx tsx bench/profile-summary.ts file.cpuprofile [top] [--packages]`. Shares are of the
// busy time (idle left out). --packages: busy time by the package or source file nearest up the stack, so Node's
// own work (writing a socket, hashing) counts for the package that asked for it.
import { summarizeProfile } from './cpu-profile.js'

const args = process.argv.slice(2)
const byPackage = args.includes('--packages')
const [file, topArg] = args.filter((arg) => arg !== '--packages')
if (!file) throw new Error('usage: profile-summary.ts file.cpuprofile [top] [--packages]')
const summary = summarizeProfile(file, { top: Number(topArg ?? 25), lines: true })
console.log(`${summary.totalMs} ms profiled, ${summary.busyPercent}% of it busy; shares of the busy time:`)
for (const { key, percent } of byPackage ? summary.packages : summary.functions) {
  console.log(`${percent.toFixed(1).padStart(5)}%  ${key}`)
}
