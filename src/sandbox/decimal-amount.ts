// Pure: money as the sandbox counts it, in decimal strings ("120.00", "3", "0.5") computed exactly as
// whole numbers of their smallest unit, never as binary floats (0.1 + 0.2 is not 0.3 in one).

interface Units {
  units: bigint
  scale: number
}

function parse(value: string): Units {
  const [whole = '0', fraction = ''] = value.split('.')
  return { units: BigInt(`${whole}${fraction}`), scale: fraction.length }
}

function atScale({ units, scale }: Units, target: number): bigint {
  return units * 10n ** BigInt(target - scale)
}

function format(units: bigint, scale: number): string {
  if (scale === 0) return units.toString()
  const digits = units.toString().padStart(scale + 1, '0')
  return `${digits.slice(0, -scale)}.${digits.slice(-scale)}`
}

// the finest scale among the amounts: every one of them, and their sums and differences, is exact at it
function finestScale(amounts: readonly string[]): number {
  return Math.max(0, ...amounts.map((amount) => parse(amount).scale))
}

/** Whether the amounts add up to exactly the total, whatever their decimals ("70.00" + "50" is "120.0"). */
export function addsUpTo(amounts: readonly string[], total: string): boolean {
  const scale = finestScale([...amounts, total])
  const sum = amounts.reduce((acc, amount) => acc + atScale(parse(amount), scale), 0n)
  return sum === atScale(parse(total), scale)
}

/** The total less the amounts, at the finest scale of them all: "100.00" less "10" is "90.00". */
export function amountLeft(total: string, spent: readonly string[]): string {
  const scale = finestScale([total, ...spent])
  const left = spent.reduce((acc, amount) => acc - atScale(parse(amount), scale), atScale(parse(total), scale))
  return format(left, scale)
}

/**
 * An amount split by a percentage (0 to 100): the first share rounded down to the amount's smallest unit, the
 * second the rest, so that the two always add up to the amount ("10.00" at "33.33" is "3.33" and "6.67").
 */
export function splitAmount(amount: string, percentage: string): [string, string] {
  const whole = parse(amount)
  const pct = parse(percentage)
  const share = (whole.units * pct.units) / (100n * 10n ** BigInt(pct.scale))
  return [format(share, whole.scale), format(whole.units - share, whole.scale)]
}
