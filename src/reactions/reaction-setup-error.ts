// A reaction handler that cannot run as it is set up (reactions.on in partner-handlers.ts, createForwarder): a fault
// of the code that registers it, found when the handlers are registered, at the start of `serve` and of every
// command that loads them. Its message ends in its code in brackets, as a command's refusal does (cli-context.ts's
// CommandFailedError), so the one line the process exits with (1) says what to fix and a script can match it. Pure.

export type ReactionSetupErrorCode =
  | 'reaction_pattern_invalid'
  | 'reaction_status_unknown'
  | 'reaction_name_invalid'
  | 'reaction_name_taken'
  | 'reaction_name_reserved'
  | 'reaction_handler_invalid'
  | 'reaction_timeout_invalid'
  | 'forward_url_invalid'
  | 'forward_secret_invalid'
  | 'forward_timeout_invalid'

export class ReactionSetupError extends Error {
  override name = 'ReactionSetupError'
  constructor(
    readonly code: ReactionSetupErrorCode,
    message: string,
  ) {
    super(`${message} [${code}]`)
  }
}
