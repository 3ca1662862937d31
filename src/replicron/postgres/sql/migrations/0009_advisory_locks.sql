-- The session advisory locks granted in this database in the jobs' key space (one bigint key:
-- objsubid 1), each with the server session (pid) that holds it: a run's job lock is held
-- while its row's (backend_pid, lock_key) is among them. Every statement and function that
-- asks about the jobs' locks reads them here. One SELECT with no parameters, STABLE: the
-- planner inlines it where it is read, so testing many rows is one semi-join (or anti-join)
-- on the server's lock view, not a call per row.
CREATE FUNCTION replicron_advisory_locks()
RETURNS TABLE (pid integer, lock_key bigint) LANGUAGE sql STABLE AS $$
    SELECT l.pid, (l.classid::bigint << 32) | l.objid::bigint
    FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database());
$$;

-- replicron_runs_reached, both forms (the same signatures: replicas not yet upgraded call
-- them). The four-argument form applies both liveness rules, testing a run's advisory lock
-- with replicron_advisory_locks, so a caller need not say its mode: a started open row counts
-- while its server session holds its advisory lock or while its job's lock row names it. A
-- namespace has one mode at a time, and each mode leaves the other's evidence empty (row-lease
-- rows have no backend_pid or lock_key; advisory replicas write no lock rows), so it answers
-- as the five-argument form did for the caller's mode: that form now asks it.
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
                     AND held.run_id = run.run_id)));
$$;

CREATE OR REPLACE FUNCTION replicron_runs_reached(
    p_namespace text, p_job text, p_limit integer, p_mine uuid[], p_leased boolean
) RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT replicron_runs_reached(p_namespace, p_job, p_limit, p_mine);
$$;
