"""Launching MPI jobs: the mpirun command line and the shell exports, in one place for the launch
scripts, the tests and the benchmarks.

``launch/mpi-env`` exports the settings of :mod:`bno_hvd.processes.mpienv` (``python -m
bno_hvd.cli.launching`` prints the lines); the test suite and the benchmark scripts start jobs
with :func:`mpirun`. Inside every rank, :func:`bno_hvd.processes.mpienv.arrange_for_shared_cores`
applies the one setting that matters for speed, so that a plain ``horovodrun`` gets it too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from bno_hvd.processes.mpienv import MPI_SETTINGS, THREAD_DEFAULTS, mpi_env


def mpirun_command(np_: int, args, *, tag_output: bool = False) -> list[str]:
    """``mpirun`` for ``np_`` ranks on this host (oversubscribed, unbound: ranks share cores)."""
    cmd = [shutil.which("mpirun") or "mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    return cmd + (["--tag-output"] if tag_output else []) + list(args)


def mpirun(
    np_: int, args, *, timeout: float = 300, env: dict | None = None, cwd: str | None = None, tag_output: bool = True
) -> subprocess.CompletedProcess:
    """Run ``args`` on ``np_`` ranks with plain mpirun and the project's settings; output captured."""
    return subprocess.run(
        mpirun_command(np_, args, tag_output=tag_output),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else mpi_env(),
        cwd=cwd,
    )


def shell_exports() -> str:
    """``export`` lines for ``launch/mpi-env`` (thread counts only where the user set none)."""
    lines = [f"export {k}={v}" for k, v in MPI_SETTINGS.items()]
    lines += [f"export {k}=${{{k}:-{v}}}" for k, v in THREAD_DEFAULTS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(shell_exports())
