-- Lease mode (PostgresBackend(coordination="lease")): the ledger row is the lock. No advisory
-- lock and no statement that depends on staying on one server session, so replicas can share
-- a transaction pooler or the application's pool.

-- Bumped when somebody else ends the row while its claimant may still run it (a janitor that
-- took its replica for dead): every write of the claimant names the epoch it holds, so a late
-- writer from an old epoch never records anything over the new one.
ALTER TABLE replicron_runs ADD COLUMN epoch integer NOT NULL DEFAULT 0;
-- Until when the open row is its claimant's (the database's clock; renewed by its heartbeats).
ALTER TABLE replicron_runs ADD COLUMN lease_until timestamptz;

-- Each job's lock in lease mode (overlap "skip" and "queue" across the cluster): the run that
-- holds it, until when (renewed with the run's row), and how often it changed hands. A lock
-- whose lease ran out is taken over by a compare-and-set on this row.
CREATE TABLE replicron_job_locks (
    namespace   text        NOT NULL,
    job         text        NOT NULL,
    run_id      bigint,
    replica_id  text,
    epoch       bigint      NOT NULL DEFAULT 0,
    lease_until timestamptz,
    PRIMARY KEY (namespace, job)
);

-- The mode each replica coordinates in: replicas of a namespace must agree on it.
ALTER TABLE replicron_replicas ADD COLUMN coordination text;

-- replicron_runs_reached for either mode: with p_leased an open row started under the lock
-- counts while replicron_job_locks names it, not while a server session holds the advisory
-- lock. (The four-argument form stays for replicas not yet upgraded.)
CREATE FUNCTION replicron_runs_reached(
    p_namespace text, p_job text, p_limit integer, p_mine uuid[], p_leased boolean
) RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(hashtext('replicron_runs_reached'),
                                 hashtext(p_namespace || '/' || p_job));
    SELECT coalesce((SELECT pruned.runs FROM replicron_pruned_runs pruned
                     WHERE pruned.namespace = p_namespace AND pruned.job = p_job), 0)
           + count(*) >= p_limit
    FROM replicron_runs run
    WHERE run.namespace = p_namespace AND run.job = p_job AND NOT run.manual
      AND NOT coalesce(run.claim_token = ANY(p_mine), false)
      AND (run.outcome IN ('succeeded', 'failed', 'timed_out', 'abandoned')
           OR run.outcome IS NULL AND (
               run.started_at IS NULL
               OR p_leased AND EXISTS (
                   SELECT 1 FROM replicron_job_locks held
                   WHERE held.namespace = run.namespace AND held.job = run.job
                     AND held.run_id = run.run_id)
               OR NOT p_leased AND EXISTS (
                   SELECT 1 FROM pg_locks l
                   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                     AND l.pid = run.backend_pid
                     AND ((l.classid::bigint << 32) | l.objid::bigint) = run.lock_key
                     AND l.database = (SELECT oid FROM pg_database
                                       WHERE datname = current_database()))));
$$;
