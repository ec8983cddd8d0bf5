import { Router } from 'express'
import type { Metrics } from '../metrics/metrics.js'
import { errorBody } from './app-error.js'

/** GET {path}: the Prometheus text exposition of the service's registry. */
export function metricsRoutes({ metrics, path }: { metrics: Metrics; path: string }): Router {
  const router = Router()
  router.get(path, async (_req, res) => {
    try {
      const body = await metrics.registry.metrics()
      res.type(metrics.registry.contentType).send(body)
    } catch {
      // a gauge reads the database; when it is down, say so rather than serve half a scrape
      res.status(503).json(errorBody('database_unavailable', 'Metrics need the database; retry later'))
    }
  })
  return router
}
