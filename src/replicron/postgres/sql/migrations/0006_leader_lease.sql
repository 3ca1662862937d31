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
