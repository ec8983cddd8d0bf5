// The tag every console page is written with: hono/html's `html`, which escapes each interpolated value (text
// and attribute alike) unless it is itself a template, so markup from outside shows as text. HTML escaping
// leaves the characters that are not markup: a bidirectional control in an external reference
// (`invoice\u202efdp.exe`) would reorder the page's text around it, a zero-width one would hide. So a string
// shown as text has each character printable() escapes (src/printable.ts) shown as `\u202e` in a marked span.
// Kept exact: a string inside a tag (an attribute's value is data sent back, a hidden field or a search box, and
// a browser shows it reordered within its input at most), and the line feed and tab of a raw body. Inside
// <title> and the other elements whose content is text only, where a span would show as its markup, the
// escape is plain text.
import { html as honoHtml } from 'hono/html'
import { printableLineParts } from '../printable.js'

export type Html = ReturnType<typeof honoHtml>

type Place = 'tag' | 'text only' | 'text'

// per call site: the literals of a template are the same array at every call
const placesOf = new WeakMap<TemplateStringsArray, Place[]>()

/** Where each value of a template lands, judged by our literals alone: inside a tag, in a text-only element, in text. */
function places(strings: TemplateStringsArray): Place[] {
  let found = placesOf.get(strings)
  if (!found) {
    found = strings.slice(0, -1).map((_, i) => {
      const before = strings.slice(0, i + 1).join('')
      if (before.lastIndexOf('<') > before.lastIndexOf('>')) return 'tag'
      return /<(title|textarea|option)\b[^>]*>[^<]*$/i.test(before) ? 'text only' : 'text'
    })
    placesOf.set(strings, found)
  }
  return found
}

function shown(value: unknown, place: Place): unknown {
  if (Array.isArray(value)) return value.map((inner) => shown(inner, place))
  if (typeof value !== 'string') return value
  const parts = printableLineParts(value)
  if (parts.length === 1) return value
  if (place === 'text only') return parts.join('')
  return honoHtml`${parts.map((part, i) => (i % 2 === 1 ? honoHtml`<span class="unprintable">${part}</span>` : part))}`
}

/** hono/html's `html`, with the characters printable() escapes shown as escapes wherever a string lands in text. */
export function html(strings: TemplateStringsArray, ...values: unknown[]): Html {
  const at = places(strings)
  return honoHtml(strings, ...values.map((value, i) => (at[i] === 'tag' ? value : shown(value, at[i]!))))
}
