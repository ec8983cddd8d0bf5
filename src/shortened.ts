// Text from outside can be long (a platform's error answer is up to PARTNER_API_ANSWER_LIMIT, a megabyte):
// where it is logged or shown to a person, its first characters are enough, and the count says how long it was.

/** The first `max` characters of `text` (whole code points), then `… (N characters)` when it had more. */
export function shortened(text: string, max: number): string {
  const characters = [...text]
  if (characters.length <= max) return text
  return `${characters.slice(0, max).join('')}… (${characters.length.toLocaleString('en-US')} characters)`
}
