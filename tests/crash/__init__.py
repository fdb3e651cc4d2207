"""Crash tests: a real Spark query writing through the sink, killed at named instants.

``driver_program.py`` is the query (a standalone program, run in its own process group),
``harness.py`` runs it, crashes it, restarts it and checks every invariant; the tests are in
``test_crash_points.py`` and ``test_random_kills.py``. See ``docs/testing.md``, "Crash tests".
"""
