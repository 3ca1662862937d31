-- Named queries of the PostgreSQL backend. Each starts with a "-- name: NAME" line; the text
-- up to the next such line is the query. Parameters use psycopg's %(name)s style.

-- name: claim
-- Claim a batch of ticks in one round trip: insert each tick's row unless any replica has it;
-- then, for the ticks this call inserted that asked for it, take the job's advisory lock, but
-- only for the first such tick of a job in the batch, and only if no other started run of the
-- job is still heartbeating (a run whose replica lost its lock may still be going). CASE fixes
-- the evaluation order, so a lock is never taken and then forgotten. A tick asking for the
-- lock is inserted as started: if it is refused, it counts as running until it is recorded
-- skipped_overlap, which the claimant does at once.
WITH request AS MATERIALIZED (
    SELECT *
    FROM unnest(%(jobs)s::text[], %(ticks)s::timestamptz[], %(keys)s::bigint[], %(locks)s::bool[])
        AS r(job, scheduled_at, lock_key, want_lock)
), inserted AS (
    INSERT INTO replicron_runs
        (namespace, job, scheduled_at, replica_id, heartbeat_at, started_at)
    SELECT %(namespace)s, job, scheduled_at, %(replica)s, now(),
           CASE WHEN want_lock THEN now() END
    FROM request
    ON CONFLICT (namespace, job, scheduled_at) DO NOTHING
    RETURNING run_id, job, scheduled_at
), won AS MATERIALIZED (
    SELECT inserted.run_id, inserted.job, inserted.scheduled_at, request.lock_key,
           request.want_lock,
           row_number() OVER (PARTITION BY inserted.job, request.want_lock
                              ORDER BY inserted.scheduled_at) AS nth
    FROM inserted JOIN request USING (job, scheduled_at)
)
SELECT run_id, job, scheduled_at,
       CASE
           WHEN NOT want_lock THEN NULL
           WHEN nth > 1 THEN false
           WHEN NOT pg_try_advisory_lock(lock_key) THEN false
           WHEN EXISTS (
               SELECT 1 FROM replicron_runs other
               WHERE other.namespace = %(namespace)s AND other.job = won.job
                 AND other.outcome IS NULL AND other.started_at IS NOT NULL
                 AND other.heartbeat_at > now() - %(stale_after)s::interval
           ) THEN NOT pg_advisory_unlock(lock_key)
           ELSE true
       END AS locked
FROM won;

-- name: lock
-- Take the lock for a tick claimed earlier (a queued run), with the same overlap check, and
-- mark the tick started when it was taken.
WITH attempt AS MATERIALIZED (
    SELECT CASE
               WHEN NOT pg_try_advisory_lock(%(key)s::bigint) THEN false
               WHEN EXISTS (
                   SELECT 1 FROM replicron_runs other
                   WHERE other.namespace = %(namespace)s AND other.job = %(job)s
                     AND other.outcome IS NULL AND other.started_at IS NOT NULL
                     AND other.run_id <> %(run_id)s
                     AND other.heartbeat_at > now() - %(stale_after)s::interval
               ) THEN NOT pg_advisory_unlock(%(key)s::bigint)
               ELSE true
           END AS locked
), marked AS (
    UPDATE replicron_runs SET started_at = now(), heartbeat_at = now()
    WHERE run_id = %(run_id)s AND (SELECT locked FROM attempt)
    RETURNING 1
)
SELECT locked FROM attempt;

-- name: release
-- Record how a batch of claimed ticks ended and drop their jobs' locks, in one round trip.
WITH ended AS MATERIALIZED (
    SELECT *
    FROM unnest(%(jobs)s::text[], %(ticks)s::timestamptz[], %(outcomes)s::text[],
                %(started)s::timestamptz[], %(finished)s::timestamptz[], %(errors)s::text[])
        AS e(job, scheduled_at, outcome, started_at, finished_at, error)
), recorded AS (
    UPDATE replicron_runs run
    SET outcome = ended.outcome,
        started_at = coalesce(ended.started_at, run.started_at),
        finished_at = coalesce(ended.finished_at, now()),
        error = ended.error,
        heartbeat_at = NULL
    FROM ended
    WHERE run.namespace = %(namespace)s AND run.job = ended.job
      AND run.scheduled_at = ended.scheduled_at
    RETURNING run.job
)
SELECT (SELECT count(*) FROM recorded) AS recorded,
       ARRAY(SELECT pg_advisory_unlock(key)
             FROM unnest(%(unlock_keys)s::bigint[]) WITH ORDINALITY AS u(key, n)
             ORDER BY n) AS unlocked;

-- name: record_unclaimed
-- Record ticks nobody ran (missed) unless a replica already has the tick.
INSERT INTO replicron_runs
    (namespace, job, scheduled_at, replica_id, finished_at, outcome, error)
SELECT %(namespace)s, job, scheduled_at, %(replica)s, now(), outcome, error
FROM unnest(%(jobs)s::text[], %(ticks)s::timestamptz[], %(outcomes)s::text[], %(errors)s::text[])
    AS r(job, scheduled_at, outcome, error)
ON CONFLICT (namespace, job, scheduled_at) DO NOTHING
RETURNING job, scheduled_at;

-- name: heartbeat
-- Keep our open ticks fresh and list the advisory locks this session really holds.
WITH refreshed AS (
    UPDATE replicron_runs SET heartbeat_at = now()
    WHERE run_id = ANY(%(run_ids)s::bigint[]) AND outcome IS NULL
    RETURNING 1
)
SELECT (SELECT count(*) FROM refreshed) AS refreshed,
       coalesce(array_agg((classid::bigint << 32) | objid::bigint), '{}') AS held
FROM pg_locks
WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 1;

-- name: last_ticks
SELECT job, max(scheduled_at)
FROM replicron_runs
WHERE namespace = %(namespace)s AND job = ANY(%(jobs)s::text[])
GROUP BY job;

-- name: abandon_stale
-- Janitor: open ticks of replicas that stopped heartbeating are recorded abandoned.
UPDATE replicron_runs
SET outcome = 'abandoned', finished_at = now(),
    error = 'replica ' || replica_id || ' stopped heartbeating'
WHERE namespace = %(namespace)s AND outcome IS NULL
  AND coalesce(heartbeat_at, claimed_at) < now() - %(stale_after)s::interval
RETURNING job, scheduled_at, replica_id;

-- name: prune
-- Retention: delete finished rows older than the retention period, in bounded batches, always
-- keeping each job's latest row (catch-up reads it after long pauses).
DELETE FROM replicron_runs
WHERE run_id IN (
    SELECT run_id FROM replicron_runs old
    WHERE old.namespace = %(namespace)s AND old.outcome IS NOT NULL
      AND old.claimed_at < now() - %(retention)s::interval
      AND old.run_id <> (SELECT max(latest.run_id) FROM replicron_runs latest
                         WHERE latest.namespace = old.namespace AND latest.job = old.job)
    LIMIT %(batch)s
);

-- name: status
-- Per job: the latest finished run, the latest success, open runs and the number of misses.
SELECT job,
       (array_agg(replica_id ORDER BY scheduled_at DESC) FILTER (WHERE outcome IS NOT NULL))[1]
           AS last_replica,
       max(scheduled_at) FILTER (WHERE outcome IS NOT NULL) AS last_scheduled_at,
       (array_agg(started_at ORDER BY scheduled_at DESC) FILTER (WHERE outcome IS NOT NULL))[1]
           AS last_started_at,
       (array_agg(finished_at ORDER BY scheduled_at DESC) FILTER (WHERE outcome IS NOT NULL))[1]
           AS last_finished_at,
       (array_agg(outcome ORDER BY scheduled_at DESC) FILTER (WHERE outcome IS NOT NULL))[1]
           AS last_outcome,
       (array_agg(error ORDER BY scheduled_at DESC) FILTER (WHERE outcome IS NOT NULL))[1]
           AS last_error,
       max(finished_at) FILTER (WHERE outcome = 'succeeded') AS last_success_at,
       coalesce(array_agg(replica_id || ' ' || run_id ORDER BY run_id)
                FILTER (WHERE outcome IS NULL AND started_at IS NOT NULL), '{}') AS running,
       count(*) FILTER (WHERE outcome = 'missed') AS missed
FROM replicron_runs
WHERE namespace = %(namespace)s
GROUP BY job
ORDER BY job;
