import { afterAll, beforeAll, expect, inject } from 'vitest'
import { removeDefaultDataDir } from './cli-process.js'
import { removeDataDirCopies } from './data-dir-template.js'
import { forbiddenValues, forgetLogLines, logLines } from './log-sink.js'
import { processLeaks, processState } from './process-leaks.js'

// The directories this file's child processes ran in (helpers/cli-process.ts, helpers/data-dir-template.ts), removed
// at its end: registered before the file's own hooks, so it runs after them (vitest runs after-hooks last registered
// first), once the file has stopped its processes. Here, run for each file, where a helper's module is imported once
// by a worker that runs files one after another (isolate: false).
afterAll(() => {
  removeDataDirCopies()
  removeDefaultDataDir()
})

// Suite-wide: no line any test of this file logged may hold a secret or a signature it used.
afterAll(() => {
  const leaks: string[] = []
  for (const line of logLines) {
    for (const value of forbiddenValues())
      if (line.includes(value)) leaks.push(`${value.slice(0, 6)}… in ${line.slice(0, 200)}`)
    if (/sha256=[0-9a-fA-F]{64}/.test(line)) leaks.push(`a signature header in ${line.slice(0, 200)}`)
  }
  forgetLogLines()
  expect(leaks, 'log lines leaking secrets or signatures').toEqual([])
})

// Where the files share their worker's process (vitest.config.ts): what this file leaves in it, the next file's.
// Registered first, so it runs after the file's own after-hooks (vitest runs them last registered first).
if (inject('filesShareProcess')) {
  let before: ReturnType<typeof processState>
  beforeAll(() => {
    before = processState()
  })
  afterAll(() => {
    expect(processLeaks(before), 'what this file left in the process the next file runs in').toEqual([])
  })
}
