-- Manual runs (Job.run_now): recorded at the instant they were asked for, which the engine
-- picks off the job's ticks. Catch-up (the latest tick) and max_runs leave them out.
ALTER TABLE replicron_runs ADD COLUMN manual INTEGER NOT NULL DEFAULT 0;

-- Runs of pruned rows (retention), per job: a job's count of runs (max_runs) outlives them.
CREATE TABLE replicron_pruned_runs (
    job  TEXT    PRIMARY KEY,
    runs INTEGER NOT NULL
);
