-- Manual runs asked for across the replicas (see the PostgreSQL backend's): each replica
-- that schedules the job claims a manual run at the requested instant; the ledger's unique
-- (job, scheduled_at) runs it once. Times in microseconds since the epoch.
CREATE TABLE replicron_run_requests (
    request_id   INTEGER PRIMARY KEY AUTOINCREMENT,
    job          TEXT    NOT NULL,
    requested_at INTEGER NOT NULL,
    requested_by TEXT    NOT NULL
);
CREATE INDEX replicron_run_requests_requested_at_idx ON replicron_run_requests (requested_at);
