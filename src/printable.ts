// What a terminal acts on instead of showing, and what a person cannot see. Text from outside (a webhook's
// fields and body, the platform's records and error messages, a receiver's answer) can hold them, so wherever
// such text is shown to a person, each is shown as \uXXXX instead:
// - the controls (Unicode's Cc: C0, DEL, C1): an `ESC ] 0;…` cannot retitle the window, nor `ESC [2J` clear it;
// - the format characters (Cf): the bidirectional ones (LRE…RLO U+202A–U+202E, LRI…PDI U+2066–U+2069, LRM and
//   RLM U+200E/U+200F, ALM U+061C) reorder what follows, so `invoice\u202efdp.exe` would read `invoiceexe.pdf`;
//   the zero-width ones (U+200B–U+200D, U+2060, U+FEFF), the soft hyphen and the tag characters show nothing,
//   so two references that differ by one would look the same. The whole category rather than a list: what
//   Unicode adds to it is of the same kind. The price: a word joined by U+200C or an emoji by U+200D shows the
//   escape; what we show are identifiers and fields, and there the exact characters matter more;
// - the line and paragraph separators U+2028/U+2029: where a viewer breaks the line at them, a value could
//   start a line of its own;
// - the rest of Unicode's default-ignorable code points (Default_Ignorable_Code_Point: what a renderer shows as
//   nothing when it has no glyph for it): the combining grapheme joiner U+034F, the variation selectors
//   U+FE00–U+FE0F and U+E0100–U+E01EF, the Hangul fillers U+115F, U+1160, U+3164 and U+FFA0, the Mongolian free
//   variation selectors and the unassigned ones Unicode keeps for more of the kind. They were shown as they came: a
//   parked 'o-3\u034f' read 'o-3' beside the order 'o-3'. The price: an emoji's U+FE0F shows its escape.

const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Default_Ignorable_Code_Point}\u2028\u2029]+/gu
// the same, but the line feed and the tab that text laid out in lines keeps
const UNPRINTABLE_BUT_LAYOUT = /(?:(?![\t\n])[\p{Cc}\p{Cf}\p{Default_Ignorable_Code_Point}\u2028\u2029])+/gu

// split(''): UTF-16 units, so a character past U+FFFF (a tag character) shows as its surrogate pair, as JSON writes it
const shownAsEscape = (run: string) =>
  run
    .split('')
    .map((unit) => `\\u${unit.charCodeAt(0).toString(16).padStart(4, '0')}`)
    .join('')

/**
 * Text from outside on one line: its line feeds and tabs too are shown as \u000a and \u0009, so a value
 * cannot start a line of its own (a forged row of a table, a forged field).
 */
export function printable(text: string): string {
  return text.replace(UNPRINTABLE, shownAsEscape)
}

/** Text laid out in lines: every character printable() escapes but the line feed and the tab. */
export function printableLines(text: string): string {
  return text.replace(UNPRINTABLE_BUT_LAYOUT, shownAsEscape)
}

/**
 * printableLines() in parts, for a page that marks the escapes: the text between them at even indexes, each run
 * of escapes (`\u202e`) at odd ones. `a\u202eb` → ['a', '\\u202e', 'b'].
 */
export function printableLineParts(text: string): string[] {
  const parts: string[] = []
  let end = 0
  for (const match of text.matchAll(UNPRINTABLE_BUT_LAYOUT)) {
    parts.push(text.slice(end, match.index), shownAsEscape(match[0]))
    end = match.index + match[0].length
  }
  parts.push(text.slice(end))
  return parts
}
