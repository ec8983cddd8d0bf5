// README's "Make it yours" is what a fork trusts: every file it names exists, every export it names
// beside a file is there, and every source file that says it is the fork's (`// YOUR ...`) is named.
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'

const root = path.resolve(import.meta.dirname, '..')
const readme = readFileSync(path.join(root, 'README.md'), 'utf8')
const section = /^## Make it yours\n([\s\S]*?)^## /m.exec(readme)?.[1] ?? ''
// a bullet and its continuation lines
const bullets = section.split(/^- /m).slice(1)
const quoted = (text: string) => [...text.matchAll(/`([^`]+)`/g)].map((match) => match[1]!)
const isFile = (token: string) => /^[\w.-]+(\/[\w.-]+)*\.(ts|ya?ml|example)$|^\.env\.example$/.test(token)
// an export is named in code case (registerEventHandlers, TRADE_STATUSES); `orders` is a table
const isExport = (token: string) => /^[A-Za-z_]\w*$/.test(token) && /[A-Z]/.test(token)

function sourceFiles(directory: string): string[] {
  return readdirSync(path.join(root, directory), { withFileTypes: true }).flatMap((entry) => {
    const relative = `${directory}/${entry.name}`
    if (entry.isDirectory()) return sourceFiles(relative)
    return entry.name.endsWith('.ts') ? [relative] : []
  })
}

describe('README "Make it yours"', () => {
  it('has bullets that name files', () => {
    expect(bullets.length).toBeGreaterThan(2)
    expect(bullets.flatMap(quoted).filter(isFile).length).toBeGreaterThan(3)
  })

  it('names only files that exist', () => {
    const missing = bullets.flatMap(quoted).filter(isFile).filter((file) => !existsSync(path.join(root, file)))
    expect(missing).toEqual([])
  })

  it('names only exports that the files of the same bullet have', async () => {
    const absent: string[] = []
    for (const bullet of bullets) {
      const tokens = quoted(bullet)
      const names = tokens.filter(isExport)
      if (names.length === 0) continue
      const modules = await Promise.all(
        tokens.filter((token) => isFile(token) && token.endsWith('.ts')).map((file) => import(path.join(root, file))),
      )
      for (const name of names) {
        if (!modules.some((module: Record<string, unknown>) => name in module)) absent.push(name)
      }
    }
    expect(absent).toEqual([])
  })

  it('names every source file that says it is the fork’s to edit', () => {
    const named = new Set(bullets.flatMap(quoted))
    const forkFiles = sourceFiles('src').filter((file) => readFileSync(path.join(root, file), 'utf8').startsWith('// YOUR '))
    expect(forkFiles).toContain('src/webhooks/partner-event-handlers.ts')
    expect(forkFiles.filter((file) => !named.has(file))).toEqual([])
  })
})
