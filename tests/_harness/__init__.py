"""The tests' harness for real processes, shared by tests/acceptance, tests/faults and
tests/browser.

* :mod:`.processes`: one way to start a child process (from the repository root, its output in
  ``<name>.log``, killed if the test process dies), wait on it, stop, kill or pause it;
* :mod:`.replicas` and :mod:`.replica`: the one replica program the tests run, with options
  for each suite's needs, and how a test starts it and waits until it is ready;
* :mod:`.events`: what a replica reports, one JSON line per event;
* :mod:`.runs_table`: runs stamped with the database clock, for the acceptance tests;
* :mod:`.daemons`: ``replicron run`` daemons on configs of their own;
* :mod:`.reporting`: what a failed test's report shows of its processes.
"""
