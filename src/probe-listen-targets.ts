// Whether every listener a start will open can open, found before the database is opened: a port taken by
// another program used to show only after the embedded database's first initdb (several seconds, leaving a
// database behind) or, later, after opening and migrating it. Each target is bound and closed again, all held
// at once as the real listeners will be, so two settings naming one port fail here too. A port taken between
// this and the real listen still fails there, in the same words.
import { once } from 'node:events'
import { createServer, type Server } from 'node:net'
import { describeListenError, type ListenTarget } from './listen-error.js'

/** Rejects with the first target's listen failure in words that name its setting (listen-error.ts). */
export async function probeListenTargets(targets: readonly ListenTarget[]): Promise<void> {
  const opened: Server[] = []
  try {
    for (const target of targets) {
      const server = createServer()
      server.listen(target.port, target.host)
      try {
        await once(server, 'listening')
      } catch (error) {
        throw describeListenError(error, target)
      }
      opened.push(server)
    }
  } finally {
    await Promise.all(opened.map((server) => new Promise<void>((resolve) => server.close(() => resolve()))))
  }
}
