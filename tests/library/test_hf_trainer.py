"""The Hugging Face Trainer (``bno.hf.BalancedTrainer``, docs/hf-trainer.md): ``examples/hf_trainer_text.py``.

- The example is a plain Trainer script (a GPT-2 built from its config, the project's corpus) with
  its port marked (``tests/support/port_twin.py``): the twin differs in the marked lines alone,
  keeps every lint rule and trains under torchrun with the Trainer's own sampler.
- The example, run unchanged on 4 processes whose random split of each global batch of 16
  sequences changes every 2 updates (a process at 1 sequence), trains exactly as one process does
  on the same global batches (float64, the loss the mean over every predicted token), with its
  GPT-2 and with a small Llama: each process's loss is its share of the global batch's mean,
  the count of predictions the balancer's lengths; with transformers' own count it is not.
- Under ``equal`` each process gets an equal share of a global batch's tokens, not of its sequences.
- What the balanced Trainer cannot do exactly is refused in one line on every process.
"""

import json
import re

import pytest
import torch
from support.checks import max_relative_difference
from support.jobs import ROOT, TORCHRUN_EXIT_HANG, assert_ok, python_cmd, torchrun
from support.port_twin import example_source, lint_failures, plain_twin, port_diff
from test_accelerate import WRAP, assert_marked_lines_alone

from bno_hvd.data.corpus import fortunes

EXAMPLE = f"{ROOT}/examples/hf_trainer_text.py"
STEPS, GLOBAL = 12, 16
ARGS = ["--cpu", "--strategy", "random", "--max-steps", str(STEPS), "--log-steps", "4", "--seed", "5"]
ARGS += ["--max-seq-len", "48", "--vocab-size", "512", "--rebalance-every", "2"]


def test_the_trainer_twin_differs_from_the_example_in_the_marked_lines_alone():
    source = example_source(EXAMPLE)
    twin = assert_marked_lines_alone(source)
    assert "trainer = Trainer(" in [line.strip() for line in twin]
    assert sum("# bno-hvd" in line for line in source.splitlines()) <= 8


def test_docs_show_the_trainer_port_as_it_is():
    with open(f"{ROOT}/docs/hf-trainer.md") as fh:
        page = fh.read()
    assert port_diff(example_source(EXAMPLE), name="examples/hf_trainer_text.py", plain="Trainer") in page
    assert "torchrun --nproc-per-node 4 examples/hf_trainer_text.py --cpu" in page


@pytest.mark.slow
def test_the_trainer_twin_and_the_example_keep_every_lint_and_format_rule():
    failures = lint_failures(EXAMPLE)
    assert not failures, failures


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Every 8th fortune, one JSON line each (as tests/library/test_text_dropins.py)."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "fortunes.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in fortunes()[::8]))
    return str(root)


def run_trainer(np_, out, script, args, without=None):
    """``script`` on ``np_`` processes under torchrun through tests/support/run_port.py (float64;
    each training forward's sequences and the final model kept), or run_without.py."""
    out.mkdir()
    done = [out / f"done-{r}" for r in range(np_)]
    runner = ["tests/support/run_port.py"] if without is None else ["tests/support/run_without.py", without]
    cmd = [*runner, str(out), str(script), *args, "--output-dir", str(out / "trainer")]
    proc = torchrun(np_, cmd, timeout=400, done=done)
    assert_ok(proc)
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    sizes = [json.loads((out / f"sizes-{r}.json").read_text()) for r in range(np_)]
    return proc, torch.load(out / "model.pt", weights_only=True), sizes


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_the_plain_trainer_twin_trains_under_torchrun(tmp_path, corpus):
    """The 'before' of the port is a working Trainer script: its DistributedSampler's even parts."""
    twin = tmp_path / "plain_hf_trainer_text.py"
    twin.write_text(plain_twin(example_source(EXAMPLE)))
    args = ["--cpu", "--max-steps", "4", "--batch-size", "4", "--data-dir", corpus, "--max-seq-len", "48"]
    proc, model, sizes = run_trainer(2, tmp_path / "out", twin, [*args, "--vocab-size", "512"])
    assert sizes == [[4] * 4] * 2
    assert proc.stdout.count("test set: perplexity") == 1
    assert "bno-hvd" not in proc.stderr
    assert all(torch.isfinite(t).all() for t in model.values())


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_the_trainer_port_splits_each_global_batch_by_tokens(tmp_path, corpus):
    """Under ``equal`` the four processes get equal shares of each global batch's tokens, not of its
    sequences: their predictions differ by one longest sequence (48) at most, as whole sequences go
    to a process, while their numbers of sequences differ (short ones to some, long ones to others)."""
    args = ["--cpu", "--strategy", "equal", "--max-steps", str(STEPS), "--seed", "5", "--batch-size", "4"]
    args += ["--max-seq-len", "48", "--vocab-size", "512", "--data-dir", corpus]
    _, _, sizes = run_trainer(4, tmp_path / "out", EXAMPLE, args)
    tokens = [json.loads((tmp_path / "out" / f"tokens-{r}.json").read_text()) for r in range(4)]
    per_update = list(zip(*sizes))
    assert len(per_update) == STEPS and all(sum(s) == GLOBAL for s in per_update)
    assert sum(len(set(s)) > 1 for s in per_update) == STEPS, per_update  # never 4 sequences each
    spreads = [max(t) - min(t) for t in zip(*tokens)]
    assert max(spreads) <= 48, list(zip(per_update, zip(*tokens)))


LLAMA = '''def build_model(vocab_size, max_seq_len):
    """A 2-layer Llama, 64 wide (grouped-query attention, RMSNorm and rotary positions in float32)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_seq_len + 1,
    )
    return LlamaForCausalLM(config)
'''


def example_for(model, folder):
    """The example (GPT-2), or the example with a small Llama in its ``build_model``."""
    if model == "gpt2":
        return EXAMPLE
    source, count = re.subn(
        r"def build_model\(.*?return GPT2LMHeadModel\(config\)\n", LLAMA, example_source(EXAMPLE), flags=re.S
    )
    assert count == 1
    path = folder / "hf_trainer_llama.py"
    path.write_text(source)
    return path


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def one_process(request, tmp_path_factory, corpus):
    """The reference: the example (its GPT-2, or a Llama) in one process on the whole global batch of 16 sequences."""
    folder = tmp_path_factory.mktemp(f"trainer-one-{request.param}")
    args = [*ARGS, "--data-dir", corpus, "--batch-size", str(GLOBAL)]
    script = example_for(request.param, folder)
    return (request.param, script, *run_trainer(1, folder / "one", script, args))


def four(corpus):
    return [*ARGS, "--data-dir", corpus, "--batch-size", str(GLOBAL // 4)]


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_the_trainer_port_on_4_uneven_processes_equals_one_process(tmp_path, corpus, one_process):
    model, script, single_proc, single, single_sizes = one_process
    multi_proc, multi, sizes = run_trainer(4, tmp_path / "four", script, four(corpus))
    per_update = list(zip(*sizes))
    assert len(per_update) == len(single_sizes[0]) == STEPS
    assert all(sum(s) == GLOBAL for s in per_update) and set(single_sizes[0]) == {GLOBAL}
    assert min(min(s) for s in per_update) == 1  # a process at 1 sequence
    assert len(set(per_update)) >= STEPS // 2 - 1, per_update  # a new split every 2 updates
    diff = max_relative_difference(multi, single)
    print(f"hf trainer ({model}): 4 processes vs 1 process: max relative difference {diff:.2e}")
    assert diff <= 1e-10
    assert multi_proc.stdout.count("test set: perplexity") == 1
    losses = logged_losses(multi_proc)
    assert losses == logged_losses(single_proc) and len(losses) == STEPS // 4  # the global batch's mean loss


def logged_losses(proc) -> list[str]:
    return re.findall(r"\{'loss': '([0-9.]+)'", proc.stdout + proc.stderr)


@pytest.mark.mpi
@TORCHRUN_EXIT_HANG
def test_the_trainer_port_is_not_exact_with_transformers_own_token_count(tmp_path, corpus):
    """The test above can fail: with transformers' ``num_items_in_batch`` (for the GPT-2, whose
    ``loss_type`` transformers does not know: every label, one more per sequence than its loss
    predicts) 4 processes drift from one process that counts the same way."""
    args = [*ARGS, "--data-dir", corpus, "--batch-size", str(GLOBAL)]
    _, single, _ = run_trainer(1, tmp_path / "one", EXAMPLE, args, without="trainer-count")
    _, multi, _ = run_trainer(4, tmp_path / "four", EXAMPLE, four(corpus), without="trainer-count")
    diff = max_relative_difference(multi, single)
    print(f"hf trainer without its token count: 4 processes vs 1 process: max relative difference {diff:.2e}")
    assert diff > 1e-4


REFUSALS = "tests/support/mpi_scripts/trainer_refusals.py"


@pytest.mark.mpi
@pytest.mark.parametrize(
    "case,words",
    [
        ("accumulate", "gradient_accumulation_steps=2: BalancedTrainer does not accumulate gradients"),
        ("dropout", "the model has active dropout (config.attention_dropout, 1 in all)"),
        ("no-lengths", "BalancedTrainer needs each training sequence's predictions"),
        ("miscount", "the first 8 sequences: 21 labels to predict, but the lengths say 29"),
        ("fixed-by-cost", "strategy 'fixed:3,1' gives each rank a number of sequences, and cost= splits by work"),
        ("zero", "batch sizes >= 1 (no rank may sit out here), got [4, 0]"),
    ],
)
def test_what_the_trainer_cannot_do_exactly_is_refused_in_one_line(case, words):
    proc = torchrun(2, ["--no-python", "sh", "-c", WRAP, "sh", *python_cmd(REFUSALS, case)], timeout=240)
    text = proc.stdout + proc.stderr
    assert sorted(re.findall(r"process (\d) exit (\d+)", proc.stdout)) == [("0", "2"), ("1", "2")], text[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "bno-hvd: error:" in line]
    assert len(errors) == 1 and words in errors[0], text[-3000:]
    assert "Traceback" not in text and "was not refused" not in text, text[-3000:]
