// The service takes its settings from the environment only; `.env.example` says to copy it to `.env`, and a
// newcomer who did so and ran `npm start` got local mode with the sandbox, told nothing of the file it had
// filled in. When the working directory holds a `.env` naming variables the environment does not set, the
// start says so, naming those variables (never their values) and how to load the file.
import { readFileSync } from 'node:fs'
import path from 'node:path'

// `NAME=value` and `export NAME=value`, as shells and env-file readers (Node's --env-file, docker compose) take them
const ASSIGNMENT = /^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=/

export interface UnreadEnvFile {
  file: string
  /** The variables it names that the environment does not set, in the file's order. */
  names: string[]
}

/** The `.env` in `directory` and what of it the environment lacks; undefined when there is none or it lacks nothing. */
export function unreadEnvFile(directory: string, env: NodeJS.ProcessEnv): UnreadEnvFile | undefined {
  const file = path.join(directory, '.env')
  let text: string
  try {
    text = readFileSync(file, 'utf8')
  } catch {
    return undefined // none, or not ours to read
  }
  const names: string[] = []
  for (const line of text.split(/\r?\n/)) {
    const name = ASSIGNMENT.exec(line)?.[1]
    if (name !== undefined && env[name] === undefined && !names.includes(name)) names.push(name)
  }
  return names.length > 0 ? { file, names } : undefined
}

export const UNREAD_ENV_FILE_MESSAGE =
  'a .env file is in the working directory and is not read: the service takes its settings from the environment only; ' +
  'load it with `node --env-file=.env dist/src/cli.js serve`, or `set -a; . ./.env; set +a` before `npm start`'

/** The same said to a command's operator on stderr, with the variables the environment lacks (names only). */
export function unreadEnvFileCommandNote({ names }: UnreadEnvFile): string {
  return (
    `Warning: a .env file is in the working directory and is not read (it sets ${names.join(', ')}): commands take ` +
    'their settings from the environment only; load it with `set -a; . ./.env; set +a` first\n'
  )
}
