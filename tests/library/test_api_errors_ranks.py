"""Bad input to the library in a real job (mpirun, 2 and 3 ranks): every rank raises the same
one-line error and exits non-zero, rank 0 prints it once, and mpirun returns (no rank waits for
another in a collective). Each rank's exit code is printed by a shell around it, so that mpirun
does not end the job at the first rank's exit; the cases are in ``mpi_scripts/api_errors.py``.
Includes errors only rank 0 finds (a strategy for 7 ranks; a user's strategy raising a KeyError
or a RuntimeError while rank 0 allocates), which the other ranks must hear of from rank 0. Rank 0
ends last, and MPI must still be up under it: no rank's exit may finalize it under another."""

import re

import pytest
from support.jobs import mpirun, python_cmd

pytestmark = pytest.mark.mpi

SCRIPT = "tests/support/mpi_scripts/api_errors.py"
# each rank's command: the script, then its exit code (the shell exits 0, so mpirun waits for all)
WRAP = 'python=$1; shift; "$python" "$@"; echo "rank $OMPI_COMM_WORLD_RANK exit $?"'


@pytest.mark.parametrize(
    "case,ranks,kind,code,words",
    [
        ("empty", 2, "UsageError", 2, "Balancer.for_world's dataset has 0 samples"),
        ("every-str", 2, "UsageError", 2, "rebalance_every must be an integer, got '10'"),
        ("seven-ranks", 3, "UsageError", 2, "the strategy was made for 7 ranks but the job has 3"),
        ("raises-initial", 2, "TrainingError", 1, "allocating: KeyError: 'batch' (at api_errors.py:"),
        (
            "raises-rebalance",
            3,
            "TrainingError",
            1,
            "rank 0 failed while allocating: RuntimeError: user strategy broke at update 2 (at api_errors.py:",
        ),
    ],
)
def test_every_rank_raises_the_same_line_and_exits(case, ranks, kind, code, words):
    proc = mpirun(ranks, ["sh", "-c", WRAP, "sh", *python_cmd(SCRIPT, case)], timeout=240)
    text = proc.stdout + proc.stderr
    raised = re.findall(r"rank (\d) raised (\w+): (.*)", proc.stdout)
    assert sorted(r for r, _, _ in raised) == [str(r) for r in range(ranks)], text[-3000:]
    assert {(k, m) for _, k, m in raised} == {(kind, raised[0][2])} and words in raised[0][2], text[-3000:]
    exits = re.findall(r"rank (\d) exit (\d+)", proc.stdout)
    assert sorted(exits) == [(str(r), str(code)) for r in range(ranks)], text[-3000:]
    untagged = [re.sub(r"^\[\d+,\d+\]<std\w+>:", "", line) for line in proc.stderr.splitlines()]  # mpirun's tags
    errors = [line for line in untagged if "bno-hvd: error:" in line]
    assert errors == [f"bno-hvd: error: {raised[0][2]}"], text[-3000:]
    assert "Traceback" not in text and "was not refused" not in text, text[-3000:]
    assert "MPI was finalized under it" not in text, text[-3000:]  # (rank 0 ends last: the others wait for it)
