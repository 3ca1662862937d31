"""A deterministic simulator of replicas coordinating through PostgreSQL.

Several real replicas (``AsyncScheduler`` over ``PostgresBackend``, the engine and backend as
they ship) run on virtual time against the reference ledger, each through a simulated link
that delays, drops and cuts; processes are killed, frozen and restarted. After every step the
invariants of docs/protocol.md are checked. A seed decides everything: the same seed gives
the same trace. ``bash scripts/simulate`` runs it.
"""
