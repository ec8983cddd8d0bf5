// One body at a time per delivery id, in this process: the bodies sent under one id are stored one after
// another, whatever path stores each (the group commit for a trade event, its own transaction for an event
// that changes no order, an invalid one or one whose data the database refused), so each sees the bodies
// stored before it and a reused id is reported once. Without it, a trade event and a seller event under one
// id, arriving together, were each stored while the other was in flight, neither saw the other, and the
// reuse went unreported. Different ids never wait for each other.
export class DeliveryIdTurns {
  // per id with a body being stored: the promise that settles when the last body queued under it has had its
  // turn, and how many are queued (one map read and write a delivery on the hot path; gone when none is left)
  private readonly turns = new Map<string, { last: Promise<void>; queued: number }>()

  /** Runs `work` once every body queued earlier under this id has had its turn. */
  async run<T>(deliveryId: string, work: () => Promise<T>): Promise<T> {
    let finished!: () => void
    // settles only after this body's work, which starts only after the one before settled: the queue's end
    const mine = new Promise<void>((resolve) => {
      finished = resolve
    })
    let turn = this.turns.get(deliveryId)
    const previous = turn?.last
    if (turn) {
      turn.last = mine
      turn.queued += 1
    } else {
      turn = { last: mine, queued: 1 }
      this.turns.set(deliveryId, turn)
    }
    try {
      if (previous) await previous
      return await work()
    } finally {
      finished()
      turn.queued -= 1
      if (turn.queued === 0) this.turns.delete(deliveryId)
    }
  }

  /** How many bodies under this id are being stored or wait for their turn (0: none). */
  waiting(deliveryId: string): number {
    return this.turns.get(deliveryId)?.queued ?? 0
  }
}
