// `deliveries show|reapply` hold the delivery id they are given to the rule the receiver takes one by
// (src/webhooks/delivery-id.ts): one no delivery can have is refused as an order reference no order can have is,
// exit 2 and one line, before anything is looked up. `deliveries show ""` answered `No delivery  [delivery_not_found]`.
// Over the real database (PGlite, and Postgres when TEST_DATABASE_URL is set), through the command line.
import { describe, expect, it } from 'vitest'
import { runCommand } from './helpers/cli-in-process.js'
import { useTestDatabase } from './helpers/test-database.js'

const REFUSAL =
  'Invalid delivery id: must be 1 to 200 characters from ! to ~ (printable ASCII, no space), as the receiver takes it [invalid_arguments]\n'

describe('a command that names a delivery by an id no delivery can have', () => {
  const database = useTestDatabase()
  const cli = (args: string[]) => runCommand(args, database.db)

  it.each(['show', 'show --json', 'reapply', 'reapply --json'])('deliveries %s refuses it: exit 2, one line, nothing else', async (command) => {
    const [name, ...options] = command.split(' ')
    for (const deliveryId of ['', ' ', '\t', 'dlv 1', 'd'.repeat(201), 'dlv\u00001']) {
      expect(await cli(['deliveries', name!, deliveryId, ...options])).toEqual({ code: 2, stdout: '', stderr: REFUSAL })
    }
  })

  it('still looks up an id the receiver takes, the longest among them', async () => {
    for (const deliveryId of ['d'.repeat(200), 'sha256=' + 'a'.repeat(64)]) {
      const shown = await cli(['deliveries', 'show', deliveryId])
      expect(shown).toMatchObject({ code: 1, stdout: '' })
      expect(shown.stderr).toMatch(/^No delivery .* \[delivery_not_found\]\n$/)
    }
  })
})
