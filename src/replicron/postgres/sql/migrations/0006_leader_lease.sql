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
