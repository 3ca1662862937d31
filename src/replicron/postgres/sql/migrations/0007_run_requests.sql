-- Manual runs asked for across the cluster (replicron run-now, the Django admin): every
-- replica that schedules the job sees the request on its next poll and claims a manual run
-- at the requested instant, so the ledger's unique (job, scheduled_at) runs it once. A
-- request is done once a manual row of its job lies at that instant (moved off the job's
-- ticks by at most a millisecond); requests are dropped after a while either way.
CREATE TABLE replicron_run_requests (
    request_id   bigserial   PRIMARY KEY,
    namespace    text        NOT NULL,
    job          text        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    requested_by text        NOT NULL
);
CREATE INDEX replicron_run_requests_namespace_idx
    ON replicron_run_requests (namespace, requested_at);
