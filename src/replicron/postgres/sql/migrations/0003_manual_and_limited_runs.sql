-- Manual runs (Job.run_now): recorded at the instant they were asked for, which the engine
-- picks off the job's ticks. Catch-up (the latest tick) and max_runs leave them out.
ALTER TABLE replicron_runs ADD COLUMN manual boolean NOT NULL DEFAULT false;

-- Whether a job has started p_limit scheduled runs (claimed ticks not recorded as not run),
-- for the claim of a job with max_runs. Claims of one job count one after another: a
-- transaction-level advisory lock (two-key space, apart from the jobs' run locks), held until
-- the claim commits. VOLATILE, so the count reads a snapshot taken after that lock: it sees
-- the rows of a claim that committed while this one waited.
CREATE FUNCTION replicron_runs_reached(p_namespace text, p_job text, p_limit integer)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT pg_advisory_xact_lock(hashtext('replicron_runs_reached'),
                                 hashtext(p_namespace || '/' || p_job));
    SELECT count(*) >= p_limit
    FROM (
        SELECT 1 FROM replicron_runs run
        WHERE run.namespace = p_namespace AND run.job = p_job AND NOT run.manual
          AND (run.outcome IS NULL
               OR run.outcome IN ('succeeded', 'failed', 'timed_out', 'abandoned'))
        LIMIT p_limit
    ) AS counted;
$$;
