// README is long: its Contents is how a reader finds a section, and a link into it must land somewhere.
import { readFileSync } from 'node:fs'
import path from 'node:path'
import { describe, expect, it } from 'vitest'

const readme = readFileSync(path.join(import.meta.dirname, '..', 'README.md'), 'utf8')
// headings outside fenced code (a shell comment in a ```sh block starts with # too)
const prose = readme.replace(/^```[\s\S]*?^```/gm, '')
const headings = [...prose.matchAll(/^(#{2,4}) (.+)$/gm)].map((match) => ({ depth: match[1]!.length, title: match[2]! }))

// GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to hyphens
const anchorOf = (title: string) =>
  title
    .toLowerCase()
    .replace(/[^\p{L}\p{N}_\- ]/gu, '')
    .replace(/ /g, '-')

describe('README', () => {
  it('lists every section and subsection in Contents, in order, each linked to its heading', () => {
    const contents = /^\*\*Contents\*\*[^\n]*\n(?:[^\n]*\n)*?\n((?:(?: {2})?- \[[^\n]+\n)+)/m.exec(readme)?.[1] ?? ''
    const listed = [...contents.matchAll(/^( *)- \[([^\]]+)\]\(#([^)]+)\)$/gm)].map((match) => ({
      depth: match[1]!.length === 0 ? 2 : 3,
      title: match[2]!,
      anchor: match[3]!,
    }))
    const sections = headings.filter((heading) => heading.depth <= 3)
    expect(sections.length).toBeGreaterThan(20)
    expect(listed).toEqual(sections.map((heading) => ({ ...heading, anchor: anchorOf(heading.title) })))
  })

  it('links within itself only to headings it has', () => {
    const anchors = new Set(headings.map((heading) => anchorOf(heading.title)))
    const links = [...readme.matchAll(/\]\(#([^)]+)\)/g)].map((match) => match[1]!)
    expect(links.length).toBeGreaterThan(headings.length)
    expect(links.filter((link) => !anchors.has(link))).toEqual([])
  })
})
