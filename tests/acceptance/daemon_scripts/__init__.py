"""Programs that the daemon acceptance tests (``tests/acceptance/test_daemon.py``) give the
daemon to run as command jobs."""
