import { afterAll, expect } from 'vitest'
import { forbiddenValues, forgetLogLines, logLines } from './log-sink.js'

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
