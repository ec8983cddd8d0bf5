// Loaded into a service's process with `--import` by bench/alloc-profile.ts: V8's sampling heap profiler, counting
// every allocation sampled, those the collector has since freed included (most of a request's are). The first
// SIGUSR2 starts it, the second writes what it sampled to ALLOC_PROFILE_FILE (a .heapprofile, Chrome's format).
import { writeFileSync } from 'node:fs'
import { Session } from 'node:inspector'
import process from 'node:process'

const file = process.env.ALLOC_PROFILE_FILE
if (!file) throw new Error('alloc-sampler.mjs: ALLOC_PROFILE_FILE is not set')
const session = new Session()
session.connect()
let sampling = false
process.on('SIGUSR2', () => {
  if (!sampling) {
    sampling = true
    session.post('HeapProfiler.startSampling', {
      samplingInterval: Number(process.env.ALLOC_SAMPLING_BYTES ?? 8192),
      includeObjectsCollectedByMajorGC: true,
      includeObjectsCollectedByMinorGC: true,
    })
    return
  }
  sampling = false
  session.post('HeapProfiler.stopSampling', (error, result) => {
    if (error) throw error
    writeFileSync(file, JSON.stringify(result.profile))
  })
})
