-- Named queries of a failover (see _failover.py): which server this is, and what a replica
-- puts back on a new primary that lacks what it wrote on the old one.

-- name: server_identity
-- The server's identity: its system identifier (the same on a primary and its physical
-- standbys, another on any other cluster) and its timeline (bumped by every promotion). On a
-- primary the timeline is the current WAL file's: the checkpoint's lags a promotion until the
-- next checkpoint ends.
SELECT (SELECT system_identifier FROM pg_control_system()),
       CASE WHEN pg_is_in_recovery() THEN (SELECT timeline_id FROM pg_control_checkpoint())
            ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
       END;

-- name: bump_run_ids
-- After a failover: the run ids this replica was given on the old primary may not have
-- reached the new one, whose sequence could give them out again. Move it past them, so run
-- ids stay fencing tokens (strictly increasing per job).
SELECT setval(pg_get_serial_sequence('replicron_runs', 'run_id'),
              greatest(nextval(pg_get_serial_sequence('replicron_runs', 'run_id')),
                       %(upto)s::bigint));

-- name: restore_rows
-- After a failover: put back the rows this replica wrote on the old primary that the new one
-- lacks (under their run id, unless it is taken), write the outcomes of its own rows that
-- did not make it across (open, or written off as abandoned by a janitor there; a run still
-- held is recorded abandoned: it was told to stop), and
-- replace a "missed" row that another replica recorded for a tick this replica did start. Per known row: what became of it
-- ("restored", "replaced" or "kept") and the row the new primary had before (its replica,
-- run id and outcome).
WITH known AS MATERIALIZED (
    SELECT *
    FROM unnest(%(run_ids)s::bigint[], %(jobs)s::text[], %(ticks)s::timestamptz[],
                %(outcomes)s::text[], %(started)s::timestamptz[], %(finished)s::timestamptz[],
                %(errors)s::text[], %(manual)s::bool[])
        WITH ORDINALITY AS k(run_id, job, scheduled_at, outcome, started_at, finished_at, error,
                             manual, n)
), before AS MATERIALIZED (
    SELECT known.n, run.replica_id, run.run_id, run.outcome
    FROM known JOIN replicron_runs run
      ON run.namespace = %(namespace)s AND run.job = known.job
     AND run.scheduled_at = known.scheduled_at
), restored AS (
    INSERT INTO replicron_runs AS run
        (run_id, namespace, job, scheduled_at, replica_id, started_at, finished_at, outcome,
         error, manual)
    SELECT CASE WHEN known.run_id IS NULL
                  OR EXISTS (SELECT FROM replicron_runs taken WHERE taken.run_id = known.run_id)
                THEN nextval(pg_get_serial_sequence('replicron_runs', 'run_id'))
                ELSE known.run_id END,
           %(namespace)s, known.job, known.scheduled_at, %(replica)s, known.started_at,
           coalesce(known.finished_at, now()), known.outcome, known.error, known.manual
    FROM known LEFT JOIN before USING (n)
    WHERE before.n IS NULL  -- the new server lacks the row
       -- a tick this replica started, recorded missed by another replica
       OR (before.outcome = 'missed' AND known.started_at IS NOT NULL)
       -- its own row, whose outcome did not make it across
       OR (coalesce(before.outcome, 'abandoned') = 'abandoned'
           AND before.replica_id = %(replica)s AND before.run_id = known.run_id)
    ORDER BY known.n
    ON CONFLICT (namespace, job, scheduled_at) DO UPDATE
    SET replica_id = excluded.replica_id, started_at = excluded.started_at,
        finished_at = excluded.finished_at, outcome = excluded.outcome, error = excluded.error,
        heartbeat_at = NULL
    WHERE run.outcome = 'missed'
       OR (coalesce(run.outcome, 'abandoned') = 'abandoned' AND run.replica_id = %(replica)s
           AND run.run_id = ANY(%(run_ids)s::bigint[]))
    RETURNING run.job, run.scheduled_at, (xmax = 0) AS inserted
)
SELECT known.n,
       CASE WHEN restored.inserted THEN 'restored' WHEN restored.job IS NOT NULL THEN 'replaced'
            ELSE 'kept' END,
       before.replica_id, before.run_id, before.outcome
FROM known
LEFT JOIN restored ON restored.job = known.job AND restored.scheduled_at = known.scheduled_at
LEFT JOIN before USING (n)
ORDER BY known.n;
