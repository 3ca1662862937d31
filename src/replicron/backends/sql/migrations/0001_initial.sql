-- The embedded backend's ledger: one row per claimed tick, recorded once it ends.
-- Times are integer microseconds since the Unix epoch, UTC.

CREATE TABLE replicron_runs (
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
        'skipped_overlap', 'skipped_limit', 'missed', 'abandoned')),
    error        TEXT,
    UNIQUE (job, scheduled_at)
);

-- Open ticks: the overlap check at claim time and the janitor.
CREATE INDEX replicron_runs_open_idx ON replicron_runs (job) WHERE outcome IS NULL;

-- Retention sweeps.
CREATE INDEX replicron_runs_claimed_at_idx ON replicron_runs (claimed_at);
