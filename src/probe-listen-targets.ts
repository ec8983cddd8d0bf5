// Whether every listener a start will open can open, found before the database is opened: a port taken by
// another program used to show only after the embedded database's first initdb (several seconds, leaving a
// database behind) or, later, after opening and migrating it. Each target is bound and closed again, all held
// at once as the real listeners will be, so two settings naming one port fail here too. A port taken between
// this and the real listen still fails there, in the same words.
import { once } from 'node:events'
import { createServer, type Server } from 'node:net'
import { describeListenClash, describeListenError, type ListenTarget } from './listen-error.js'

/** Rejects with the first target's listen failure in words that name its setting (listen-error.ts). */
export async function probeListenTargets(targets: readonly ListenTarget[]): Promise<void> {
  const opened: { target: ListenTarget; server: Server }[] = []
  try {
    for (const target of targets) {
      const server = createServer()
      try {
        await listen(server, target)
      } catch (error) {
        throw (await ownListenerHolding(error, target, opened)) ?? describeListenError(error, target)
      }
      opened.push({ target, server })
    }
  } finally {
    await Promise.all(opened.map(({ server }) => close(server)))
  }
}

/**
 * The clash when the port `target` found in use is held by a target opened before it, or undefined when another
 * process holds it. The same port is no clash on addresses apart (HOST=10.0.0.5 beside ADMIN_HOST=127.0.0.1), and
 * whether two addresses overlap is the system's to say (0.0.0.0 covers 127.0.0.1, `::` covers both where IPv6
 * takes IPv4 too, a name is what it resolves to): so each such target is closed, and the port tried again.
 */
async function ownListenerHolding(
  error: unknown,
  target: ListenTarget,
  opened: { target: ListenTarget; server: Server }[],
): Promise<Error | undefined> {
  if ((error as NodeJS.ErrnoException | undefined)?.code !== 'EADDRINUSE' || target.port === 0) return undefined
  for (const { target: other, server } of opened.filter(({ target: other }) => other.port === target.port)) {
    // closed for good: the probe ends with this failure either way
    await close(server)
    const retry = createServer()
    const freed = await listen(retry, target).then(
      () => true,
      () => false,
    )
    if (freed) {
      await close(retry)
      return describeListenClash(error, target, other)
    }
  }
  return undefined
}

async function listen(server: Server, { port, host }: ListenTarget): Promise<void> {
  server.listen(port, host)
  await once(server, 'listening')
}

function close(server: Server): Promise<void> {
  return new Promise((resolve) => server.close(() => resolve()))
}
