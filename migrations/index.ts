// Every migration, in order. A static list (rather than a folder scan) works the same under tsx, from
// the compiled dist/ and inside the Docker image. Add a new file here with the next number.
import type { Migration } from 'kysely/migration'
import * as initial from './0001_initial.js'
import * as visitedStatusesAndBodyHash from './0002_visited_statuses_and_body_hash.js'
import * as consoleIndexes from './0003_console_indexes.js'
import * as reactionOutbox from './0004_reaction_outbox.js'
import * as consoleReactionIndexes from './0005_console_reaction_indexes.js'
import * as deliveryTradeReference from './0006_delivery_trade_reference.js'
import * as retention from './0007_retention.js'
import * as timeOrderedEventIds from './0008_time_ordered_event_ids.js'
import * as reactionStreams from './0009_reaction_streams.js'
import * as doneJobsOutOfTheStateIndex from './0010_done_jobs_out_of_the_state_index.js'
import * as reactionStreamBatches from './0011_reaction_stream_batches.js'
import * as reconcileRunClockOffset from './0012_reconcile_run_clock_offset.js'
import * as unresolvedTradeCreates from './0013_unresolved_trade_creates.js'
import * as unappliedDeliverySearch from './0014_unapplied_delivery_search.js'
import * as tradeCreateWait from './0015_trade_create_wait.js'
import * as reactionStreamTypes from './0016_reaction_stream_types.js'
import * as replayedBodies from './0017_replayed_bodies.js'
import * as orderPartnerEnv from './0018_order_partner_env.js'
import * as deliveryOrderVersion from './0019_delivery_order_version.js'
import * as pollDueSince from './0020_poll_due_since.js'
import * as pollDueSinceOfOlderPollers from './0021_poll_due_since_of_older_pollers.js'
import * as reactionJobOutcomeToken from './0022_reaction_job_outcome_token.js'

export const migrations: Record<string, Migration> = {
  '0001_initial': initial,
  '0002_visited_statuses_and_body_hash': visitedStatusesAndBodyHash,
  '0003_console_indexes': consoleIndexes,
  '0004_reaction_outbox': reactionOutbox,
  '0005_console_reaction_indexes': consoleReactionIndexes,
  '0006_delivery_trade_reference': deliveryTradeReference,
  '0007_retention': retention,
  '0008_time_ordered_event_ids': timeOrderedEventIds,
  '0009_reaction_streams': reactionStreams,
  '0010_done_jobs_out_of_the_state_index': doneJobsOutOfTheStateIndex,
  '0011_reaction_stream_batches': reactionStreamBatches,
  '0012_reconcile_run_clock_offset': reconcileRunClockOffset,
  '0013_unresolved_trade_creates': unresolvedTradeCreates,
  '0014_unapplied_delivery_search': unappliedDeliverySearch,
  '0015_trade_create_wait': tradeCreateWait,
  '0016_reaction_stream_types': reactionStreamTypes,
  '0017_replayed_bodies': replayedBodies,
  '0018_order_partner_env': orderPartnerEnv,
  '0019_delivery_order_version': deliveryOrderVersion,
  '0020_poll_due_since': pollDueSince,
  '0021_poll_due_since_of_older_pollers': pollDueSinceOfOlderPollers,
  '0022_reaction_job_outcome_token': reactionJobOutcomeToken,
}
