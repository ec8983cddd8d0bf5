// The service's version, package.json's: in `--version`, the partner_escrow_build_info metric, the
// `service listening` line and the User-Agent of every request the service sends. Read on first use.
import { readFileSync } from 'node:fs'

/** What is said when no package.json is found (a fork that bundles the code into one file, say). */
export const UNKNOWN_VERSION = 'unknown'

let known: string | undefined

export function serviceVersion(): string {
  known ??= readVersion()
  return known
}

/** `partner-escrow/0.1.0`: names this service to the platform and to the partner's receivers. */
export function userAgent(): string {
  return `partner-escrow/${serviceVersion()}`
}

// package.json is beside src/ when run from the sources (src/version.ts) and beside dist/ when compiled
// (dist/src/version.js): the nearest one above this file
function readVersion(): string {
  for (const up of ['../package.json', '../../package.json']) {
    let text: string
    try {
      text = readFileSync(new URL(up, import.meta.url), 'utf8')
    } catch {
      continue
    }
    try {
      const { version } = JSON.parse(text) as { version?: unknown }
      if (typeof version === 'string' && version !== '') return version
    } catch {
      // not JSON: no version from it
    }
    return UNKNOWN_VERSION
  }
  return UNKNOWN_VERSION
}
