// The warnings Node emits on the process (process.emitWarning: MaxListenersExceededWarning and the like)
// while a test's steps run.

/**
 * Runs `steps` and returns each warning emitted meanwhile as `<name>: <message>`. Node emits a warning on a
 * later tick than its cause, so this listens one turn of the event loop past the steps.
 */
export async function processWarningsDuring(steps: () => Promise<void>): Promise<string[]> {
  const warnings: string[] = []
  const onWarning = (warning: Error) => warnings.push(`${warning.name}: ${warning.message}`)
  process.on('warning', onWarning)
  try {
    await steps()
    await new Promise((resolve) => setImmediate(resolve))
  } finally {
    process.off('warning', onWarning)
  }
  return warnings
}
