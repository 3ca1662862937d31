"""Helpers of tests/faults/test_daemon_fencing.py: the command job it runs (``worker.py``) and
the daemons it starts (``daemons.py``)."""
