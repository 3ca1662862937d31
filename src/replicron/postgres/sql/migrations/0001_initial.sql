-- The run ledger: one row per claimed tick. The unique (namespace, job, scheduled_at) is what
-- makes each tick run on exactly one replica; run_id is the fencing token.
CREATE TABLE replicron_runs (
    run_id        bigserial PRIMARY KEY,
    namespace     text        NOT NULL,
    job           text        NOT NULL,
    scheduled_at  timestamptz NOT NULL,
    replica_id    text        NOT NULL,
    claimed_at    timestamptz NOT NULL DEFAULT now(),
    -- Refreshed by the claimant while the tick is open (claimed, not yet finished); a row
    -- without outcome whose heartbeat is stale belongs to a replica that is gone.
    heartbeat_at  timestamptz,
    started_at    timestamptz,
    finished_at   timestamptz,
    outcome       text CHECK (outcome IN ('succeeded', 'failed', 'timed_out', 'skipped_overlap',
                                          'skipped_limit', 'missed', 'abandoned')),
    error         text,
    CONSTRAINT replicron_runs_tick_key UNIQUE (namespace, job, scheduled_at)
);

-- Open ticks, for the overlap check at claim time and the janitor.
CREATE INDEX replicron_runs_open_idx ON replicron_runs (namespace, job) WHERE outcome IS NULL;
-- Retention sweeps.
CREATE INDEX replicron_runs_claimed_at_idx ON replicron_runs (claimed_at);
