import { readdirSync, readFileSync } from 'node:fs'
import { defineConfig } from 'vitest/config'

// Two projects over the same files. "process": the suites that run the CLI or the service as a child
// process (they import helpers/cli-process.ts): the slowest, so CI runs them once, on the oldest supported
// Node. "in-process": everything else, which CI runs on every supported Node.
// `npx vitest run --project in-process` runs only those.
const testFiles = readdirSync('test', { recursive: true, encoding: 'utf8' })
  .filter((file) => file.endsWith('.test.ts'))
  .map((file) => `test/${file}`)
const processFiles = testFiles.filter((file) => readFileSync(file, 'utf8').includes('/helpers/cli-process.js'))

export default defineConfig({
  test: {
    setupFiles: ['test/helpers/setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    pool: 'forks',
    projects: [
      { extends: true, test: { name: 'in-process', include: ['test/**/*.test.ts'], exclude: processFiles } },
      { extends: true, test: { name: 'process', include: processFiles } },
    ],
  },
})
