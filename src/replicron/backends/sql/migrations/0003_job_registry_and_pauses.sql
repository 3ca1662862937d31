-- Ticks of paused jobs are recorded 'paused': SQLite cannot alter a CHECK constraint, so the
-- ledger is rebuilt with it (same columns, same run ids; AUTOINCREMENT goes on from them).
CREATE TABLE replicron_runs_next (
    run_id       INTEGER PRIMARY KEY AUTOINCREMENT,
    job          TEXT    NOT NULL,
    scheduled_at INTEGER NOT NULL,  -- the tick
    replica_id   TEXT    NOT NULL,
    pid          INTEGER,           -- the claimant process
    pid_start    INTEGER,           -- its start time (Linux clock ticks), or NULL
    claimed_at   INTEGER NOT NULL,
    started_at   INTEGER,
    finished_at  INTEGER,
    outcome      TEXT CHECK (outcome IN ('succeeded', 'failed', 'timed_out',
        'skipped_overlap', 'skipped_limit', 'missed', 'abandoned', 'paused')),
    error        TEXT,
    manual       INTEGER NOT NULL DEFAULT 0,
    UNIQUE (job, scheduled_at)
);
INSERT INTO replicron_runs_next
    (run_id, job, scheduled_at, replica_id, pid, pid_start, claimed_at, started_at,
     finished_at, outcome, error, manual)
SELECT run_id, job, scheduled_at, replica_id, pid, pid_start, claimed_at, started_at,
       finished_at, outcome, error, manual
FROM replicron_runs;
DROP TABLE replicron_runs;
ALTER TABLE replicron_runs_next RENAME TO replicron_runs;
CREATE INDEX replicron_runs_open_idx ON replicron_runs (job) WHERE outcome IS NULL;
CREATE INDEX replicron_runs_claimed_at_idx ON replicron_runs (claimed_at);

-- The cluster's job registry: one row per job per replica that schedules it (see the
-- PostgreSQL backend's). Times in microseconds since the epoch; grace in microseconds.
CREATE TABLE replicron_jobs (
    job         TEXT    NOT NULL,
    replica_id  TEXT    NOT NULL,
    trigger     TEXT    NOT NULL,
    fingerprint TEXT    NOT NULL,
    grace       INTEGER NOT NULL,
    expected    TEXT    NOT NULL,  -- the next ticks expected: microseconds, comma-separated
    last_seen   INTEGER NOT NULL,
    PRIMARY KEY (job, replica_id)
);

-- The replicas that opened the state directory: alive while their process is, until they
-- close the backend (stopped_at).
CREATE TABLE replicron_replicas (
    replica_id TEXT    PRIMARY KEY,
    pid        INTEGER NOT NULL,
    pid_start  INTEGER,
    started_at INTEGER NOT NULL,
    last_seen  INTEGER NOT NULL,
    stopped_at INTEGER
);

-- Jobs paused across the replicas: their ticks are recorded 'paused' by the claim.
CREATE TABLE replicron_paused (
    job       TEXT    PRIMARY KEY,
    paused_at INTEGER NOT NULL,
    paused_by TEXT    NOT NULL
);
