// The console's `html` tag: where a string from outside lands decides how its bidirectional and invisible
// characters are shown.
import { describe, expect, it } from 'vitest'
import { html } from '../src/console/console-html.js'

const SPOOFED = 'invoice\u202efdp.exe'

describe('the console’s html tag', () => {
  it('marks each escape in text, and still escapes markup around it', () => {
    expect(String(html`<td>${`<b>${SPOOFED}`}</td>`)).toBe('<td>&lt;b&gt;invoice<span class="unprintable">\\u202e</span>fdp.exe</td>')
    expect(String(html`<p>${['a\u200b', 'b']}</p>`)).toBe('<p>a<span class="unprintable">\\u200b</span>b</p>')
  })

  it('writes the escape as plain text in <title> and <option>, whose content is text only', () => {
    expect(String(html`<title>${SPOOFED} · console</title>`)).toBe('<title>invoice\\u202efdp.exe · console</title>')
    expect(String(html`<option value="x">${SPOOFED}</option>`)).toBe('<option value="x">invoice\\u202efdp.exe</option>')
  })

  it('keeps an attribute’s value exact: a form sends it back', () => {
    expect(String(html`<input type="hidden" name="reference" value="${SPOOFED}">`)).toBe(
      `<input type="hidden" name="reference" value="${SPOOFED}">`,
    )
  })

  it('keeps a raw body’s line feeds and tabs, and text without such characters as it is', () => {
    expect(String(html`<pre>${'{\n\t"a": "b\u2028"\n}'}</pre>`)).toBe('<pre>{\n\t&quot;a&quot;: &quot;b<span class="unprintable">\\u2028</span>&quot;\n}</pre>')
    expect(String(html`<td>${'plain'}</td>`)).toBe('<td>plain</td>')
  })
})
