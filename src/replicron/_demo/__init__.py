"""``replicron demo``: replica processes on one backend, each tick run once (internal)."""

__all__: list[str] = []
