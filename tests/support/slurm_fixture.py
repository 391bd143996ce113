"""The body of a module's Slurm cluster fixture (tests/cli/test_slurm*.py): started, skipped with
the reason where Slurm cannot run here, stopped and removed after, nothing left behind."""

import pytest
from support.slurm_cluster import SlurmCluster, SlurmError, unavailable_reason


def running_cluster(workdir: str, nodes: dict[str, int], partitions: dict):
    """Yields the started cluster; a skip where this machine cannot run one; fails if anything is left."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    slurm = SlurmCluster(workdir, nodes=nodes, partitions=partitions)
    try:
        try:
            slurm.start()
        except SlurmError as err:
            left = slurm.stop(remove=False)
            pytest.skip(f"Slurm did not start on this machine: {err}" + (f" (left behind: {left})" if left else ""))
        yield slurm
    finally:
        left = slurm.stop()
        assert not left, f"left behind: {left}"
