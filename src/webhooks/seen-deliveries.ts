// Delivery ids this process has seen stored, so a retry of one is answered without a database round
// trip. Only ids whose row is committed are added (after the statement that stored it, or found it
// stored, returned), so a hit is always a true duplicate; a miss just takes the normal path, where the
// database decides. The platform retries what it thinks timed out, often many times: those retries
// are the hits. Bounded: the least recently seen id is forgotten first.
export class SeenDeliveries {
  // a Set iterates in insertion order: re-adding an id moves it to the end, the first is the oldest
  private readonly ids = new Set<string>()

  constructor(private readonly capacity: number) {}

  has(deliveryId: string): boolean {
    return this.ids.has(deliveryId)
  }

  add(deliveryId: string): void {
    if (this.capacity === 0) return
    this.ids.delete(deliveryId)
    this.ids.add(deliveryId)
    if (this.ids.size > this.capacity) this.ids.delete(this.ids.values().next().value!)
  }

  get size(): number {
    return this.ids.size
  }
}
