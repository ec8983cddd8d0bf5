// Deliveries this process has seen stored, so a retry of one is answered without a database round
// trip. A delivery is its id and the SHA-256 of its body: the same id with another body is not a retry
// (it is a reused id, which the database stores and applies), so both are remembered together. Only
// deliveries whose row is committed are added (after the statement that stored it, or found it stored,
// returned), so a hit is always a true duplicate; a miss just takes the normal path, where the database
// decides. The platform retries what it thinks timed out, often many times: those retries are the hits.
// Bounded: the least recently seen delivery is forgotten first.
export class SeenDeliveries {
  // a Set iterates in insertion order: re-adding a key moves it to the end, the first is the oldest
  private readonly keys = new Set<string>()

  constructor(private readonly capacity: number) {}

  has(deliveryId: string, bodySha256: string): boolean {
    return this.keys.has(keyOf(deliveryId, bodySha256))
  }

  add(deliveryId: string, bodySha256: string): void {
    if (this.capacity === 0) return
    const key = keyOf(deliveryId, bodySha256)
    this.keys.delete(key)
    this.keys.add(key)
    if (this.keys.size > this.capacity) this.keys.delete(this.keys.values().next().value!)
  }

  get size(): number {
    return this.keys.size
  }
}

// a delivery id is printable ASCII (no space): the space cannot occur inside either part
function keyOf(deliveryId: string, bodySha256: string): string {
  return `${deliveryId} ${bodySha256}`
}
