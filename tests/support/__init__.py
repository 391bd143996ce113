"""Helpers of the test suite (not tests): real jobs and their checks, the fuzz surfaces, the
private Slurm cluster and its fixture, network-namespace hosts, a user's model, and the scripts run under mpirun.
Tests import them as ``support.<module>`` (``tests/`` is on ``sys.path`` through conftest.py)."""
