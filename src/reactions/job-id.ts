// A reaction job's id as the operator types it (CLI) or a page carries it (console): reaction_jobs.id is a
// bigint identity, so anything but digits up to bigint's largest names no job, and the database would refuse
// it as a parameter. Pure, so the CLI can check an argument without loading the database's code.

const MAX_BIGINT = 2n ** 63n - 1n

export function isJobId(value: string): boolean {
  return /^[1-9]\d{0,18}$/.test(value) && BigInt(value) <= MAX_BIGINT
}
