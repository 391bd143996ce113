"""The exactness matrix: every path a user can take x every mechanism that could break "N uneven
ranks = one process", each cell a test that compares N ranks with changing uneven splits to one
process (float64, 1e-10) and would fail without the mechanism, or a refusal with its one line.

``docs/exactness.md`` shows it, generated from this list (``launch/update-docs``);
``tests/docs/test_exactness_matrix.py`` checks that every cell is filled, every test named exists,
every refusal's line is in the code, and the page shows the table as it is here.

No import beyond the standard library: ``launch/update-docs`` uses this module too.
"""

from dataclasses import dataclass

PATHS = {
    "horovod": "Horovod drop-in",
    "ddp": "DDP drop-in",
    "lightning": "Lightning (`BalancedStrategy`)",
    "train": "`bno-hvd train --engine horovod`",
    "train-torch": "`bno-hvd train --engine torch`",
}
MECHANISMS = {
    "dropout": "dropout",
    "batchnorm": "BatchNorm, a rank at 1 sample",
    "text": "text weighted by tokens",
    "micro": "micro-batches under a memory cap",
    "sitout": "a rank sitting out and back",
    "lossscale": "a loss scale (GradScaler)",
}


@dataclass(frozen=True)
class Test:
    """A cell shown by a test: ``node`` is ``path::function`` (a parametrized test's ids after it, in
    brackets, as pytest shows them); ``note`` what the cell runs, in a few words."""

    node: str
    note: str = ""


@dataclass(frozen=True)
class Refused:
    """A cell that is refused: the one line the user gets (a part of it that the code holds), and the
    test that shows the refusal."""

    line: str
    node: str


@dataclass(frozen=True)
class GpuOnly:
    """A cell whose mechanism runs on GPUs only: what runs it there (not on this machine), and the
    test of its parts on the CPU."""

    where: str
    node: str


LIB, TRAIN = "tests/library/", "tests/training/"
SITOUT = f"{LIB}test_dropin_sitout.py::test_sitting_out_in_a_plain_loop_equals_one_process"
LIGHTNING_EXACT = f"{LIB}test_lightning.py::test_4_uneven_ranks_equal_one_process_and_plain_ddp_reduction_does_not"
CELLS = {
    ("horovod", "dropout"): Test(f"{LIB}test_horovod_port.py::test_the_port_on_4_uneven_ranks_equals_one_process"),
    ("horovod", "batchnorm"): Test(
        f"{LIB}test_exact_library.py::test_the_drop_in_with_exact_batchnorm_equals_one_process[*-horovod]",
        "resnet18 and a BatchNorm1d MLP",
    ),
    ("horovod", "text"): Test(
        f"{LIB}test_text_dropins.py::test_text_through_the_drop_in_equals_one_process[horovod]",
        "split by counts and by measured cost",
    ),
    ("horovod", "micro"): Refused(
        "a memory cap (max_batch=, max_tokens=) splits a rank's batch into micro-batches",
        f"{LIB}test_dropin.py::test_what_cannot_be_exact_is_refused_with_one_line",
    ),
    ("horovod", "sitout"): Test(f"{SITOUT}[horovod]", "one out and back, three of four, 8,8,0,0, a break"),
    ("horovod", "lossscale"): Test(f"{SITOUT}[horovod]", "multisit:amp: a scale that doubles every step"),
    ("ddp", "dropout"): Test(f"{LIB}test_ddp_port.py::test_the_ddp_port_on_4_uneven_ranks_equals_one_process"),
    ("ddp", "batchnorm"): Test(
        f"{LIB}test_exact_library.py::test_the_drop_in_with_exact_batchnorm_equals_one_process[*-ddp]",
        "resnet18 and a BatchNorm1d MLP",
    ),
    ("ddp", "text"): Test(
        f"{LIB}test_text_dropins.py::test_text_through_the_drop_in_equals_one_process[ddp]",
        "split by counts and by measured cost",
    ),
    ("ddp", "micro"): Refused(
        "a memory cap (max_batch=, max_tokens=) splits a rank's batch into micro-batches",
        f"{LIB}test_dropin.py::test_what_cannot_be_exact_is_refused_with_one_line",
    ),
    ("ddp", "sitout"): Test(
        f"{SITOUT}[ddp]", "one out and back, three of four, a break; zeros in the first two updates refused"
    ),
    ("ddp", "lossscale"): Test(f"{SITOUT}[ddp]", "sitout:amp: a scale that doubles every step"),
    ("lightning", "dropout"): Test(LIGHTNING_EXACT, "Dropout2d and dropout"),
    ("lightning", "batchnorm"): Test(LIGHTNING_EXACT, "BatchNorm2d, a rank at 1 sample, running statistics compared"),
    ("lightning", "text"): Refused(
        "text split by cost (lengths=, cost=, global_tokens=) is not supported by bno.lightning yet",
        f"{LIB}test_lightning.py::test_what_balanced_strategy_refuses_when_built_is_one_usage_error[text]",
    ),
    ("lightning", "micro"): Refused(
        "a memory cap (max_batch=) runs micro-batches, which Lightning's loop does not",
        f"{LIB}test_lightning.py::test_what_balanced_strategy_refuses_when_built_is_one_usage_error[micro]",
    ),
    ("lightning", "sitout"): Test(
        f"{LIB}test_lightning_sitout.py::test_ranks_out_inside_lightning_equal_one_process",
        "one out and back, three of four, one out a whole epoch, a sync_dist loss; 8,8,0,0: "
        "test_a_split_given_by_hand_with_ranks_out_from_the_start_is_exact",
    ),
    ("lightning", "lossscale"): Refused(
        "a loss scale (precision='16-mixed', its GradScaler) is not supported by BalancedStrategy yet",
        f"{LIB}test_lightning.py::test_a_loss_scale_is_refused_in_one_line",
    ),
    ("train", "dropout"): Test(
        f"{TRAIN}test_exact_paths.py::test_dropout_under_memory_caps_equals_one_process[horovod]",
        "a user's model, under memory caps, a random split changing every 2 updates",
    ),
    ("train", "batchnorm"): Test(
        f"{TRAIN}test_exact_batchnorm.py::test_resnet18_on_4_changing_uneven_ranks_equals_one_process"
    ),
    ("train", "text"): Test(f"{TRAIN}test_text_training.py::test_four_ranks_with_changing_splits_equal_one_process"),
    ("train", "micro"): Test(
        f"{TRAIN}test_exact_paths.py::test_dropout_under_memory_caps_equals_one_process[horovod]",
        "with dropout, a random split changing every 2 updates; a fixed split: "
        "test_train_equivalence.py::test_uneven_ranks_equal_single_process[adam-micro]",
    ),
    ("train", "sitout"): Test(
        f"{LIB}test_sit_out.py::test_a_rank_sits_out_comes_back_and_training_stays_exact[horovod]"
    ),
    ("train", "lossscale"): GpuOnly(
        "`--amp`'s GradScaler (float16) runs on GPUs only, and the GPU check's machine has no Horovod "
        "(the torch engine's twin ran there)",
        f"{LIB}test_exact_library.py::test_the_loss_scale_travels_with_a_rank_back_from_sitting_out",
    ),
    ("train-torch", "dropout"): Test(
        f"{TRAIN}test_exact_paths.py::test_dropout_under_memory_caps_equals_one_process[torch]",
        "a user's model, under memory caps, a random split changing every 2 updates",
    ),
    ("train-torch", "batchnorm"): Test(f"{TRAIN}test_torch_engine.py::test_the_torch_engine_is_exact_with_batchnorm"),
    ("train-torch", "text"): Test(
        f"{TRAIN}test_text_training.py::test_four_ranks_with_changing_splits_equal_one_process[torch engine]"
    ),
    ("train-torch", "micro"): Test(
        f"{TRAIN}test_exact_paths.py::test_dropout_under_memory_caps_equals_one_process[torch]",
        "with dropout, a random split changing every 2 updates",
    ),
    ("train-torch", "sitout"): Test(
        f"{LIB}test_sit_out.py::test_a_rank_sits_out_comes_back_and_training_stays_exact[torch]"
    ),
    ("train-torch", "lossscale"): Test(
        f"{LIB}test_exact_cuda.py::test_the_loss_scale_travels_with_a_rank_back_on_cuda",
        "float16 on CUDA, rank 3 out while the scale doubles; ran on an H200 in the GPU check, 2026-11-29",
    ),
}


def matrix_markdown() -> str:
    """The matrix as docs/exactness.md shows it: a row per mechanism, a column per path."""
    head = "| | " + " | ".join(PATHS.values()) + " |\n|---|" + "---|" * len(PATHS) + "\n"
    rows = []
    for key, mechanism in MECHANISMS.items():
        cells = []
        for path in PATHS:
            cell = CELLS[(path, key)]
            if isinstance(cell, Refused):
                cells.append(f"refused: “{cell.line} …” (`{short(cell.node)}`)")
            elif isinstance(cell, GpuOnly):
                cells.append(
                    f"GPU only, not run on a GPU yet: {cell.where}; its parts on the CPU: `{short(cell.node)}`"
                )
            else:
                cells.append(f"`{short(cell.node)}`" + (f" ({cell.note})" if cell.note else ""))
        rows.append(f"| {mechanism} | " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n"


def short(node: str) -> str:
    """``tests/x/test_y.py::test_z[id]`` -> ``test_y.py::test_z[id]``."""
    return node.rsplit("/", 1)[-1]
