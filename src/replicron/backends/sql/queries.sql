-- Named queries of the embedded backend's SQLite ledger. Each starts with a "-- name: NAME"
-- line; the text up to the next such line is the statement (one each). Parameters use
-- SQLite's :name style. Times are integer microseconds since the Unix epoch, UTC.

-- ---- the connection ----------------------------------------------------------------------

-- name: probe
-- Reads the header: a file that is no database fails here, before anything is written to it.
SELECT count(*) FROM sqlite_master;

-- name: wal_mode
-- Readers never wait for the writer; answers the journal mode in force.
PRAGMA journal_mode = WAL;

-- name: synchronous_full
-- A committed claim survives a power cut.
PRAGMA synchronous = FULL;

-- name: wal_checkpoint_pages
-- The WAL is copied into the ledger once it holds this many pages (512 KiB of 4 KiB pages),
-- not SQLite's default 1000: a small state directory must hold it beside the ledger.
PRAGMA wal_autocheckpoint = 128;

-- name: wal_size_limit
-- A WAL that grew past 1 MiB (a reader kept a checkpoint from restarting it) is cut back to
-- this size when it restarts.
PRAGMA journal_size_limit = 1048576;

-- name: begin_write
-- Takes the write lock at once: a writer queues on it (for at most the busy timeout) before it
-- reads anything it decides on.
BEGIN IMMEDIATE;

-- name: begin_exclusive
-- Migrations: nobody else reads or writes meanwhile.
BEGIN EXCLUSIVE;

-- name: begin_read
-- One snapshot for the reads that follow (the first read takes it).
BEGIN;

-- name: commit
COMMIT;

-- name: ran_outcomes_create
-- The outcomes of a tick that ran (max_runs counts them), as the code knows them: a table of
-- this connection alone, filled when it opens (see runs_reached).
CREATE TEMP TABLE replicron_ran_outcomes (outcome TEXT PRIMARY KEY);

-- name: ran_outcome_insert
INSERT INTO temp.replicron_ran_outcomes (outcome) VALUES (:outcome);

-- ---- migrations --------------------------------------------------------------------------

-- name: migrations_create
CREATE TABLE IF NOT EXISTS replicron_migrations (
    version    INTEGER PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
);

-- name: migrations_applied
SELECT version FROM replicron_migrations;

-- name: migration_record
INSERT INTO replicron_migrations (version, name, applied_at) VALUES (:version, :name, :now);

-- ---- claims and outcomes -----------------------------------------------------------------

-- name: claim_insert
-- Insert the tick's row unless anybody has it (then nothing changes: rowcount 0).
INSERT INTO replicron_runs (job, scheduled_at, manual, replica_id, pid, pid_start, claimed_at)
SELECT :job, :tick, :manual, :replica, :pid, :pid_start, :now
WHERE NOT EXISTS (  -- a tick inside a range of missed ticks has its record there
    SELECT 1 FROM replicron_runs missed
    WHERE missed.job = :job AND missed.scheduled_through >= :tick
      AND missed.scheduled_at < :tick AND missed.scheduled_through IS NOT NULL
)
ON CONFLICT (job, scheduled_at) DO NOTHING;

-- name: runs_reached
-- How many scheduled runs the job has, counted up to :limit: claimed ticks not recorded as not
-- run (missed, skipped), pruned ones included, manual runs left out.
SELECT count(*) + coalesce((SELECT runs FROM replicron_pruned_runs WHERE job = :job), 0)
FROM (
    SELECT 1 FROM replicron_runs
    WHERE job = :job AND manual = 0
      AND (outcome IS NULL
           OR outcome IN (SELECT outcome FROM temp.replicron_ran_outcomes))
    LIMIT :limit
);

-- name: last_run
-- The latest tick of the job's scheduled rows counted as runs (as runs_reached counts them).
SELECT max(scheduled_at)
FROM replicron_runs
WHERE job = :job AND manual = 0
  AND (outcome IS NULL
       OR outcome IN (SELECT outcome FROM temp.replicron_ran_outcomes));

-- name: started_runs_of_job
-- The job's other started, unfinished runs: one may still be going (the overlap check).
SELECT run_id, job, scheduled_at, replica_id, pid, pid_start
FROM replicron_runs
WHERE job = :job AND outcome IS NULL AND started_at IS NOT NULL AND run_id <> :run_id;

-- name: open_runs_with_pid
-- Janitor: every open row that names its claimant's process.
SELECT run_id, job, scheduled_at, replica_id, pid, pid_start
FROM replicron_runs
WHERE outcome IS NULL AND pid IS NOT NULL;

-- name: abandon_run
-- An open run whose process died (unless it was recorded meanwhile).
UPDATE replicron_runs SET outcome = :outcome, finished_at = :now, error = :error
WHERE run_id = :run_id AND outcome IS NULL;

-- name: abandon_tick
-- A tick this replica claimed and never recorded (unless it was recorded meanwhile).
UPDATE replicron_runs SET outcome = :outcome, finished_at = :now, error = :error
WHERE job = :job AND scheduled_at = :tick AND outcome IS NULL;

-- name: mark_started
UPDATE replicron_runs SET started_at = :now WHERE run_id = :run_id;

-- name: record_outcome
-- How a claimed tick ended; a start time not given keeps the one the claim wrote, unless
-- the tick was missed: it never started.
UPDATE replicron_runs
SET outcome = :outcome,
    started_at = CASE WHEN :outcome = 'missed' THEN NULL ELSE coalesce(:started, started_at) END,
    finished_at = :finished, error = :error
WHERE job = :job AND scheduled_at = :tick;

-- name: insert_finished
-- A tick nobody ran (missed), unless anybody has its row.
INSERT INTO replicron_runs
    (job, scheduled_at, replica_id, pid, claimed_at, finished_at, outcome, error)
SELECT :job, :tick, :replica, :pid, :now, :now, :outcome, :error
WHERE NOT EXISTS (  -- a tick inside a range of missed ticks has its record there
    SELECT 1 FROM replicron_runs missed
    WHERE missed.job = :job AND missed.scheduled_through >= :tick
      AND missed.scheduled_at < :tick AND missed.scheduled_through IS NOT NULL
)
ON CONFLICT (job, scheduled_at) DO NOTHING;

-- name: range_within
-- Whether a range of missed ticks of the job lies (partly) in :tick through :through.
SELECT 1 FROM replicron_runs
WHERE job = :job AND scheduled_through IS NOT NULL
  AND scheduled_at <= :through AND scheduled_through >= :tick
LIMIT 1;

-- name: row_at
-- Whether the job has a row keyed :tick.
SELECT 1 FROM replicron_runs WHERE job = :job AND scheduled_at = :tick;

-- name: ticks_held_within
-- How many ticks of the job in :tick through :through have rows of their own (manual runs
-- lie off the job's ticks).
SELECT count(*) FROM replicron_runs
WHERE job = :job AND scheduled_at BETWEEN :tick AND :through AND manual = 0
  AND scheduled_through IS NULL;

-- name: insert_missed_range
-- Missed ticks through :through, :ticks of them, in one row keyed :tick (the caller checked
-- that no range lies in the span, in the same transaction).
INSERT INTO replicron_runs
    (job, scheduled_at, scheduled_through, ticks, replica_id, pid, claimed_at, finished_at,
     outcome, error)
VALUES (:job, :tick, :through, :ticks, :replica, :pid, :now, :now, 'missed', :error)
ON CONFLICT (job, scheduled_at) DO NOTHING;

-- name: expected_of_job
-- What each registration of the job expects (microseconds, comma-separated, ascending).
SELECT expected FROM replicron_jobs WHERE job = :job AND expected <> '';

-- name: last_tick
-- The job's latest tick (manual runs are not ticks), a range of missed ticks by its last: two
-- index lookups.
SELECT max(
    (SELECT max(scheduled_at) FROM replicron_runs WHERE job = :job AND manual = 0),
    coalesce((SELECT max(scheduled_through) FROM replicron_runs
              WHERE job = :job AND scheduled_through IS NOT NULL), 0)
);

-- name: last_finish
-- The job's latest tick (manual runs are not ticks) and how it ended: one index lookup.
SELECT scheduled_at, finished_at, outcome FROM replicron_runs
WHERE job = :job AND manual = 0
ORDER BY scheduled_at DESC
LIMIT 1;

-- ---- retention ---------------------------------------------------------------------------

-- name: prunable_runs
-- Finished rows claimed before :cutoff, but each job's latest scheduled tick (catch-up reads it
-- after long pauses), and manual rows claimed since :requests_cutoff (a run asked for across
-- the replicas may still be pending: its row is what says it ran).
SELECT run_id, job, manual, outcome FROM replicron_runs old
WHERE old.claimed_at < :cutoff AND old.outcome IS NOT NULL
  AND (old.manual = 0 OR old.claimed_at < :requests_cutoff)
  AND old.scheduled_at < (SELECT max(latest.scheduled_at)
                          FROM replicron_runs latest
                          WHERE latest.job = old.job AND latest.manual = 0)
LIMIT :batch;

-- name: delete_run
DELETE FROM replicron_runs WHERE run_id = :run_id;

-- name: tally_pruned_runs
-- The scheduled runs pruned go to their job's tally: max_runs counts them.
INSERT INTO replicron_pruned_runs (job, runs) VALUES (:job, :runs)
ON CONFLICT (job) DO UPDATE SET runs = runs + excluded.runs;

-- name: prune_registrations
-- Registrations not written since :cutoff.
DELETE FROM replicron_jobs WHERE last_seen < :cutoff;

-- name: prune_replicas
-- Replicas not seen since :cutoff.
DELETE FROM replicron_replicas WHERE last_seen < :cutoff;

-- ---- replicas, the job registry and pauses -----------------------------------------------

-- name: replica_register
INSERT INTO replicron_replicas (replica_id, pid, pid_start, started_at, last_seen)
VALUES (:replica, :pid, :pid_start, :now, :now)
ON CONFLICT (replica_id) DO UPDATE SET
    pid = excluded.pid, pid_start = excluded.pid_start, started_at = excluded.started_at,
    last_seen = excluded.last_seen, stopped_at = NULL;

-- name: replica_stopped
UPDATE replicron_replicas SET stopped_at = :now WHERE replica_id = :replica;

-- name: replica_joined
UPDATE replicron_replicas SET started_at = :since WHERE replica_id = :replica;

-- name: replica_seen
UPDATE replicron_replicas SET last_seen = :now WHERE replica_id = :replica;

-- name: paused_jobs
SELECT job FROM replicron_paused;

-- name: registrations_of_replica_delete
DELETE FROM replicron_jobs WHERE replica_id = :replica;

-- name: registration_upsert
INSERT INTO replicron_jobs (job, replica_id, trigger, fingerprint, grace, expected, last_seen)
VALUES (:job, :replica, :trigger, :fingerprint, :grace, :expected, :now)
ON CONFLICT (job, replica_id) DO UPDATE SET
    trigger = excluded.trigger, fingerprint = excluded.fingerprint, grace = excluded.grace,
    expected = excluded.expected, last_seen = excluded.last_seen;

-- name: registration_delete
DELETE FROM replicron_jobs WHERE job = :job AND replica_id = :replica;

-- name: drifted_registrations
-- The registrations of this replica's jobs by other replicas, not stopped, that define them
-- differently; with each one's process (alive is decided by the caller).
SELECT other.job, other.replica_id, other.trigger, other.fingerprint, other.grace,
       other.expected, other.last_seen, seen.pid, seen.pid_start
FROM replicron_jobs mine
JOIN replicron_jobs other ON other.job = mine.job
    AND other.replica_id <> mine.replica_id AND other.fingerprint <> mine.fingerprint
JOIN replicron_replicas seen ON seen.replica_id = other.replica_id AND seen.stopped_at IS NULL
WHERE mine.replica_id = :replica
ORDER BY other.job, other.replica_id;

-- name: registrants_of_job
-- The replicas that registered the job, with their process (none: the replica row is gone).
SELECT job.replica_id, seen.pid, seen.pid_start, seen.stopped_at
FROM replicron_jobs job
LEFT JOIN replicron_replicas seen ON seen.replica_id = job.replica_id
WHERE job.job = :job
ORDER BY job.replica_id;

-- name: pause_insert
INSERT INTO replicron_paused (job, paused_at, paused_by) VALUES (:job, :now, :by)
ON CONFLICT (job) DO NOTHING;

-- name: pause_delete
DELETE FROM replicron_paused WHERE job = :job;

-- name: run_request_insert
-- A manual run asked for across the replicas; nothing when no replica registered the job.
INSERT INTO replicron_run_requests (job, requested_at, requested_by)
SELECT :job, :now, :by WHERE EXISTS (SELECT 1 FROM replicron_jobs WHERE job = :job);

-- name: run_requests_expire
DELETE FROM replicron_run_requests WHERE requested_at < :since;

-- name: run_requests
-- Requests younger than :since not yet run: no manual row of the job within the millisecond
-- the engine may move the run's instant by.
SELECT req.job, req.requested_at FROM replicron_run_requests req
WHERE req.requested_at > :since
  AND NOT EXISTS (
      SELECT 1 FROM replicron_runs run
      WHERE run.job = req.job AND run.manual = 1
        AND run.scheduled_at BETWEEN req.requested_at AND req.requested_at + 1000)
ORDER BY req.requested_at, req.request_id;

-- ---- the cluster's status ----------------------------------------------------------------

-- name: replicas
SELECT replica_id, pid, pid_start, started_at, last_seen, stopped_at FROM replicron_replicas;

-- name: registrations
SELECT job, replica_id, trigger, fingerprint, grace, expected, last_seen
FROM replicron_jobs
ORDER BY job, replica_id;

-- name: pauses
SELECT job, paused_at, paused_by FROM replicron_paused ORDER BY job;

-- name: ledger_jobs
SELECT DISTINCT job FROM replicron_runs;

-- name: last_outcome
-- The job's latest recorded outcome.
SELECT replica_id, scheduled_at, started_at, finished_at, outcome, error
FROM replicron_runs
WHERE job = :job AND outcome IS NOT NULL
ORDER BY scheduled_at DESC
LIMIT 1;

-- name: job_tallies
-- The job's latest success, its missed ticks since :since (a range counts all its ticks when
-- its last is since then), and its latest tick (a range's last).
SELECT max(finished_at) FILTER (WHERE outcome = :succeeded),
       coalesce(sum(ticks) FILTER (
           WHERE outcome = :missed AND coalesce(scheduled_through, scheduled_at) > :since), 0),
       max(coalesce(scheduled_through, scheduled_at)) FILTER (WHERE manual = 0)
FROM replicron_runs
WHERE job = :job;

-- name: started_runs
-- The job's started, unfinished runs (those of dead processes are left out by the caller).
SELECT replica_id, run_id, pid, pid_start
FROM replicron_runs
WHERE job = :job AND outcome IS NULL AND started_at IS NOT NULL
ORDER BY run_id;

-- ---- leader mode -------------------------------------------------------------------------

-- name: leader_taken
-- This replica took the leader lease's file lock: it is the holder now, one epoch on.
INSERT INTO replicron_leaders (id, holder, epoch, acquired_at)
VALUES (1, :replica, 1, :now)
ON CONFLICT (id) DO UPDATE SET holder = excluded.holder, epoch = replicron_leaders.epoch + 1,
                               acquired_at = excluded.acquired_at;

-- name: leader_seen
-- Who holds the leader lease, as its holder last wrote.
SELECT holder, epoch FROM replicron_leaders WHERE id = 1;
