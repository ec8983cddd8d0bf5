// What a terminal acts on instead of showing: the C0 controls, DEL and the C1 controls. Text from outside
// (a webhook's fields and body, the platform's records and error messages, a receiver's answer) can hold
// them, so wherever such text is written for a person to read, each is shown as \uXXXX instead: an
// `ESC ] 0;…` cannot retitle the window, nor `ESC [2J` clear it.

// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/g
// eslint-disable-next-line no-control-regex
const CONTROL_BUT_LAYOUT = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/g
const shownAsEscape = (char: string) => `\\u${char.charCodeAt(0).toString(16).padStart(4, '0')}`

/**
 * Text from outside on one line: its line feeds and tabs too are shown as \u000a and \u0009, so a value
 * cannot start a line of its own (a forged row of a table, a forged field).
 */
export function printable(text: string): string {
  return text.replace(CONTROL, shownAsEscape)
}

/** Text laid out in lines: every control shown as \uXXXX but the line feed and the tab. */
export function printableLines(text: string): string {
  return text.replace(CONTROL_BUT_LAYOUT, shownAsEscape)
}
