-- Missed ticks past the enumeration bound (a per-second job down for hours) are one row per
-- job and gap: keyed by the first tick (scheduled_at), with the last (scheduled_through) and
-- how many ticks it stands for. A tick's own row has no scheduled_through and counts 1. A tick
-- inside a range has its record there: nobody records or claims it again.
ALTER TABLE replicron_runs ADD COLUMN scheduled_through INTEGER;
ALTER TABLE replicron_runs ADD COLUMN ticks INTEGER NOT NULL DEFAULT 1;
CREATE INDEX replicron_runs_ranges_idx ON replicron_runs (job, scheduled_through)
    WHERE scheduled_through IS NOT NULL;
