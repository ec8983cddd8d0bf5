// A JSON object, as told from what JSON.parse returns: an object that is neither null nor an array.
export function isJsonObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value)
}

/** The JSON object `text` holds, or which of the two it is not. */
export function parseJsonObject(text: string): Record<string, unknown> | 'not JSON' | 'not a JSON object' {
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return 'not JSON'
  }
  return isJsonObject(value) ? value : 'not a JSON object'
}
