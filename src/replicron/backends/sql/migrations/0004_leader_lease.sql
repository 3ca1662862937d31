-- Leader mode: who holds the leader lease and how often it changed hands. The lease itself is
-- a file lock in the state directory (the kernel drops it with its process); this row is what
-- the others and the status read.
CREATE TABLE replicron_leaders (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    holder      TEXT    NOT NULL,
    epoch       INTEGER NOT NULL,
    acquired_at INTEGER NOT NULL
);
