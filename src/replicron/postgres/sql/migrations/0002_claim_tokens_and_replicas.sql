-- Surviving faults.
-- claim_token: a claim retried on a fresh session (its first reply lost with the old session)
--   recognises the rows its first try inserted.
-- lock_key, backend_pid: which server session holds (or held) the job's lock for an open run,
--   so the janitor never abandons a run whose lock is still held, and a frozen holder can be
--   shown (and, opt-in, fenced).
ALTER TABLE replicron_runs
    ADD COLUMN claim_token uuid,
    ADD COLUMN lock_key bigint,
    ADD COLUMN backend_pid integer;

-- One row per replica: seen by its heartbeats, with its clock's offset from the database's.
CREATE TABLE replicron_replicas (
    namespace       text        NOT NULL,
    replica_id      text        NOT NULL,
    backend_pid     integer,
    clock_offset_ms double precision,
    started_at      timestamptz NOT NULL DEFAULT now(),
    last_seen       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (namespace, replica_id)
);
