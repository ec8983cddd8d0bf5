// A listener that cannot open says which setting to change. Node's own words ("listen EADDRINUSE: address
// already in use 127.0.0.1:3000") name neither the variable nor what to do, and a newcomer whose port 3000 is
// taken by another program met exactly that under `npm start`.
import { printable } from './printable.js'

/** Where a listener was asked to open: the variables that chose it, and their values. */
export interface ListenTarget {
  portSetting: string
  hostSetting: string
  port: number
  host: string
}

/**
 * Why a listener could not open, in the project's codes: another process holds the port (`port_in_use`), this user
 * may not listen on it (`port_not_permitted`), the host is no address of this machine or no lookup finds it
 * (`no_such_address`), or two of this start's own listeners were given one port (`port_clash`).
 */
export type ListenSettingErrorCode = 'port_in_use' | 'port_not_permitted' | 'no_such_address' | 'port_clash'

/**
 * A listener that could not open, in words naming its setting. Its own class: its cause may be a lookup's
 * ENOTFOUND, which a command's error line read as the database's (`HOST=999.1.1.1` was reported as "The database
 * cannot be reached"). Its message ends in its code in brackets, as every other refusal of the project's does
 * (config-error.ts, sandbox-state.ts): the line used to end without one.
 */
export class ListenSettingError extends Error {
  override readonly name = 'ListenSettingError'
  constructor(
    readonly code: ListenSettingErrorCode,
    reason: string,
    options?: ErrorOptions,
  ) {
    super(`${reason} [${code}]`, options)
  }
}

/** The listen failure in words that name the setting, or the error itself when it is none of the known ones. */
export function describeListenError(error: unknown, { portSetting, hostSetting, port, host: hostGiven }: ListenTarget): Error {
  const code = (error as NodeJS.ErrnoException | undefined)?.code
  // a host given as an argument (`sandbox --host`) may hold a line feed: it cannot start a line of its own
  const host = printable(hostGiven)
  const where = `${host}:${port}`
  const refusal: [ListenSettingErrorCode, string] | undefined =
    code === 'EADDRINUSE'
      ? ['port_in_use', `${portSetting}=${port}: another process already listens on ${where}; stop it, or set ${portSetting} to a free port`]
      : code === 'EACCES'
        ? [
            'port_not_permitted',
            `${portSetting}=${port}: this user may not listen on ${where} (ports under 1024 need privileges); set ${portSetting} to 1024 or above`,
          ]
        : code === 'EADDRNOTAVAIL' || code === 'ENOTFOUND' || code === 'EAI_AGAIN'
          ? [
              'no_such_address',
              `${hostSetting}=${host}: no such address on this machine (${code}); set ${hostSetting} to one of its addresses, such as 127.0.0.1 or 0.0.0.0`,
            ]
          : undefined
  return refusal ? new ListenSettingError(...refusal, { cause: error }) : (error as Error)
}

/**
 * The listen failure of `target` when its port is taken by another listener of this same start, `holder`, opened
 * before it: PORT=ADMIN_PORT was reported as "another process already listens", when none did.
 */
export function describeListenClash(error: unknown, target: ListenTarget, holder: ListenTarget): ListenSettingError {
  return new ListenSettingError(
    'port_clash',
    `${target.portSetting}=${target.port}: ${holder.portSetting} and ${target.portSetting} clash: this service's own listener ` +
      `for ${holder.portSetting} already listens on ${printable(holder.host)}:${holder.port}; set ${target.portSetting} to another port`,
    { cause: error },
  )
}
