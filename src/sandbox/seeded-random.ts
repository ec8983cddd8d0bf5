import { createHash } from 'node:crypto'

// A small seeded PRNG (mulberry32): a sequence that repeats exactly for a given seed.
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0
  return () => {
    state = (state + 0x6d2b79f5) >>> 0
    let t = state
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296
  }
}

/**
 * A number in [0, 1) that depends on the seed and the key alone: the same for the same two, whatever was drawn
 * before. Faults drawn so do not depend on the order concurrent work happens to reach them.
 */
export function keyedDraw(seed: number, key: string): number {
  return createHash('sha256').update(`${seed >>> 0}\u0000${key}`).digest().readUInt32BE(0) / 4_294_967_296
}
