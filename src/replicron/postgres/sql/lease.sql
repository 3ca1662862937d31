-- Named queries of lease mode (PostgresBackend(coordination="lease")), run instead of their
-- advisory-mode namesakes in queries.sql. The ledger row is the lock: a claim inserts the tick's
-- row with its claimant, claim token, epoch and a lease on the database's clock; a job's lock
-- (overlap "skip"/"queue") is its row in replicron_job_locks, taken by a compare-and-set that
-- succeeds only when it is free or its lease ran out. Each statement is its own transaction and
-- none depends on the server session it runs on: any pooler may sit in between.

-- name: lease_claim
-- Claim a batch of ticks in one round trip, as "claim" does in advisory mode: insert each tick's
-- row unless any replica has it (or recognise the rows an earlier try of this claim inserted,
-- its answer lost: same claim token; one a janitor wrote off meanwhile is opened again in a new
-- epoch), with a lease of stale_after on the database's clock. A tick whose row is already
-- there when the statement starts (among peers, most ticks of an instant: their first replica
-- claimed them ahead) is not tried at all: no insert, no run id drawn, no wait on the unique
-- key; only a row committed meanwhile makes an insert conflict. Then, for the first tick of each
-- job in the batch that asked for the lock, take the job's lock row if it is free or its lease
-- ran out (a new epoch of the lock). Nothing before it is due by the database's clock (within
-- the claim-ahead margin; a manual run is due when asked for), nothing of a job that has started
-- its max_runs. Returns, per tick: its run, its status, the row's epoch, and for a refused lock
-- the replica holding it.
WITH request AS MATERIALIZED (
    SELECT *
    FROM unnest(%(jobs)s::text[], %(ticks)s::timestamptz[], %(locks)s::bool[],
                %(tokens)s::uuid[], %(manual)s::bool[], %(limits)s::int[])
        WITH ORDINALITY AS r(job, scheduled_at, want_lock, token, manual, max_runs, n)
), exhausted AS MATERIALIZED (
    SELECT limited.job
    FROM (
        SELECT job, min(max_runs) AS max_runs FROM request
        WHERE max_runs IS NOT NULL AND NOT manual
        GROUP BY job
        ORDER BY job  -- the same order in every claim: their locks cannot deadlock
    ) AS limited
    WHERE replicron_runs_reached(%(namespace)s, limited.job, limited.max_runs, %(tokens)s::uuid[])
), clock AS MATERIALIZED (
    SELECT clock_timestamp() + %(ahead)s::interval AS claimable_until
), paused AS MATERIALIZED (
    SELECT job FROM replicron_paused
    WHERE namespace = %(namespace)s AND job IN (SELECT job FROM request WHERE NOT manual)
), present AS MATERIALIZED (
    -- Each tick's row as the statement starts, if it has one, and whether it is this claim's
    -- own (an earlier try's, its answer lost). One probe of the tick's key per tick: LIMIT
    -- keeps it a probe, never a scan of all the namespace's rows, whatever the statistics say.
    SELECT request.n, had.run_id,
           had.claim_token = request.token AND (had.outcome IS NULL OR had.outcome = 'abandoned')
               AS ours
    FROM request LEFT JOIN LATERAL (
        SELECT run.run_id, run.claim_token, run.outcome FROM replicron_runs run
        WHERE run.namespace = %(namespace)s AND run.job = request.job
          AND run.scheduled_at = request.scheduled_at
        LIMIT 1
    ) AS had ON true
), inserted AS (
    INSERT INTO replicron_runs
        (namespace, job, scheduled_at, replica_id, heartbeat_at, started_at, claim_token,
         manual, outcome, finished_at, error, lease_until)
    SELECT %(namespace)s, job, scheduled_at, %(replica)s,
           CASE WHEN NOT held.paused THEN now() END,
           CASE WHEN want_lock AND NOT held.paused THEN now() END, token, manual,
           CASE WHEN held.paused THEN 'paused' END,
           CASE WHEN held.paused THEN now() END,
           CASE WHEN held.paused THEN 'the job is paused' END,
           CASE WHEN NOT held.paused THEN now() + %(stale_after)s::interval END
    FROM request CROSS JOIN clock JOIN present USING (n)
        CROSS JOIN LATERAL (SELECT NOT request.manual
                                   AND request.job IN (SELECT job FROM paused) AS paused) AS held
    WHERE present.run_id IS NULL  -- no row yet (this claim's own earlier try is "earlier"'s)
      AND (request.manual OR request.scheduled_at <= clock.claimable_until)
      AND (request.max_runs IS NULL OR request.manual
           OR request.job NOT IN (SELECT job FROM exhausted))
      AND NOT EXISTS (  -- a tick inside a range of missed ticks has its record there
               SELECT 1 FROM replicron_runs missed
               WHERE missed.namespace = %(namespace)s AND missed.job = request.job
                 AND missed.scheduled_through >= request.scheduled_at
                 AND missed.scheduled_at < request.scheduled_at)
    ORDER BY request.job, request.scheduled_at  -- one order in every claim (see "claim")
    ON CONFLICT (namespace, job, scheduled_at) DO NOTHING
    RETURNING run_id, job, scheduled_at, outcome IS NOT DISTINCT FROM 'paused' AS paused, epoch
), earlier AS (
    UPDATE replicron_runs run
    SET heartbeat_at = now(), lease_until = now() + %(stale_after)s::interval, outcome = NULL,
        finished_at = NULL, error = NULL,
        epoch = run.epoch + CASE WHEN run.outcome = 'abandoned' THEN 1 ELSE 0 END
    WHERE run.run_id = ANY(ARRAY(SELECT run_id FROM present WHERE ours))  -- by its key
    RETURNING run.run_id, run.job, run.scheduled_at, false AS paused, run.epoch
), won AS MATERIALIZED (
    SELECT mine.run_id, mine.job, mine.scheduled_at, mine.paused, mine.epoch,
           request.want_lock AND NOT mine.paused AS want_lock,
           row_number() OVER (PARTITION BY mine.job, request.want_lock AND NOT mine.paused
                              ORDER BY mine.scheduled_at) AS nth
    FROM (SELECT * FROM inserted UNION ALL SELECT * FROM earlier) AS mine
        JOIN request USING (job, scheduled_at)
), locked AS (
    -- Free, or its lease ran out: a compare-and-set on the lock's row (the conflicting row is
    -- read as committed, and the condition checked on it, whatever this statement's snapshot).
    INSERT INTO replicron_job_locks AS held (namespace, job, run_id, replica_id, epoch, lease_until)
    SELECT %(namespace)s, won.job, won.run_id, %(replica)s, 1,
           now() + %(stale_after)s::interval
    FROM won
    WHERE won.want_lock AND won.nth = 1
    ORDER BY won.job  -- one order in every claim: two cannot wait on each other
    ON CONFLICT (namespace, job) DO UPDATE
    SET run_id = excluded.run_id, replica_id = excluded.replica_id, epoch = held.epoch + 1,
        lease_until = excluded.lease_until
    WHERE held.run_id IS NULL OR held.run_id = excluded.run_id OR held.lease_until <= now()
    RETURNING held.run_id
), decided AS MATERIALIZED (
    SELECT request.n, request.job, request.scheduled_at, won.run_id, won.epoch,
           CASE
               WHEN won.run_id IS NULL AND NOT request.manual
                    AND request.scheduled_at > clock.claimable_until THEN 'early'
               WHEN won.run_id IS NULL AND request.max_runs IS NOT NULL AND NOT request.manual
                    AND request.job IN (SELECT job FROM exhausted) THEN 'exhausted'
               WHEN won.run_id IS NULL THEN 'taken'
               WHEN won.paused THEN 'paused'
               WHEN NOT won.want_lock THEN 'claimed'
               WHEN won.run_id IN (SELECT run_id FROM locked) THEN 'locked_claimed'
               ELSE 'locked'
           END AS status
    FROM request CROSS JOIN clock LEFT JOIN won USING (job, scheduled_at)
)
SELECT decided.job, decided.scheduled_at, decided.run_id, decided.status, holder.replica_id,
       decided.epoch
FROM decided
LEFT JOIN LATERAL (
    SELECT held.replica_id FROM replicron_job_locks held
    WHERE decided.status = 'locked' AND held.namespace = %(namespace)s
      AND held.job = decided.job
) AS holder ON true
ORDER BY decided.n;

-- name: lease_lock
-- Take the job's lock for a tick claimed earlier (a queued run) by the same compare-and-set,
-- and mark the run started under a fresh lease; only while the run's row is still open in the
-- epoch its claimant holds.
WITH run AS MATERIALIZED (
    SELECT run_id FROM replicron_runs
    WHERE run_id = %(run_id)s AND epoch = %(epoch)s AND outcome IS NULL
    FOR UPDATE
), locked AS (
    INSERT INTO replicron_job_locks AS held (namespace, job, run_id, replica_id, epoch, lease_until)
    SELECT %(namespace)s, %(job)s, run.run_id, %(replica)s, 1, now() + %(stale_after)s::interval
    FROM run
    ON CONFLICT (namespace, job) DO UPDATE
    SET run_id = excluded.run_id, replica_id = excluded.replica_id, epoch = held.epoch + 1,
        lease_until = excluded.lease_until
    WHERE held.run_id IS NULL OR held.run_id = excluded.run_id OR held.lease_until <= now()
    RETURNING held.run_id
), marked AS (
    UPDATE replicron_runs
    SET started_at = now(), heartbeat_at = now(), lease_until = now() + %(stale_after)s::interval
    WHERE run_id IN (SELECT run_id FROM locked)
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM locked);

-- name: lease_release
-- Record how a batch of claimed ticks ended and free their jobs' locks, in one round trip, as
-- "release" does in advisory mode, but each outcome only onto its claimant's row in the epoch the
-- claimant holds, while it is open (or already has this same outcome: a retried write); a row a
-- janitor wrote off is in a newer epoch and keeps what the janitor recorded. A lock is freed
-- only while it is still this run's. Per record: whether it was written and the outcome it found.
WITH ended AS MATERIALIZED (
    SELECT *
    FROM unnest(%(run_ids)s::bigint[], %(jobs)s::text[], %(ticks)s::timestamptz[],
                %(outcomes)s::text[], %(started)s::timestamptz[], %(finished)s::timestamptz[],
                %(errors)s::text[], %(epochs)s::int[])
        WITH ORDINALITY AS e(run_id, job, scheduled_at, outcome, started_at, finished_at, error,
                             epoch, n)
), target AS MATERIALIZED (
    SELECT ended.n, run.run_id, run.found, run.epoch
    FROM ended CROSS JOIN LATERAL (
        SELECT mine.run_id, mine.outcome AS found, mine.epoch
        FROM replicron_runs mine
        WHERE mine.namespace = %(namespace)s AND mine.job = ended.job
          AND mine.scheduled_at = ended.scheduled_at
          AND (ended.run_id IS NULL OR mine.run_id = ended.run_id)
          AND mine.replica_id = %(replica)s
        ORDER BY mine.run_id
        FOR UPDATE
    ) AS run
), recorded AS (
    UPDATE replicron_runs run
    SET outcome = ended.outcome,
        -- A tick missed or skipped never started (a claim that wanted the lock stamped one).
        started_at = CASE WHEN ended.outcome IN ('missed', 'skipped_overlap', 'skipped_limit')
                          THEN NULL
                          ELSE coalesce(ended.started_at, run.started_at) END,
        finished_at = coalesce(ended.finished_at, now()),
        error = ended.error,
        heartbeat_at = NULL, lease_until = NULL
    FROM target JOIN ended USING (n)
    WHERE run.run_id = target.run_id
      AND (ended.epoch IS NULL OR target.epoch = ended.epoch)
      AND (target.found IS NULL OR target.found = ended.outcome)
    RETURNING target.n
), freed AS (
    UPDATE replicron_job_locks held
    SET run_id = NULL, replica_id = NULL, lease_until = NULL
    FROM (
        SELECT job, run_id FROM replicron_job_locks
        WHERE namespace = %(namespace)s AND run_id = ANY(%(unlock_runs)s::bigint[])
        ORDER BY job  -- the claims' order (see lease_heartbeat)
        FOR UPDATE
    ) AS ordered
    WHERE held.namespace = %(namespace)s AND held.job = ordered.job
      AND held.run_id = ANY(%(unlock_runs)s::bigint[])
    RETURNING ordered.run_id  -- the run it was (RETURNING held.run_id is the NULL set)
)
SELECT ARRAY(SELECT n IN (SELECT n FROM recorded) FROM ended ORDER BY n) AS written,
       ARRAY(SELECT target.found FROM ended LEFT JOIN target USING (n) ORDER BY ended.n) AS found,
       ARRAY(SELECT run_id = ANY(ARRAY(SELECT run_id FROM freed))
             FROM unnest(%(unlock_runs)s::bigint[]) WITH ORDINALITY AS u(run_id, n)
             ORDER BY n) AS unlocked;

-- name: lease_heartbeat
-- Renew every lease this replica holds in one statement: its open rows (compare-and-set on
-- claimant and epoch) and the job locks its runs hold (on the run that holds each), each only
-- while its lease has not run out: a lease that ran out stays out (a janitor writes the row
-- off, a claim may take the lock, max_runs counts the row as a run), even when its holder
-- wakes before either happened. Note the replica as seen; return the database's clock, the
-- runs whose row was renewed, the runs whose lock was renewed, the replicas of the namespace
-- seen lately, in leader mode the lease's holder and epoch after its compare-and-set, and the
-- server's identity.
WITH mine AS MATERIALIZED (
    SELECT * FROM unnest(%(run_ids)s::bigint[], %(epochs)s::int[]) AS m(run_id, epoch)
), refreshed AS (
    UPDATE replicron_runs run
    SET heartbeat_at = now(), lease_until = now() + %(stale_after)s::interval
    FROM mine
    WHERE run.run_id = mine.run_id AND run.epoch = mine.epoch AND run.outcome IS NULL
      AND run.replica_id = %(replica)s
      AND coalesce(run.lease_until,
                   coalesce(run.heartbeat_at, run.claimed_at) + %(stale_after)s::interval)
          >= now()
    RETURNING run.run_id
), relocked AS (
    UPDATE replicron_job_locks held
    SET lease_until = now() + %(stale_after)s::interval
    FROM (
        SELECT job FROM replicron_job_locks
        WHERE namespace = %(namespace)s AND run_id = ANY(%(locked_runs)s::bigint[])
          AND replica_id = %(replica)s AND lease_until > now()
        -- In job order, as a claim takes them: not in the order the rows lie in the table,
        -- else each would hold a row the other waits for (a deadlock).
        ORDER BY job
        FOR UPDATE
    ) AS ordered
    WHERE held.namespace = %(namespace)s AND held.job = ordered.job
      AND held.run_id = ANY(%(locked_runs)s::bigint[]) AND held.replica_id = %(replica)s
      AND held.lease_until > now()
    RETURNING held.run_id
), seen AS (
    INSERT INTO replicron_replicas AS r
        (namespace, replica_id, backend_pid, clock_offset_ms, last_seen, stale_after,
         coordination)
    VALUES (%(namespace)s, %(replica)s, NULL, %(offset_ms)s, now(), %(stale_after)s::interval,
            'lease')
    ON CONFLICT (namespace, replica_id) DO UPDATE
    SET backend_pid = NULL, clock_offset_ms = excluded.clock_offset_ms,
        last_seen = excluded.last_seen, stale_after = excluded.stale_after,
        -- A replica that is leaving (it claims no more; its last runs finish) stays gone.
        stopped_at = CASE WHEN %(leaving)s::boolean THEN coalesce(r.stopped_at, now()) END,
        coordination = excluded.coordination,
        started_at = CASE WHEN (r.stopped_at IS NOT NULL AND NOT %(leaving)s::boolean)
                            OR r.last_seen <= now() - coalesce(r.stale_after,
                                                               excluded.stale_after)
                          THEN now() ELSE r.started_at END
), leader AS MATERIALIZED (
    -- Leader mode, while this replica contends: the lease's compare-and-set rides along.
    SELECT * FROM replicron_lead(%(namespace)s, %(replica)s, %(leader_lease)s::interval)
    WHERE %(contending)s::boolean
)
SELECT clock_timestamp(),
       ARRAY(SELECT run_id FROM refreshed) AS refreshed,
       ARRAY(SELECT run_id FROM relocked) AS relocked,
       ARRAY(SELECT replica_id FROM replicron_replicas
             WHERE namespace = %(namespace)s AND stopped_at IS NULL
               AND last_seen > now() - coalesce(stale_after, %(stale_after)s::interval))
       AS peers,
       (SELECT holder FROM leader), (SELECT epoch FROM leader),
       -- The server's identity (see server_identity in failover.sql): a failover changes it.
       (SELECT system_identifier FROM pg_control_system()),
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int;

-- name: lease_abandon_stale
-- Janitor: open rows whose lease ran out (or, with no lease, whose heartbeat went stale) are
-- recorded abandoned in a new epoch, so their claimant can write nothing more to them, and the
-- job locks they held are freed. Rows locked one order, run id, in every janitor. The row's
-- finished_at is its lease's end: when its claimant's hold on the tick ended (a locked run also
-- stops itself by then, and a takeover starts after it), not when the janitor came by.
WITH stale AS MATERIALIZED (
    SELECT run_id FROM replicron_runs
    WHERE namespace = %(namespace)s AND outcome IS NULL
      AND coalesce(lease_until, coalesce(heartbeat_at, claimed_at) + %(stale_after)s::interval)
          < now()
    ORDER BY run_id
    FOR UPDATE SKIP LOCKED
), abandoned AS (
    UPDATE replicron_runs run
    SET outcome = 'abandoned', finished_at = coalesce(run.lease_until, now()),
        epoch = run.epoch + 1, lease_until = NULL,
        error = 'replica ' || run.replica_id || ' stopped renewing its lease'
    FROM stale
    WHERE run.run_id = stale.run_id
    RETURNING run.run_id, run.job, run.scheduled_at, run.replica_id
), freed AS (
    UPDATE replicron_job_locks held
    SET run_id = NULL, replica_id = NULL, lease_until = NULL
    FROM (
        SELECT job FROM replicron_job_locks
        WHERE namespace = %(namespace)s AND run_id IN (SELECT run_id FROM abandoned)
        ORDER BY job  -- the claims' order (see lease_heartbeat)
        FOR UPDATE
    ) AS ordered
    WHERE held.namespace = %(namespace)s AND held.job = ordered.job
      AND held.run_id IN (SELECT run_id FROM abandoned)
)
SELECT job, scheduled_at, replica_id FROM abandoned;

-- name: lease_free
-- At close: free the job locks these runs of this replica still hold (a run that outlived its
-- timeout keeps its lock until then; a closed handle keeps none).
UPDATE replicron_job_locks
SET run_id = NULL, replica_id = NULL, lease_until = NULL
WHERE namespace = %(namespace)s AND run_id = ANY(%(run_ids)s::bigint[])
  AND replica_id = %(replica)s
RETURNING job;
