"""The engine under both scheduler faces: the pure planner, the job registry, dispatch, runs,
workers and how outcomes are recorded (internal)."""

__all__: list[str] = []
