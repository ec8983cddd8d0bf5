// A one-line progress bar for a terminal; on anything else it prints nothing until done().
export interface ProgressBar {
  tick(label?: string): void
  done(): void
}

export function progressBar(total: number, stream: NodeJS.WriteStream, title: string): ProgressBar {
  let count = 0
  const width = 30
  const render = (label: string) => {
    if (!stream.isTTY) return
    const filled = Math.round((count / total) * width)
    stream.write(`\r${title} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${count}/${total} ${label}`.padEnd(100))
  }
  render('')
  return {
    tick: (label = '') => {
      count++
      render(label)
    },
    done: () => {
      if (stream.isTTY) stream.write('\n')
      else stream.write(`${title}: ${count}/${total}\n`)
    },
  }
}
