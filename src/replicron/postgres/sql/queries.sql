-- Named queries of the PostgreSQL backend. Each starts with a "-- name: NAME" line; the text
-- up to the next such line is the query. Parameters use psycopg's %(name)s style.

-- name: claim
-- Claim a batch of ticks in one round trip: insert each tick's row unless any replica has it (or
-- recognise, and refresh, the rows an earlier try of this same claim inserted, its reply lost with
-- its session: same claim token per tick). A tick whose row is already there when the statement
-- starts (among peers, most ticks of an instant) is not tried at all: no insert, no run id
-- drawn; only a row committed meanwhile makes an insert conflict. Then, for the ticks won that asked for it, take the
-- job's advisory lock, but only for the first such tick of a job in the batch, and only if no other
-- started run of the job is still heartbeating (a run whose replica lost its lock may still be
-- going). Nothing is inserted or locked on a server session other than the lock session's (a
-- transaction pooler moved the statement), and no tick is claimed before it is due by the
-- database's clock (within the claim-ahead margin; a manual run is due when asked for), and
-- none of a job that has started its max_runs scheduled runs (see replicron_runs_reached;
-- nothing is recorded: the job has no more ticks). A try whose answer was lost may have been
-- written off by a janitor meanwhile (abandoned, though nothing ran): its row is opened again.
-- CASE fixes the evaluation order, so a lock is never taken and then forgotten. A tick asking
-- for the lock is inserted as started: if it is refused, it counts as running (for the overlap
-- check) until it is recorded skipped_overlap, which the claimant does at once. For a refused
-- lock, the freshest other open run of the job is returned: its replica, whether its
-- heartbeat is stale, and the server session holding the lock.
WITH request AS MATERIALIZED (
    SELECT *
    FROM unnest(%(jobs)s::text[], %(ticks)s::timestamptz[], %(keys)s::bigint[], %(locks)s::bool[],
                %(tokens)s::uuid[], %(manual)s::bool[], %(limits)s::int[])
        WITH ORDINALITY AS r(job, scheduled_at, lock_key, want_lock, token, manual, max_runs, n)
), exhausted AS MATERIALIZED (
    -- Counted per limited job, one claim of the job after another (see the function).
    SELECT limited.job
    FROM (
        SELECT job, min(max_runs) AS max_runs FROM request
        WHERE max_runs IS NOT NULL AND NOT manual
        GROUP BY job
        ORDER BY job  -- the same order in every claim: their locks cannot deadlock
    ) AS limited
    WHERE replicron_runs_reached(%(namespace)s, limited.job, limited.max_runs, %(tokens)s::uuid[])
), session AS MATERIALIZED (
    SELECT (pg_backend_pid() = %(pid)s
            AND current_setting('replicron.session_token', true) = %(session_token)s) AS ours,
           clock_timestamp() + %(ahead)s::interval AS claimable_until
), paused AS MATERIALIZED (
    -- Read in the claim itself: a pause committed before it is honoured by it.
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
    -- A tick of a paused job is claimed like any other, and recorded paused at once.
    INSERT INTO replicron_runs
        (namespace, job, scheduled_at, replica_id, heartbeat_at, started_at, claim_token,
         lock_key, backend_pid, manual, outcome, finished_at, error)
    SELECT %(namespace)s, job, scheduled_at, %(replica)s,
           CASE WHEN NOT held.paused THEN now() END,
           CASE WHEN want_lock AND NOT held.paused THEN now() END, token, lock_key,
           pg_backend_pid(), manual, CASE WHEN held.paused THEN 'paused' END,
           CASE WHEN held.paused THEN now() END,
           CASE WHEN held.paused THEN 'the job is paused' END
    FROM request CROSS JOIN session JOIN present USING (n)
        CROSS JOIN LATERAL (SELECT NOT request.manual
                                   AND request.job IN (SELECT job FROM paused) AS paused) AS held
    WHERE session.ours
      AND present.run_id IS NULL  -- no row yet (this claim's own earlier try is "earlier"'s)
      AND (request.manual OR request.scheduled_at <= session.claimable_until)
      AND (request.max_runs IS NULL OR request.manual
           OR request.job NOT IN (SELECT job FROM exhausted))
      AND NOT EXISTS (  -- a tick inside a range of missed ticks has its record there
               SELECT 1 FROM replicron_runs missed
               WHERE missed.namespace = %(namespace)s AND missed.job = request.job
                 AND missed.scheduled_through >= request.scheduled_at
                 AND missed.scheduled_at < request.scheduled_at)
    -- One order in every claim and record: an insert waits for another transaction's
    -- uncommitted row of the same tick, and two claims waiting on each other deadlock.
    ORDER BY request.job, request.scheduled_at
    ON CONFLICT (namespace, job, scheduled_at) DO NOTHING
    RETURNING run_id, job, scheduled_at, outcome IS NOT DISTINCT FROM 'paused' AS paused
), earlier AS (
    -- Its heartbeat is stamped anew: the run starts now, and its lease with this statement.
    UPDATE replicron_runs run
    SET heartbeat_at = now(), backend_pid = pg_backend_pid(), outcome = NULL,
        finished_at = NULL, error = NULL
    WHERE run.run_id = ANY(ARRAY(SELECT run_id FROM present WHERE ours))  -- by its key
      AND (SELECT ours FROM session)
    RETURNING run.run_id, run.job, run.scheduled_at, false AS paused
), won AS MATERIALIZED (
    SELECT mine.run_id, mine.job, mine.scheduled_at, mine.paused, request.lock_key,
           request.want_lock AND NOT mine.paused AS want_lock,
           row_number() OVER (PARTITION BY mine.job, request.want_lock AND NOT mine.paused
                              ORDER BY mine.scheduled_at) AS nth
    FROM (SELECT * FROM inserted UNION ALL SELECT * FROM earlier) AS mine
        JOIN request USING (job, scheduled_at)
), decided AS MATERIALIZED (
    SELECT request.n, request.job, request.scheduled_at, request.lock_key, won.run_id,
           CASE
               WHEN NOT session.ours THEN 'moved'
               WHEN won.run_id IS NULL AND NOT request.manual
                    AND request.scheduled_at > session.claimable_until THEN 'early'
               WHEN won.run_id IS NULL AND request.max_runs IS NOT NULL AND NOT request.manual
                    AND request.job IN (SELECT job FROM exhausted) THEN 'exhausted'
               WHEN won.run_id IS NULL THEN 'taken'
               WHEN won.paused THEN 'paused'
               WHEN NOT won.want_lock THEN 'claimed'
               WHEN won.nth > 1 THEN 'locked'
               WHEN NOT pg_try_advisory_lock(won.lock_key) THEN 'locked'
               WHEN EXISTS (
                   SELECT 1 FROM replicron_runs other
                   WHERE other.namespace = %(namespace)s AND other.job = won.job
                     AND other.outcome IS NULL AND other.started_at IS NOT NULL
                     AND other.run_id <> won.run_id
                     AND other.heartbeat_at > now() - %(stale_after)s::interval
               ) THEN CASE WHEN pg_advisory_unlock(won.lock_key) THEN 'locked' ELSE 'locked' END
               ELSE 'locked_claimed'
           END AS status
    FROM request CROSS JOIN session LEFT JOIN won USING (job, scheduled_at)
)
SELECT decided.job, decided.scheduled_at, decided.run_id, decided.status,
       blocker.replica_id, blocker.stale, holder.pid
FROM decided
LEFT JOIN LATERAL (
    SELECT other.replica_id, other.heartbeat_at <= now() - %(stale_after)s::interval AS stale
    FROM replicron_runs other
    WHERE decided.status = 'locked' AND other.namespace = %(namespace)s
      AND other.job = decided.job AND other.outcome IS NULL AND other.started_at IS NOT NULL
      AND other.run_id IS DISTINCT FROM decided.run_id
    ORDER BY other.heartbeat_at DESC NULLS LAST
    LIMIT 1
) AS blocker ON true
LEFT JOIN LATERAL (
    SELECT l.pid
    FROM replicron_advisory_locks() l
    WHERE decided.status = 'locked' AND l.lock_key = decided.lock_key
    LIMIT 1
) AS holder ON true
ORDER BY decided.n;

-- name: lock
-- Take the lock for a tick claimed earlier (a queued run), with the same overlap check, and
-- mark the tick started when it was taken; nothing on a server session other than ours.
WITH attempt AS MATERIALIZED (
    SELECT CASE
               WHEN NOT (pg_backend_pid() = %(pid)s
                         AND current_setting('replicron.session_token', true)
                             = %(session_token)s) THEN NULL
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
    UPDATE replicron_runs
    SET started_at = now(), heartbeat_at = now(), lock_key = %(key)s::bigint,
        backend_pid = pg_backend_pid()
    WHERE run_id = %(run_id)s AND (SELECT locked FROM attempt)
    RETURNING 1
)
SELECT locked FROM attempt;

-- name: release
-- Record how a batch of claimed ticks ended and drop their jobs' locks, in one round trip.
-- Each outcome is written to the claimant's own row (by run id where there is one) and never
-- over another outcome, except "abandoned" written by a janitor while the run went on (the
-- claimant logs that it replaced it), or the same outcome (a retried write). Per record:
-- whether it was written and the outcome it found.
WITH ended AS MATERIALIZED (
    SELECT *
    FROM unnest(%(run_ids)s::bigint[], %(jobs)s::text[], %(ticks)s::timestamptz[],
                %(outcomes)s::text[], %(started)s::timestamptz[], %(finished)s::timestamptz[],
                %(errors)s::text[])
        WITH ORDINALITY AS e(run_id, job, scheduled_at, outcome, started_at, finished_at, error, n)
), target AS MATERIALIZED (
    -- One index lookup per record (LATERAL), never a scan of the job's history.
    SELECT ended.n, run.run_id, run.found
    FROM ended CROSS JOIN LATERAL (
        SELECT mine.run_id, mine.outcome AS found
        FROM replicron_runs mine
        WHERE mine.namespace = %(namespace)s AND mine.job = ended.job
          AND mine.scheduled_at = ended.scheduled_at
          AND (ended.run_id IS NULL OR mine.run_id = ended.run_id)
          AND mine.replica_id = %(replica)s
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
        heartbeat_at = NULL
    FROM target JOIN ended USING (n)
    WHERE run.run_id = target.run_id
      AND (target.found IS NULL OR target.found = 'abandoned' OR target.found = ended.outcome)
    RETURNING target.n
)
SELECT ARRAY(SELECT n IN (SELECT n FROM recorded) FROM ended ORDER BY n) AS written,
       ARRAY(SELECT target.found FROM ended LEFT JOIN target USING (n) ORDER BY ended.n) AS found,
       ARRAY(SELECT CASE WHEN pg_backend_pid() = %(pid)s
                              AND current_setting('replicron.session_token', true)
                                  = %(session_token)s
                         THEN pg_advisory_unlock(key) END
             FROM unnest(%(unlock_keys)s::bigint[]) WITH ORDINALITY AS u(key, n)
             ORDER BY n) AS unlocked;

-- name: record_unclaimed
-- Record ticks nobody ran (missed) unless a replica already has the tick, but none not yet due
-- by the database's clock ("early": this replica's clock runs ahead), nor any of a job that has
-- started its max_runs after its last scheduled run (it has no more ticks; those before that run
-- fell due while it had, and are recorded). A tick whose row this replica inserted with a
-- claim whose answer was lost (same token, no outcome, or abandoned by a janitor though
-- nothing ran) gets the outcome. Returns each tick this call (or an earlier try of it)
-- recorded, and each early one.
WITH request AS MATERIALIZED (
    SELECT *
    FROM unnest(%(jobs)s::text[], %(ticks)s::timestamptz[], %(outcomes)s::text[],
                %(errors)s::text[], %(tokens)s::uuid[], %(limits)s::int[])
        AS r(job, scheduled_at, outcome, error, token, max_runs)
), session AS MATERIALIZED (
    SELECT clock_timestamp() + %(ahead)s::interval AS recordable_until
), finished AS MATERIALIZED (
    -- A job that has started its max_runs, and its last scheduled run (counted as
    -- replicron_runs_reached counts them): its ticks after that one are not ticks.
    SELECT jobs.job,
           (SELECT max(run.scheduled_at) FROM replicron_runs run
            WHERE run.namespace = %(namespace)s AND run.job = jobs.job AND NOT run.manual
              AND NOT coalesce(run.claim_token = ANY(%(tokens)s::uuid[]), false)
              AND (run.outcome IS NULL
                   OR run.outcome IN ('succeeded', 'failed', 'timed_out', 'abandoned')))
               AS last_run
    FROM (
        SELECT job, min(max_runs) AS max_runs FROM request
        WHERE max_runs IS NOT NULL
        GROUP BY job
        ORDER BY job  -- the same order as the claims': their locks cannot deadlock
    ) AS jobs
    WHERE replicron_runs_reached(%(namespace)s, jobs.job, jobs.max_runs, %(tokens)s::uuid[])
), due AS MATERIALIZED (
    SELECT request.* FROM request, session
    WHERE scheduled_at <= session.recordable_until
      AND NOT EXISTS (
          SELECT 1 FROM finished
          WHERE finished.job = request.job
            AND request.scheduled_at > coalesce(finished.last_run, '-infinity'))
), inserted AS (
    INSERT INTO replicron_runs
        (namespace, job, scheduled_at, replica_id, finished_at, outcome, error, claim_token)
    SELECT %(namespace)s, job, scheduled_at, %(replica)s, now(), outcome, error, token
    FROM due
    WHERE NOT EXISTS (  -- a tick inside a range of missed ticks has its record there
        SELECT 1 FROM replicron_runs missed
        WHERE missed.namespace = %(namespace)s AND missed.job = due.job
          AND missed.scheduled_through >= due.scheduled_at
          AND missed.scheduled_at < due.scheduled_at)
    ORDER BY job, scheduled_at  -- the claims' order (see claim)
    ON CONFLICT (namespace, job, scheduled_at) DO NOTHING
    RETURNING job, scheduled_at
), mine AS MATERIALIZED (  -- an index lookup per tick, never a scan of the history
    SELECT due.job, due.scheduled_at, due.outcome AS new_outcome, due.error AS new_error,
           found.run_id, found.outcome
    FROM due CROSS JOIN LATERAL (
        SELECT run.run_id, run.outcome FROM replicron_runs run
        WHERE run.namespace = %(namespace)s AND run.job = due.job
          AND run.scheduled_at = due.scheduled_at AND run.claim_token = due.token
    ) AS found
), closed AS (
    UPDATE replicron_runs run
    SET outcome = mine.new_outcome, error = mine.new_error, finished_at = now(),
        heartbeat_at = NULL, lease_until = NULL
    FROM mine
    WHERE run.run_id = mine.run_id AND (mine.outcome IS NULL OR mine.outcome = 'abandoned')
    RETURNING run.run_id, run.job, run.scheduled_at
), freed AS (  -- lease mode: a lock the lost claim took is freed with its row
    UPDATE replicron_job_locks held
    SET run_id = NULL, replica_id = NULL, lease_until = NULL
    WHERE held.namespace = %(namespace)s AND held.run_id IN (SELECT run_id FROM closed)
)
SELECT job, scheduled_at, 'recorded' FROM inserted
UNION ALL
SELECT job, scheduled_at, 'recorded' FROM closed
UNION ALL
SELECT job, scheduled_at, 'recorded' FROM mine
WHERE mine.outcome IS NOT NULL AND mine.outcome <> 'abandoned'
UNION ALL
SELECT job, scheduled_at, 'early' FROM request, session
WHERE scheduled_at > session.recordable_until;

-- name: record_missed_ranges
-- Record missed, in one row each, ranges of ticks nobody ran: :firsts through :lasts, :counts
-- ticks each. Ticks of a span that have rows of their own keep them: the range stands for
-- the others (its count excludes those rows) and is keyed by the first of its :starts (the
-- span's first ticks, tagged with the range's place in the arrays by :starts_of) that has
-- no row. A range is not recorded if another range lies in its span (those ticks are
-- somebody else's; two replicas writing one span end with one range, by its key) or if
-- every one of its starts has a row. Returns each range recorded: its place in the arrays
-- and how many ticks it stands for.
WITH request AS MATERIALIZED (
    SELECT *
    FROM unnest(%(jobs)s::text[], %(firsts)s::timestamptz[], %(lasts)s::timestamptz[],
                %(counts)s::int[], %(errors)s::text[])
        WITH ORDINALITY AS r(job, scheduled_at, scheduled_through, ticks, error, place)
), start AS (
    SELECT * FROM unnest(%(starts_of)s::bigint[], %(starts)s::timestamptz[]) AS s(place, tick)
), keyed AS MATERIALIZED (
    SELECT request.place, request.job, request.scheduled_through, request.error,
           (SELECT min(start.tick) FROM start
            WHERE start.place = request.place AND NOT EXISTS (
                SELECT 1 FROM replicron_runs run
                WHERE run.namespace = %(namespace)s AND run.job = request.job
                  AND run.scheduled_at = start.tick)) AS key,
           request.ticks - (
               SELECT count(*) FROM replicron_runs run
               WHERE run.namespace = %(namespace)s AND run.job = request.job
                 AND run.scheduled_at BETWEEN request.scheduled_at
                                          AND request.scheduled_through
                 AND run.scheduled_through IS NULL
                 AND NOT run.manual  -- manual runs lie off the job's ticks
           ) AS ticks
    FROM request
    WHERE NOT EXISTS (
        SELECT 1 FROM replicron_runs missed
        WHERE missed.namespace = %(namespace)s AND missed.job = request.job
          AND missed.scheduled_at <= request.scheduled_through
          AND missed.scheduled_through >= request.scheduled_at
    )
), inserted AS (
    INSERT INTO replicron_runs
        (namespace, job, scheduled_at, scheduled_through, ticks, replica_id, finished_at,
         outcome, error)
    SELECT %(namespace)s, job, key, scheduled_through, ticks, %(replica)s, now(),
           'missed', error
    FROM keyed
    WHERE key IS NOT NULL
    ORDER BY job, key  -- the claims' order (see claim)
    ON CONFLICT (namespace, job, scheduled_at) DO NOTHING
    RETURNING job, scheduled_at, ticks
)
SELECT keyed.place, inserted.ticks
FROM inserted JOIN keyed ON keyed.job = inserted.job AND keyed.key = inserted.scheduled_at;

-- name: close_lost_claims
-- At shutdown: rows this replica inserted with claims whose answers were lost (it never ran
-- them) are recorded missed rather than left open, or left abandoned by a janitor; a job lock
-- such a claim took (lease mode) is freed.
WITH closed AS (
    UPDATE replicron_runs
    SET outcome = 'missed', finished_at = now(), heartbeat_at = NULL, lease_until = NULL,
        error = 'claimed, but the claim''s answer was lost with the connection; not run'
    WHERE namespace = %(namespace)s AND claim_token = ANY(%(tokens)s::uuid[])
      AND (outcome IS NULL OR outcome = 'abandoned')
      AND job = ANY(%(jobs)s::text[])
    RETURNING run_id, job, scheduled_at
), freed AS (
    UPDATE replicron_job_locks held
    SET run_id = NULL, replica_id = NULL, lease_until = NULL
    WHERE held.namespace = %(namespace)s AND held.run_id IN (SELECT run_id FROM closed)
)
SELECT job, scheduled_at FROM closed;

-- name: other_modes
-- The replicas of the namespace that coordinate in another mode than this one's and are live,
-- or whose runs still hold their jobs' locks (a frozen process: its heartbeat is stale, its
-- runs go on): the two modes' locks do not see each other, so a namespace's replicas must
-- agree. A replica whose heartbeats name no mode predates them (migration 0005): it
-- coordinates through advisory locks. A replica's own earlier life is not another replica.
SELECT replica_id, coalesce(coordination, 'advisory') FROM replicron_replicas
WHERE namespace = %(namespace)s AND replica_id <> %(replica)s AND stopped_at IS NULL
  AND coalesce(coordination, 'advisory') <> %(coordination)s
  AND last_seen > now() - coalesce(stale_after, %(stale_after)s::interval)
UNION
SELECT run.replica_id, 'advisory' FROM replicron_runs run
WHERE %(coordination)s = 'lease' AND run.namespace = %(namespace)s AND run.outcome IS NULL
  AND run.lease_until IS NULL AND run.replica_id <> %(replica)s
  AND EXISTS (
      SELECT 1 FROM replicron_advisory_locks() l
      WHERE l.pid = run.backend_pid AND l.lock_key = run.lock_key
  )
UNION
SELECT run.replica_id, 'lease' FROM replicron_runs run
WHERE %(coordination)s = 'advisory' AND run.namespace = %(namespace)s AND run.outcome IS NULL
  AND run.lease_until > now() AND run.replica_id <> %(replica)s
ORDER BY 1;

-- name: heartbeat
-- Keep our open ticks fresh (on our own server session only), note this replica as seen with
-- its clock offset, and return: whether it ran on our server session, the database clock,
-- the open runs refreshed (an open run not among them was recorded by someone else: a
-- janitor), the advisory locks this session really holds, and the replicas of the namespace
-- seen lately (the peers a burst is spread over); in leader mode, the lease's holder and epoch
-- after its compare-and-set.
WITH refreshed AS (
    UPDATE replicron_runs SET heartbeat_at = now(), backend_pid = pg_backend_pid()
    WHERE run_id = ANY(%(run_ids)s::bigint[]) AND outcome IS NULL
      AND pg_backend_pid() = %(pid)s
      AND current_setting('replicron.session_token', true) = %(session_token)s
    RETURNING run_id
), seen AS (
    INSERT INTO replicron_replicas AS r
        (namespace, replica_id, backend_pid, clock_offset_ms, last_seen, stale_after,
         coordination)
    VALUES (%(namespace)s, %(replica)s, pg_backend_pid(), %(offset_ms)s, now(),
            %(stale_after)s::interval, 'advisory')
    ON CONFLICT (namespace, replica_id) DO UPDATE
    SET backend_pid = excluded.backend_pid, clock_offset_ms = excluded.clock_offset_ms,
        coordination = excluded.coordination,
        last_seen = excluded.last_seen, stale_after = excluded.stale_after,
        -- A replica that is leaving (it claims no more; its last runs finish) stays gone.
        stopped_at = CASE WHEN %(leaving)s::boolean THEN coalesce(r.stopped_at, now()) END,
        -- A replica id used again by a new process (a restarted container): it starts anew.
        started_at = CASE WHEN (r.stopped_at IS NOT NULL AND NOT %(leaving)s::boolean)
                            OR r.last_seen <= now() - coalesce(r.stale_after,
                                                               excluded.stale_after)
                          THEN now() ELSE r.started_at END
), leader AS MATERIALIZED (
    -- Leader mode, while this replica contends: the lease's compare-and-set rides along.
    SELECT * FROM replicron_lead(%(namespace)s, %(replica)s, %(leader_lease)s::interval)
    WHERE %(contending)s::boolean
)
SELECT (pg_backend_pid() = %(pid)s
        AND current_setting('replicron.session_token', true) = %(session_token)s) AS ours,
       clock_timestamp(),
       ARRAY(SELECT run_id FROM refreshed) AS refreshed,
       ARRAY(SELECT lock_key FROM replicron_advisory_locks()
             WHERE pid = pg_backend_pid()) AS held,
       ARRAY(SELECT replica_id FROM replicron_replicas
             WHERE namespace = %(namespace)s AND stopped_at IS NULL
               AND last_seen > now() - coalesce(stale_after, %(stale_after)s::interval))
       AS peers,
       (SELECT holder FROM leader), (SELECT epoch FROM leader);

-- name: clock_sample
-- A cheap round trip to measure the offset of this replica's clock from the database's.
SELECT pg_backend_pid(), clock_timestamp();

-- name: probe_version
-- The advisory-lock probe (_probe.py): which server this is, to name it in a refusal.
SELECT version();

-- name: probe_try_lock
-- The probe's lock is in the two-int key space, which never meets the jobs' bigint keys.
SELECT pg_try_advisory_lock(%(k1)s::int, %(k2)s::int);

-- name: probe_unlock
SELECT pg_advisory_unlock(%(k1)s::int, %(k2)s::int);

-- name: last_ticks
-- The latest tick of each job (manual runs are not ticks of its trigger), a range of missed
-- ticks by its last. A job with no tick recorded that a replica registered: the instant just
-- before the first tick a registration of it expects, so that a catch-up finds that tick too
-- (it fell due while every replica that scheduled the job was down).
WITH recorded AS (
    SELECT job, greatest(max(scheduled_at), max(scheduled_through)) AS last
    FROM replicron_runs
    WHERE namespace = %(namespace)s AND job = ANY(%(jobs)s::text[]) AND NOT manual
    GROUP BY job
)
SELECT job, last FROM recorded
UNION ALL
SELECT job, min(expected[1]) - interval '1 microsecond'
FROM replicron_jobs
WHERE namespace = %(namespace)s AND job = ANY(%(jobs)s::text[])
  AND job NOT IN (SELECT job FROM recorded)
GROUP BY job
HAVING min(expected[1]) IS NOT NULL;

-- name: last_finishes
-- The latest tick of each job (manual runs are not ticks) and how it ended, for fixed-delay
-- jobs: one backward index lookup per job, never a scan of its history.
SELECT wanted.job, last.scheduled_at, last.finished_at, last.outcome
FROM unnest(%(jobs)s::text[]) AS wanted(job)
CROSS JOIN LATERAL (
    SELECT run.scheduled_at, run.finished_at, run.outcome
    FROM replicron_runs run
    WHERE run.namespace = %(namespace)s AND run.job = wanted.job AND NOT run.manual
    ORDER BY run.scheduled_at DESC
    LIMIT 1
) AS last;

-- name: abandon_stale
-- Janitor: open ticks of replicas that stopped heartbeating are recorded abandoned, unless the
-- run's job lock is still held by the server session that claimed it (a frozen process whose
-- session lives: its run may go on, so nobody may start the job, and it is not over).
-- finished_at is where the run's lease ended (its last heartbeat + stale_after), as in row
-- lease: no other run of the job can have started before it, however late the janitor runs.
UPDATE replicron_runs run
SET outcome = 'abandoned',
    finished_at = coalesce(heartbeat_at, claimed_at) + %(stale_after)s::interval,
    error = 'replica ' || replica_id || ' stopped heartbeating'
WHERE namespace = %(namespace)s AND outcome IS NULL
  AND coalesce(heartbeat_at, claimed_at) < now() - %(stale_after)s::interval
  AND NOT EXISTS (
      SELECT 1 FROM replicron_advisory_locks() l
      WHERE l.pid = run.backend_pid AND l.lock_key = run.lock_key
  )
RETURNING job, scheduled_at, replica_id;

-- name: fence_stale_holder
-- Opt-in fencing: terminate the server session that holds a job's lock for an open run whose
-- heartbeat is stale (a frozen replica), when no run of the job is heartbeating; waits up to
-- a second for it to exit.
SELECT run.replica_id, l.pid, pg_terminate_backend(l.pid, 1000)
FROM replicron_runs run
JOIN replicron_advisory_locks() l ON l.pid = run.backend_pid AND l.lock_key = run.lock_key
WHERE run.namespace = %(namespace)s AND run.job = %(job)s AND run.outcome IS NULL
  AND run.heartbeat_at <= now() - %(stale_after)s::interval
  AND l.pid <> pg_backend_pid()
  AND NOT EXISTS (
      SELECT 1 FROM replicron_runs fresh
      WHERE fresh.namespace = %(namespace)s AND fresh.job = %(job)s
        AND fresh.outcome IS NULL AND fresh.started_at IS NOT NULL
        AND fresh.heartbeat_at > now() - %(stale_after)s::interval
        AND fresh.replica_id <> %(replica)s  -- our own refused tick, being recorded
  );

-- name: prune
-- Retention: delete finished rows older than the retention period, in bounded batches, always
-- keeping each job's latest scheduled row (catch-up reads it after long pauses), and manual
-- rows while a run asked for across the cluster may still be pending (%(requests_keep)s):
-- its row is what says it ran. The scheduled runs deleted are added to their job's tally
-- (replicron_pruned_runs): max_runs counts them.
WITH deleted AS (
    DELETE FROM replicron_runs
    WHERE run_id IN (
        SELECT run_id FROM replicron_runs old
        WHERE old.namespace = %(namespace)s AND old.outcome IS NOT NULL
          AND old.claimed_at < now() - %(retention)s::interval
          AND (NOT old.manual OR old.claimed_at < now() - %(requests_keep)s::interval)
          AND old.run_id IS DISTINCT FROM (
              SELECT max(latest.run_id) FROM replicron_runs latest
              WHERE latest.namespace = old.namespace AND latest.job = old.job
                AND NOT latest.manual)
        LIMIT %(batch)s
    )
    RETURNING job, manual, outcome
), tallied AS (
    INSERT INTO replicron_pruned_runs AS pruned (namespace, job, runs)
    SELECT %(namespace)s, job, count(*) FROM deleted
    WHERE NOT manual AND outcome IN ('succeeded', 'failed', 'timed_out', 'abandoned')
    GROUP BY job
    ON CONFLICT (namespace, job) DO UPDATE SET runs = pruned.runs + excluded.runs
)
SELECT count(*) FROM deleted;

-- name: status
-- Per job: the latest finished run, the latest success, open runs, the misses of the last
-- day, the open runs whose heartbeat is stale, and the latest tick with a row. A handful of
-- index lookups per job (the jobs found by skipping through the ledger's unique index), never
-- a pass over the whole history: it is read every few seconds by every replica that exports
-- metrics.
WITH RECURSIVE jobs AS (
    (SELECT job FROM replicron_runs WHERE namespace = %(namespace)s ORDER BY job LIMIT 1)
    UNION ALL
    SELECT (SELECT run.job FROM replicron_runs run
            WHERE run.namespace = %(namespace)s AND run.job > jobs.job
            ORDER BY run.job LIMIT 1)
    FROM jobs WHERE jobs.job IS NOT NULL
)
SELECT jobs.job, last.replica_id, last.scheduled_at, last.started_at, last.finished_at,
       last.outcome, last.error,
       (SELECT run.finished_at FROM replicron_runs run
        WHERE run.namespace = %(namespace)s AND run.job = jobs.job AND run.outcome = 'succeeded'
        ORDER BY run.scheduled_at DESC LIMIT 1) AS last_success_at,
       coalesce(ARRAY(SELECT run.replica_id || ' ' || run.run_id FROM replicron_runs run
                      WHERE run.namespace = %(namespace)s AND run.job = jobs.job
                        AND run.outcome IS NULL AND run.started_at IS NOT NULL
                      ORDER BY run.run_id), '{}') AS running,
       -- A range of missed ticks counts all its ticks when its last is of the last day.
       (SELECT coalesce(sum(run.ticks), 0) FROM replicron_runs run
        WHERE run.namespace = %(namespace)s AND run.job = jobs.job AND run.outcome = 'missed'
          AND (run.scheduled_at > now() - interval '1 day'
               OR run.scheduled_through > now() - interval '1 day')) AS missed,
       -- Open runs whose replica stopped heartbeating but whose session still holds the lock
       -- (a frozen process): they block the job until it wakes or is fenced.
       coalesce(ARRAY(SELECT run.replica_id || ' ' || run.run_id FROM replicron_runs run
                      WHERE run.namespace = %(namespace)s AND run.job = jobs.job
                        AND run.outcome IS NULL AND run.started_at IS NOT NULL
                        AND run.heartbeat_at <= now() - %(stale_after)s::interval
                        AND EXISTS (  -- its session lives (a dead one's is waiting to go)
                            SELECT 1 FROM replicron_advisory_locks() l
                            WHERE l.pid = run.backend_pid AND l.lock_key = run.lock_key)
                      ORDER BY run.run_id), '{}') AS stale_running,
       greatest(
           (SELECT run.scheduled_at FROM replicron_runs run
            WHERE run.namespace = %(namespace)s AND run.job = jobs.job AND NOT run.manual
            ORDER BY run.scheduled_at DESC LIMIT 1),
           (SELECT max(run.scheduled_through) FROM replicron_runs run
            WHERE run.namespace = %(namespace)s AND run.job = jobs.job
              AND run.scheduled_through IS NOT NULL)) AS last_tick
FROM jobs
LEFT JOIN LATERAL (
    SELECT run.replica_id, run.scheduled_at, run.started_at, run.finished_at, run.outcome,
           run.error
    FROM replicron_runs run
    WHERE run.namespace = %(namespace)s AND run.job = jobs.job AND run.outcome IS NOT NULL
    ORDER BY run.scheduled_at DESC
    LIMIT 1
) AS last ON true
WHERE jobs.job IS NOT NULL
ORDER BY jobs.job;

-- name: replicas
-- Replicas of the namespace: when each was last seen and its clock's offset.
SELECT replica_id, backend_pid, clock_offset_ms, started_at, last_seen,
       stopped_at IS NULL
       AND last_seen > now() - coalesce(stale_after, %(stale_after)s::interval) AS alive
FROM replicron_replicas
WHERE namespace = %(namespace)s
ORDER BY replica_id;

-- name: namespaces
-- Every namespace with recorded runs, and how many (for a status of an empty namespace).
SELECT namespace, count(*) FROM replicron_runs GROUP BY namespace ORDER BY namespace;

-- name: announce
-- The jobs this replica schedules, as they changed (written, or removed), into the cluster's
-- registry; with complete, the definitions are all of them and the replica's other rows go
-- (left by an earlier process under the same replica id). Returns the registrations by live
-- replicas of this replica's jobs whose definitions differ from its own (drift).
WITH definition AS MATERIALIZED (
    SELECT *
    FROM unnest(%(jobs)s::text[], %(triggers)s::text[], %(fingerprints)s::text[],
                %(graces)s::interval[], %(expected)s::text[])
        AS d(job, trigger, fingerprint, grace, expected)
), written AS (
    INSERT INTO replicron_jobs AS r
        (namespace, job, replica_id, trigger, fingerprint, grace, expected, last_seen)
    SELECT %(namespace)s, job, %(replica)s, trigger, fingerprint, grace,
           expected::timestamptz[], now()
    FROM definition
    ORDER BY job
    ON CONFLICT (namespace, job, replica_id) DO UPDATE
    SET trigger = excluded.trigger, fingerprint = excluded.fingerprint,
        grace = excluded.grace, expected = excluded.expected, last_seen = excluded.last_seen
), dropped AS (
    DELETE FROM replicron_jobs
    WHERE namespace = %(namespace)s AND replica_id = %(replica)s
      AND (job = ANY(%(removed)s::text[]) OR %(complete)s AND job <> ALL(%(jobs)s::text[]))
), mine AS MATERIALIZED (
    SELECT job, fingerprint FROM definition
    UNION ALL
    SELECT job, fingerprint FROM replicron_jobs
    WHERE namespace = %(namespace)s AND replica_id = %(replica)s AND NOT %(complete)s
      AND job <> ALL(%(jobs)s::text[]) AND job <> ALL(%(removed)s::text[])
)
SELECT other.job, other.replica_id, other.trigger, other.fingerprint, other.grace,
       other.expected, other.last_seen
FROM mine
JOIN replicron_jobs other
    ON other.namespace = %(namespace)s AND other.job = mine.job
   AND other.replica_id <> %(replica)s AND other.fingerprint <> mine.fingerprint
JOIN replicron_replicas seen
    ON seen.namespace = other.namespace AND seen.replica_id = other.replica_id
   AND seen.stopped_at IS NULL
   AND seen.last_seen > now() - coalesce(seen.stale_after, %(stale_after)s::interval)
ORDER BY other.job, other.replica_id;

-- name: registrations
-- The cluster's job registry, each row with whether its replica is alive.
SELECT job.job, job.replica_id, job.trigger, job.fingerprint, job.grace, job.expected,
       job.last_seen,
       coalesce(seen.stopped_at IS NULL
                AND seen.last_seen
                    > now() - coalesce(seen.stale_after, %(stale_after)s::interval), false)
FROM replicron_jobs job
LEFT JOIN replicron_replicas seen USING (namespace, replica_id)
WHERE job.namespace = %(namespace)s
ORDER BY job.job, job.replica_id;

-- name: pauses
SELECT job, paused_at, paused_by FROM replicron_paused
WHERE namespace = %(namespace)s
ORDER BY job;

-- name: pause
-- Pause a job across the cluster; returns a row if it was not paused already.
INSERT INTO replicron_paused (namespace, job, paused_by)
VALUES (%(namespace)s, %(job)s, %(by)s)
ON CONFLICT (namespace, job) DO NOTHING
RETURNING job;

-- name: resume
-- Resume a paused job; returns a row if it was paused.
DELETE FROM replicron_paused
WHERE namespace = %(namespace)s AND job = %(job)s
RETURNING job;

-- name: request_run
-- Ask for a manual run of a job across the namespace. No row when no replica ever registered
-- the job (unknown here: refused). Requests older than %(keep)s go.
WITH expired AS (
    DELETE FROM replicron_run_requests WHERE requested_at < now() - %(keep)s::interval
)
INSERT INTO replicron_run_requests (namespace, job, requested_by)
SELECT %(namespace)s, %(job)s, %(by)s
WHERE EXISTS (SELECT 1 FROM replicron_jobs WHERE namespace = %(namespace)s AND job = %(job)s)
RETURNING requested_at;

-- name: run_requests
-- The requests for these jobs younger than %(keep)s and not yet run: no manual row of the job
-- within the millisecond the engine may move the run's instant by (off the job's ticks).
SELECT req.job, req.requested_at FROM replicron_run_requests req
WHERE req.namespace = %(namespace)s AND req.job = ANY(%(jobs)s::text[])
  AND req.requested_at > now() - %(keep)s::interval
  AND NOT EXISTS (
      SELECT 1 FROM replicron_runs run
      WHERE run.namespace = req.namespace AND run.job = req.job AND run.manual
        AND run.scheduled_at >= req.requested_at
        AND run.scheduled_at <= req.requested_at + interval '1 millisecond')
ORDER BY req.requested_at, req.request_id;

-- name: forget
-- A job dropped from the code: the registrations of replicas that are gone go, so that it is
-- no longer expected (its runs stay). Returns every registration there was, and whether it
-- went. A replica's stays unless it stopped cleanly or has not been seen for two minutes: a
-- replica that was only frozen or cut off for a moment still schedules the job.
WITH gone AS (
    DELETE FROM replicron_jobs job
    WHERE job.namespace = %(namespace)s AND job.job = %(job)s
      AND NOT EXISTS (
          SELECT 1 FROM replicron_replicas seen
          WHERE seen.namespace = job.namespace AND seen.replica_id = job.replica_id
            AND seen.stopped_at IS NULL
            AND seen.last_seen > now() - greatest(
                coalesce(seen.stale_after, %(stale_after)s::interval), interval '2 minutes'))
    RETURNING replica_id
)
SELECT replica_id, replica_id IN (SELECT replica_id FROM gone)
FROM replicron_jobs
WHERE namespace = %(namespace)s AND job = %(job)s
ORDER BY replica_id;

-- name: prune_registry
-- Retention: registrations not rewritten for the retention period (replicas long gone).
DELETE FROM replicron_jobs
WHERE namespace = %(namespace)s AND last_seen < now() - %(retention)s::interval;

-- name: replica_stopped
-- This replica stops, or stops claiming: gone for the others at once (peers, status), not in
-- a few heartbeats.
UPDATE replicron_replicas SET stopped_at = coalesce(stopped_at, now())
WHERE namespace = %(namespace)s AND replica_id = %(replica)s;

-- name: replica_joined
-- This replica plans every tick from %(since)s on (a leaving replica hands it only the ticks
-- from then on). Written as it starts, milliseconds after its first heartbeat set started_at.
UPDATE replicron_replicas SET started_at = %(since)s
WHERE namespace = %(namespace)s AND replica_id = %(replica)s;

-- name: replicas_staying
-- The other replicas of the namespace that are up and not leaving, with when each joined.
-- Read in a statement after this replica's own leaving committed: of two replicas leaving at
-- once, at least one sees the other gone (each marks itself, then reads).
SELECT replica_id, started_at FROM replicron_replicas
WHERE namespace = %(namespace)s AND replica_id <> %(replica)s AND stopped_at IS NULL
  AND last_seen > now() - coalesce(stale_after, %(stale_after)s::interval)
ORDER BY replica_id;

-- name: database_clock
SELECT clock_timestamp();

-- name: leader_lease
-- Leader mode: take the namespace's leader lease if nobody holds it or its holder's lease
-- ran out, or renew it if this replica holds it (replicron_lead); answers the holder after
-- it and its epoch.
SELECT * FROM replicron_lead(%(namespace)s, %(replica)s, %(leader_lease)s::interval);

-- name: leader_now
-- Leader mode, for the status: the namespace's leader, if its lease has not run out.
SELECT holder FROM replicron_leaders WHERE namespace = %(namespace)s AND expires_at > now();

-- name: leader_resign
-- This replica stops: its leader lease ends now, so that a standby takes over at its next
-- heartbeat rather than when the lease would have run out.
UPDATE replicron_leaders SET expires_at = now()
WHERE namespace = %(namespace)s AND holder = %(replica)s;
