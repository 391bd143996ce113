"""What the GPU check runs (:mod:`bno_hvd.lab.gpucheck`): its parts, each a command with a budget,
and the targets its report judges.

The first two parts are the check's own (``--probe``, ``--install``: :mod:`bno_hvd.lab.gpuprobe`);
every other part is a pytest selection of the suite's GPU tests, which skip without CUDA and
report what they measure with ``record_property`` (tests/support/gpu.py). A part names its tests
by file and node id: tests/lab/test_gpu_check.py checks here, on the CPU, that each exists.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from bno_hvd.lab.gpureport import Target

TOTAL_BUDGET_S = 465.0  # 7 min 45 s: the check ends inside 8 minutes of one 10-minute run

CUDA_TESTS = (
    "tests/processes/test_device.py::test_cuda_timing_waits_for_the_gpu",
    "tests/processes/test_device.py::test_gpu_memory_is_what_the_monitor_reports",
    "tests/processes/test_device.py::test_gpu_ranks_train_with_amp_and_a_derived_cap",
    "tests/library/test_exact_cuda.py::test_the_loss_scale_travels_with_a_rank_back_on_cuda",
)


@dataclass(frozen=True)
class Part:
    """One part of the check: a command (``{dir}``: the part's own folder) and its budget in seconds."""

    name: str
    what: str
    argv: tuple
    budget_s: float


def pytest_part(name: str, what: str, budget_s: float, python: str, *selection: str) -> Part:
    argv = (python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", "{dir}/junit.xml", *selection)
    return Part(name, what, argv, budget_s)


def check_parts(python: str = sys.executable) -> list[Part]:
    """The parts of the check, in the order they run; budgets sum to :data:`TOTAL_BUDGET_S`."""
    me = (python, "-m", "bno_hvd.lab.gpucheck")
    return [
        Part("environment", "the GPU, driver, torch, CUDA, the modules the parts import, MPS", (*me, "--probe"), 15),
        Part("install", "the project into this python without dependencies (pip -e, no index)", (*me, "--install"), 35),
        pytest_part(
            "cuda-tests",
            "the suite's CUDA tests: timing, memory, --amp float16 with a derived cap, a GradScaler across a sit-out",
            95,
            python,
            *CUDA_TESTS,
        ),
        pytest_part(
            "exact-batchnorm",
            "exact BatchNorm on CUDA, float64: 4 ranks on the GPU, uneven (a rank at 1) == 1 process",
            85,
            python,
            "tests/library/test_exact_cuda.py",
            "-k",
            "batchnorm",
        ),
        pytest_part(
            "max-batch-auto",
            "--max-batch auto on a model whose batch does not fit whole; micro-batched == whole-batch update",
            60,
            python,
            "tests/training/test_memory_cap_cuda.py",
        ),
        pytest_part(
            "shared-gpu",
            "REAL GPU heterogeneity: ranks sharing the GPU (MPS shares, else GPU + CPU ranks), bench --rounds",
            120,
            python,
            "tests/lab/test_shared_gpu.py",
        ),
        pytest_part(
            "ddp-example",
            "examples/ddp_mnist.py on CUDA under torchrun, on synthesized Fashion-MNIST IDX files",
            55,
            python,
            "tests/library/test_ddp_example_cuda.py",
        ),
    ]


TARGETS = [
    Target("exact BatchNorm, MLP, 4 ranks vs 1 process, float64", "exact-batchnorm", "mlp_vs_one", "<=", 1e-10),
    Target("exact BatchNorm, resnet18, 4 ranks vs 1 process", "exact-batchnorm", "resnet18_vs_one", "<=", 1e-10),
    Target(
        "GradScaler across a sit-out: updates whose computing ranks' scales differ",
        "cuda-tests",
        "scale_mismatches",
        "<=",
        0,
    ),
    Target("micro-batched vs whole-batch update (float64)", "max-batch-auto", "micro_vs_whole", "<=", 1e-10),
    Target("shared GPU: balanced / top peer (median)", "shared-gpu", "balanced_vs_top_peer", ">=", 0.97),
]
