import { Router } from 'express'
import type { Metrics } from '../metrics/metrics.js'
import { answerGetOnly } from './get-only.js'

/**
 * GET {path}: the Prometheus text exposition of the service's registry. Its database reads never fail a scrape
 * (metrics.ts: a gauge has no sample while its read fails), so a scrape that fails is a fault: the error handler
 * logs it and answers 500. It was answered 503 "Metrics need the database; retry later", with nothing logged.
 */
export function metricsRoutes({ metrics, path }: { metrics: Metrics; path: string }): Router {
  const router = Router()
  router.get(path, async (_req, res) => {
    const body = await metrics.registry.metrics()
    res.type(metrics.registry.contentType).send(body)
  })
  answerGetOnly(router, path)
  return router
}
