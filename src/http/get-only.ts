import type { Router } from 'express'
import { errorBody } from './app-error.js'
import { leaveBodyUnread } from './expect-continue.js'

/**
 * After a path's GET route: any other method there is 405 `method_not_allowed` with `Allow: GET, HEAD`, and
 * OPTIONS 204 with the same Allow, where a PUT was a 404 (read as if the path were wrong) and an OPTIONS Express's
 * own 200.
 */
export function answerGetOnly(router: Router, path: string): void {
  router.all(path, (req, res) => {
    leaveBodyUnread(req, res)
    res.setHeader('Allow', 'GET, HEAD')
    if (req.method === 'OPTIONS') {
      res.status(204).end()
      return
    }
    res.status(405).json(errorBody('method_not_allowed', `${req.method} is not accepted here: this path answers GET`))
  })
}
