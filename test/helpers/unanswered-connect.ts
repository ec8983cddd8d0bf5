// A platform that cannot be reached: a listener whose backlog is full (helpers/full-backlog-listener.py), so a connect to
// it gets no SYN-ACK and stays in SYN-SENT, as behind a firewall that drops packets. Not one byte of a request is
// written there: a call to it is never sent. Linux only: a process's connecting socket is found in /proc.
import { type ChildProcess, spawn } from 'node:child_process'
import { once } from 'node:events'
import { readdirSync, readFileSync, readlinkSync } from 'node:fs'
import path from 'node:path'
import { afterAll, beforeAll } from 'vitest'

export interface UnansweredListener {
  /** Its port on 127.0.0.1 (from the file's beforeAll on). */
  readonly port: number
}

/** Registers the file's beforeAll and afterAll: call it once, at the top level of a test file. */
export function useUnansweredListener(): UnansweredListener {
  let listener: ChildProcess | undefined
  let port: number | undefined
  beforeAll(async () => {
    listener = spawn('python3', [path.join(import.meta.dirname, 'full-backlog-listener.py')], { stdio: ['pipe', 'pipe', 'inherit'] })
    const [chunk] = (await once(listener.stdout!, 'data')) as [Buffer]
    port = Number(chunk.toString().trim())
  })
  afterAll(() => {
    listener?.stdin!.end()
    listener?.kill('SIGKILL')
  })
  return {
    get port() {
      if (port === undefined) throw new Error('the listener’s port is read before the file’s beforeAll started it')
      return port
    },
  }
}

/** Whether process `pid` holds a TCP socket in SYN-SENT to 127.0.0.1:`port` (its connect sent, never answered). */
export function connectingTo(pid: number, port: number): boolean {
  const inodes = new Set<string>()
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const socket = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))
      if (socket) inodes.add(socket[1]!)
    } catch {
      // closed meanwhile
    }
  }
  const remote = `0100007F:${port.toString(16).toUpperCase().padStart(4, '0')}`
  return readFileSync(`/proc/${pid}/net/tcp`, 'utf8')
    .split('\n')
    .slice(1)
    .map((line) => line.trim().split(/\s+/))
    // local_address rem_address st … inode: state 02 is SYN_SENT
    .some((fields) => fields[2] === remote && fields[3] === '02' && inodes.has(fields[9]!))
}
