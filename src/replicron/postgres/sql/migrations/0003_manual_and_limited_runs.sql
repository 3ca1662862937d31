-- Manual runs (Job.run_now): recorded at the instant they were asked for, which the engine
-- picks off the job's ticks. Catch-up (the latest tick) and max_runs leave them out.
ALTER TABLE replicron_runs ADD COLUMN manual boolean NOT NULL DEFAULT false;

-- Runs of pruned rows (retention), per job: a job's count of runs (max_runs) outlives them.
CREATE TABLE replicron_pruned_runs (
    namespace text   NOT NULL,
    job       text   NOT NULL,
    runs      bigint NOT NULL,
    PRIMARY KEY (namespace, job)
);

-- Whether a job has started p_limit scheduled runs, for the claim of a job with max_runs:
-- its rows recorded as run (succeeded, failed, timed_out, abandoned), the pruned ones
-- (replicron_pruned_runs), and its open rows that are runs: claimed without the lock, or
-- whose server session holds the job's lock. An open row refused the lock (recorded
-- skipped_overlap by its claimant at once), or whose claim's answer was lost with its session,
-- is not counted, nor are the rows of the caller's own tries whose answers were lost (p_mine:
-- their claim tokens; nothing ran them); manual runs are not. Claims of one job count one
-- after another: a
-- transaction-level advisory lock (two-key space, apart from the jobs' run locks), held until
-- the claim commits. VOLATILE, so the count reads a snapshot taken after that lock: it sees
-- the rows of a claim that committed while this one waited.
CREATE FUNCTION replicron_runs_reached(
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
                   SELECT 1 FROM pg_locks l
                   WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                     AND l.pid = run.backend_pid
                     AND ((l.classid::bigint << 32) | l.objid::bigint) = run.lock_key
                     AND l.database = (SELECT oid FROM pg_database
                                       WHERE datname = current_database()))));
$$;
