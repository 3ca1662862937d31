-- The cluster's job registry: one row per job per replica that schedules it. From it, anyone
-- who reads the database sees which ticks are overdue (an expected tick with no row past its
-- grace, also with every replica down), replicas that define one job differently (drift),
-- and what each replica runs.
CREATE TABLE replicron_jobs (
    namespace   text        NOT NULL,
    job         text        NOT NULL,
    replica_id  text        NOT NULL,
    -- The trigger as written, e.g. cron('*/5 * * * *', tz='Europe/Kyiv').
    trigger     text        NOT NULL,
    -- A digest of the trigger, the job's options and its function: replicas that disagree
    -- on it run the union of both schedules.
    fingerprint text        NOT NULL,
    -- A tick with no row this long after it makes the job overdue.
    grace       interval    NOT NULL,
    -- The next ticks the replica expects, ascending (see replicron.cluster.JobDefinition).
    expected    timestamptz[] NOT NULL,
    last_seen   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, job, replica_id)
);

-- Jobs paused across the cluster: their ticks are claimed as usual, recorded 'paused' by
-- the claim itself, and none runs.
CREATE TABLE replicron_paused (
    namespace text        NOT NULL,
    job       text        NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT now(),
    paused_by text        NOT NULL,
    PRIMARY KEY (namespace, job)
);

ALTER TABLE replicron_runs DROP CONSTRAINT replicron_runs_outcome_check;
ALTER TABLE replicron_runs ADD CONSTRAINT replicron_runs_outcome_check
    CHECK (outcome IN ('succeeded', 'failed', 'timed_out', 'skipped_overlap', 'skipped_limit',
                       'missed', 'abandoned', 'paused'));

-- When a replica stopped cleanly (NULL while it runs): it is gone at once for the others,
-- not only once its heartbeats are stale.
ALTER TABLE replicron_replicas ADD COLUMN stopped_at timestamptz;
-- The replica's own stale_after: a reader with other settings (the CLI) tells it alive by it.
ALTER TABLE replicron_replicas ADD COLUMN stale_after interval;

-- Misses of the last day per job (replicron status), without walking the job's other rows.
CREATE INDEX replicron_runs_missed_idx ON replicron_runs (namespace, job, scheduled_at)
    WHERE outcome = 'missed';
