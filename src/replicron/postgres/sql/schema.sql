-- replicron's PostgreSQL schema, whole, as the migrations leave it.
--
-- replicron creates and upgrades its tables itself: at startup (PostgresBackend(migrate=True),
-- the default) or with `replicron migrate`, it applies migrations/*.sql in order and records
-- them in replicron_migrations. This file is the same schema in one piece, to read, or to
-- apply to an empty database by hand (`psql -v ON_ERROR_STOP=1 -f schema.sql`; it is one
-- transaction): it records the migrations as applied, so replicron finds nothing left to do.
-- tests/postgres/test_schema.py checks that it matches the migrations: a new migration
-- changes this file too.

BEGIN;

-- The migrations applied so far (replicron.postgres.migrate).
CREATE TABLE replicron_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- The run ledger: one row per claimed tick (or manual run). The unique (namespace, job, scheduled_at) is what
-- makes each tick run on exactly one replica; run_id is the fencing token.
CREATE TABLE replicron_runs (
    run_id        bigserial   PRIMARY KEY,
    -- Separates deployments sharing the database (PostgresBackend(namespace=...)).
    namespace     text        NOT NULL,
    job           text        NOT NULL,
    -- The tick: the instant it is due.
    scheduled_at  timestamptz NOT NULL,
    -- The replica that claimed the tick.
    replica_id    text        NOT NULL,
    claimed_at    timestamptz NOT NULL DEFAULT now(),
    -- Refreshed by the claimant while the tick is open (claimed, not yet finished); a row
    -- without outcome whose heartbeat is stale belongs to a replica that is gone.
    heartbeat_at  timestamptz,
    -- When the run started, and when the tick's outcome was recorded.
    started_at    timestamptz,
    finished_at   timestamptz,
    -- How the tick ended (replicron.events.Outcome); NULL while it is open.
    outcome       text CHECK (outcome IN ('succeeded', 'failed', 'timed_out', 'skipped_overlap',
                                          'skipped_limit', 'missed', 'abandoned',
                                          'paused')),
    -- What goes with the outcome, if anything: the run's error, or why the tick ended so.
    error         text,
    -- A claim retried on a fresh session (its first reply lost with the old session)
    -- recognises the rows its first try inserted by this token.
    claim_token   uuid,
    -- The job's advisory lock key, and the server session (pid) that holds, or held, it for
    -- an open run: the janitor never abandons a run whose lock is still held, and a frozen
    -- holder can be shown (and, opt-in, fenced).
    lock_key      bigint,
    backend_pid   integer,
    -- A manual run (Job.run_now), at the instant it was asked for (the engine picks it off
    -- the job's ticks); catch-up and max_runs leave it out.
    manual        boolean     NOT NULL DEFAULT false,
    -- Lease mode: bumped when somebody else ends the row while its claimant may still run it
    -- (a janitor that took its replica for dead); every write of the claimant names the epoch
    -- it holds, so a late writer from an old epoch never records anything over the new one.
    epoch         integer     NOT NULL DEFAULT 0,
    -- Lease mode: until when the open row is its claimant's (the database's clock).
    lease_until   timestamptz,
    -- Missed ticks past the enumeration bound are one row per job and gap, keyed by the
    -- first tick (scheduled_at): its last tick, and how many ticks it stands for. A tick's own
    -- row has no scheduled_through and counts 1. A tick inside a range has its record there.
    scheduled_through timestamptz,
    ticks         integer     NOT NULL DEFAULT 1,
    CONSTRAINT replicron_runs_tick_key UNIQUE (namespace, job, scheduled_at)
);

-- Open ticks, for the overlap check at claim time and the janitor.
CREATE INDEX replicron_runs_open_idx ON replicron_runs (namespace, job) WHERE outcome IS NULL;
-- Retention sweeps.
CREATE INDEX replicron_runs_claimed_at_idx ON replicron_runs (claimed_at);
-- Misses of the last day per job (replicron status), without walking the job's other rows.
CREATE INDEX replicron_runs_missed_idx ON replicron_runs (namespace, job, scheduled_at)
    WHERE outcome = 'missed';
-- Ranges of missed ticks: whether a tick lies inside one, a job's latest tick.
CREATE INDEX replicron_runs_ranges_idx ON replicron_runs (namespace, job, scheduled_through)
    WHERE scheduled_through IS NOT NULL;

-- Runs of pruned rows (retention), per job: a job's count of runs (max_runs) outlives them.
CREATE TABLE replicron_pruned_runs (
    namespace text   NOT NULL,
    job       text   NOT NULL,
    runs      bigint NOT NULL,
    PRIMARY KEY (namespace, job)
);

-- The session advisory locks granted in this database in the jobs' key space (one bigint key:
-- objsubid 1), each with the server session (pid) that holds it: a run's job lock is held
-- while its row's (backend_pid, lock_key) is among them. Every statement and function that
-- asks about the jobs' locks reads them here. One SELECT with no parameters, STABLE: the
-- planner inlines it where it is read, so testing many rows is one semi-join (or anti-join)
-- on the server's lock view, not a call per row.
CREATE FUNCTION replicron_advisory_locks()
RETURNS TABLE (pid integer, lock_key bigint) LANGUAGE sql STABLE AS $$
    SELECT l.pid, (l.classid::bigint << 32) | l.objid::bigint
    FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database());
$$;

-- One row per replica: seen by its heartbeats, with its clock's offset from the database's.
CREATE TABLE replicron_replicas (
    namespace       text        NOT NULL,
    replica_id      text        NOT NULL,
    -- The server session (pid) of the replica's lock session.
    backend_pid     integer,
    clock_offset_ms double precision,
    started_at      timestamptz NOT NULL DEFAULT now(),
    last_seen       timestamptz NOT NULL DEFAULT now(),
    -- When the replica stopped cleanly (NULL while it runs): it is gone at once for the
    -- others, not only once its heartbeats are stale.
    stopped_at      timestamptz,
    -- The replica's own stale_after: a reader with other settings (the CLI) tells it alive
    -- by it.
    stale_after     interval,
    -- The mode the replica coordinates in ('advisory' or 'lease'): a namespace's agree.
    coordination    text,
    PRIMARY KEY (namespace, replica_id)
);

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

-- Each job's lock in lease mode (overlap "skip" and "queue" across the cluster): the run that
-- holds it, until when (renewed with the run's row), and how often it changed hands. A lock
-- whose lease ran out is taken over by a compare-and-set on this row.
CREATE TABLE replicron_job_locks (
    namespace   text        NOT NULL,
    job         text        NOT NULL,
    run_id      bigint,
    replica_id  text,
    epoch       bigint      NOT NULL DEFAULT 0,
    lease_until timestamptz,
    PRIMARY KEY (namespace, job)
);

-- Leader mode: one leader lease per namespace. A replica that contends takes it by a
-- compare-and-set on its expiry (the database's clock) and renews it with its heartbeat; the
-- epoch goes up with every change of holder.
CREATE TABLE replicron_leaders (
    namespace   text        PRIMARY KEY,
    holder      text        NOT NULL,
    epoch       bigint      NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL
);

-- The compare-and-set on the lease, in one place for the statements that take or renew it:
-- p_holder takes the row if nobody holds it or its lease ran out (the database's clock),
-- renews it if it holds it; a new holder bumps the epoch. Returns the holder after it.
CREATE FUNCTION replicron_lead(p_namespace text, p_holder text, p_lease interval)
RETURNS TABLE (holder text, epoch bigint) LANGUAGE sql VOLATILE AS $$
    INSERT INTO replicron_leaders AS lease (namespace, holder, epoch, acquired_at, expires_at)
    VALUES (p_namespace, p_holder, 1, now(), now() + p_lease)
    ON CONFLICT (namespace) DO UPDATE
    SET holder = EXCLUDED.holder,
        epoch = lease.epoch + (lease.holder <> EXCLUDED.holder)::int,
        acquired_at = CASE WHEN lease.holder = EXCLUDED.holder THEN lease.acquired_at
                           ELSE now() END,
        expires_at = EXCLUDED.expires_at
    WHERE lease.holder = EXCLUDED.holder OR lease.expires_at < now();
    SELECT current.holder, current.epoch FROM replicron_leaders current
    WHERE current.namespace = p_namespace;
$$;

-- Whether a job has started p_limit scheduled runs, for the claim of a job with max_runs:
-- its rows recorded as run (succeeded, failed, timed_out, abandoned), the pruned ones
-- (replicron_pruned_runs), and its open rows that are runs: claimed without the lock; whose
-- job's lock is theirs (its server session holds the advisory lock, or the job's lock row
-- names the run: a namespace has one mode at a time, and each mode leaves the other's
-- evidence empty, so the caller need not say its mode); or that a janitor would write off
-- abandoned (row lease: the row's lease ran out; advisory: its replica's heartbeats went
-- stale by that replica's stale_after), so that a run whose replica died counts from then
-- on, not only once a janitor came by. A fresh open row refused the lock (recorded
-- skipped_overlap by its claimant at once), or whose claim's answer was lost with its
-- session, is not counted, nor are the rows of the caller's own tries whose answers were
-- lost (p_mine: their claim tokens; nothing ran them); manual runs are not. Claims of one
-- job count one after another: a transaction-level advisory lock (two-key space, apart from
-- the jobs' run locks), held until the claim commits. VOLATILE, so the count reads a
-- snapshot taken after that lock: it sees the rows of a claim that committed while this one
-- waited.
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
                   SELECT 1 FROM replicron_advisory_locks() l
                   WHERE l.pid = run.backend_pid AND l.lock_key = run.lock_key)
               OR EXISTS (
                   SELECT 1 FROM replicron_job_locks held
                   WHERE held.namespace = run.namespace AND held.job = run.job
                     AND held.run_id = run.run_id)
               -- Written off already in all but name: a janitor records it abandoned, a
               -- run. Row lease: its lease ran out. Advisory: its replica's heartbeats are
               -- stale by the replica's own stale_after (the lock is not held, above).
               OR run.lease_until < now()
               OR run.backend_pid IS NOT NULL AND EXISTS (
                   SELECT 1 FROM replicron_replicas seen
                   WHERE seen.namespace = run.namespace AND seen.replica_id = run.replica_id
                     AND coalesce(run.heartbeat_at, run.claimed_at)
                         < now() - seen.stale_after)));
$$;

-- The form replicas of before migration 0009 call, with their mode: the four-argument form
-- answers alike for either mode (each mode leaves the other's evidence empty: row-lease rows
-- have no backend_pid or lock_key; advisory replicas write no lock rows).
CREATE FUNCTION replicron_runs_reached(
    p_namespace text, p_job text, p_limit integer, p_mine uuid[], p_leased boolean
) RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT replicron_runs_reached(p_namespace, p_job, p_limit, p_mine);
$$;

-- Manual runs asked for across the cluster (replicron run-now): each replica that schedules
-- the job claims a manual run at the requested instant; the ledger runs it once.
CREATE TABLE replicron_run_requests (
    request_id   bigserial   PRIMARY KEY,
    namespace    text        NOT NULL,
    job          text        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    requested_by text        NOT NULL
);
CREATE INDEX replicron_run_requests_namespace_idx
    ON replicron_run_requests (namespace, requested_at);

INSERT INTO replicron_migrations (version, name) VALUES
    (1, 'initial'),
    (2, 'claim_tokens_and_replicas'),
    (3, 'manual_and_limited_runs'),
    (4, 'job_registry_and_pauses'),
    (5, 'row_leases'),
    (6, 'leader_lease'),
    (7, 'run_requests'),
    (8, 'missed_ranges'),
    (9, 'advisory_locks'),
    (10, 'runs_reached_written_off');

COMMIT;
