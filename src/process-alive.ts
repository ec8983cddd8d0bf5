/**
 * Whether process `pid` exists: signal 0 only asks, and EPERM means it does, under another user. (Whether it is
 * still the process that wrote a pid down is another question: db/open-database.ts's lock asks its start time.)
 */
export function processIsAlive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
}
