-- replicron_runs_reached also counts the open rows a janitor would write off abandoned (a
-- run): row lease, a row whose lease ran out; advisory, a row whose replica's heartbeats are
-- stale by that replica's stale_after, its lock not held. A run whose replica died then counts
-- at once, not only once a janitor came by (up to a minute later), so no claim meanwhile
-- starts one run past max_runs. Same signature: replicas not yet upgraded call it.
CREATE OR REPLACE FUNCTION replicron_runs_reached(
    p_namespace text, p_job text, p_limit integer, p_mine uuid[]
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
               OR EXISTS (
                   SELECT 1 FROM replicron_advisory_locks() l
                   WHERE l.pid = run.backend_pid AND l.lock_key = run.lock_key)
               OR EXISTS (
                   SELECT 1 FROM replicron_job_locks held
                   WHERE held.namespace = run.namespace AND held.job = run.job
                     AND held.run_id = run.run_id)
               -- Written off already in all but name: a janitor records it abandoned, a
               -- run. Row lease: its lease ran out. Advisory: its replica's heartbeats are
               -- stale by the replica's own stale_after (the lock is not held, above).
               OR run.lease_until < now()
               OR run.backend_pid IS NOT NULL AND EXISTS (
                   SELECT 1 FROM replicron_replicas seen
                   WHERE seen.namespace = run.namespace AND seen.replica_id = run.replica_id
                     AND coalesce(run.heartbeat_at, run.claimed_at)
                         < now() - seen.stale_after)));
$$;
