// Progress of the demo for whoever watches it: on a terminal a bar redrawn in place; anywhere else (a pipe,
// a log file, CI) plain lines, about one per tenth of the run, so the output reads well when piped.
export interface ProgressBar {
  tick(label?: string): void
  done(): void
}

export function progressBar(total: number, stream: NodeJS.WritableStream & { isTTY?: boolean }, title: string): ProgressBar {
  let count = 0
  const width = 30
  const every = Math.max(1, Math.ceil(total / 10))
  const render = (label: string) => {
    const filled = Math.round((count / total) * width)
    stream.write(`\r${title} [${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${count}/${total} ${label}`.padEnd(100))
  }
  if (stream.isTTY) render('')
  return {
    tick: (label = '') => {
      count++
      if (stream.isTTY) render(label)
      else if (count % every === 0 && count < total) stream.write(`${title}: ${count}/${total}\n`)
    },
    done: () => {
      if (stream.isTTY) stream.write('\n')
      else stream.write(`${title}: ${count}/${total}\n`)
    },
  }
}
