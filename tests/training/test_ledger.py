"""The sample ledger: every update's stream ranges, on disk with the run's outputs and in its
checkpoints; ``bno-hvd ledger check DIR`` passes a run (straight, resumed after a real SIGKILL, on
either engine) and names the sample a doctored ledger lost or repeated."""

import json

import pytest
from support.jobs import assert_ok, run_cli
from support.train_runs import train_args

from bno_hvd.allocation.sampler import Position, epoch_permutation
from bno_hvd.training.ledger import LedgerError, check_entries, stream_ranges

HEADER = {"ledger": 1, "dataset_len": 10, "seed": 3}


def entries_of(*spans):
    return [{"update": u, "ranges": [list(r) for r in rs], "sizes": [1]} for u, rs in enumerate(spans)]


def test_stream_ranges_cross_an_epoch_end():
    assert stream_ranges(Position(0, 6), 4, 10) == [[0, 6, 10]]
    assert stream_ranges(Position(0, 8), 5, 10) == [[0, 8, 10], [1, 0, 3]]
    assert stream_ranges(Position(2, 0), 25, 10) == [[2, 0, 10], [3, 0, 10], [4, 0, 5]]


def test_a_whole_epoch_and_a_prefix_pass():
    line = check_entries(HEADER, entries_of([(0, 0, 6)], [(0, 6, 10), (1, 0, 2)], [(1, 2, 5)]))
    assert line.startswith("ledger ok: 3 updates used 15 samples, each exactly once: 1 whole epoch(s) and 5 of 10")


def test_a_repeated_range_names_its_sample():
    doctored = entries_of([(0, 0, 6)], [(0, 4, 10)])
    with pytest.raises(LedgerError) as err:
        check_entries(HEADER, doctored)
    sample = int(epoch_permutation(10, 3, 0)[4])
    assert str(err.value) == (
        f"ledger: sample {sample} repeated: update 1 used stream position 4 of epoch 0, already used by update 0"
    )


def test_a_missing_range_names_its_sample():
    with pytest.raises(LedgerError, match=rf"sample {int(epoch_permutation(10, 3, 0)[6])} lost: .* position 6 of"):
        check_entries(HEADER, entries_of([(0, 0, 6)], [(0, 7, 10), (1, 0, 4)]))
    with pytest.raises(LedgerError, match="lost: no update used stream position 0 of epoch 1"):
        check_entries(HEADER, entries_of([(0, 0, 10)], [(2, 0, 4)]))


def train_ledger(tmp_path, name, *flags, updates=9, timeout=180):
    log = tmp_path / name
    data = ["--dataset", "synthetic", "--strategy", "fixed", "--batch-sizes", "500"]  # 4096 samples an epoch
    proc = run_cli(*train_args(tmp_path / f"{name}.pt", log, *data, *flags, updates=updates), timeout=timeout)
    return proc, log


def ledger_lines(log):
    return [json.loads(line) for line in (log / "ledger.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["horovod", "torch"])
def test_a_run_passes_and_a_doctored_ledger_fails(engine, tmp_path):
    proc, log = train_ledger(tmp_path, engine, "--engine", engine)
    assert_ok(proc)
    check = run_cli("ledger", "check", str(log))
    assert_ok(check)
    # 9 updates of 500 from a stream of 4096: one whole epoch and 404 samples of the next
    assert check.stdout.startswith(
        "ledger ok: 9 updates used 4500 samples, each exactly once: 1 whole epoch(s) and 404"
    )
    lines = ledger_lines(log)
    assert [e["update"] for e in lines[1:]] == list(range(9)) and lines[4]["ranges"] == [[0, 1500, 2000]]
    assert lines[9]["ranges"] == [[0, 4000, 4096], [1, 0, 404]]
    repeated = [*lines[:5], {**lines[5], "ranges": [[0, 1999, 2500]]}, *lines[6:]]
    (log / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in repeated))
    bad = run_cli("ledger", "check", str(log))
    sample = int(epoch_permutation(4096, 7, 0)[1999])
    assert bad.returncode == 1 and bad.stderr.strip() == (
        f"bno-hvd: error: ledger: sample {sample} repeated: update 4 used stream position 1999 of epoch 0, "
        "already used by update 3"
    ), bad.stderr
    (log / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines[:3] + lines[4:]))
    bad = run_cli("ledger", "check", str(log))
    assert bad.returncode == 1 and "lost: no update used stream position 1000 of epoch 0" in bad.stderr, bad.stderr


@pytest.mark.slow
def test_a_run_resumed_after_a_kill_passes(tmp_path):
    """Killed (SIGKILL) at update 7 after a checkpoint at 5: the file then holds updates 0..6; the
    resumed run goes back to the checkpoint's entries, redoes 5 and 6, and the check passes."""
    ckpt = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-every", "5"]
    killed, log = train_ledger(tmp_path, "run", *ckpt, "--inject-fault", "kill:0:7")
    assert killed.returncode == -9, killed.stderr
    assert [e["update"] for e in ledger_lines(log)[1:]] == list(range(7))
    resumed, _ = train_ledger(tmp_path, "run", *ckpt, "--resume")
    assert_ok(resumed)
    assert [e["update"] for e in ledger_lines(log)[1:]] == list(range(9))
    check = run_cli("ledger", "check", str(log))
    assert_ok(check)
    assert check.stdout.startswith("ledger ok: 9 updates used 4500 samples")


def test_ledger_check_of_a_directory_without_one_is_one_line(tmp_path):
    from click.testing import CliRunner

    from bno_hvd.cli.ledgercheck import check

    result = CliRunner().invoke(check, [str(tmp_path)])
    assert result.exit_code != 0 and "no ledger.jsonl in" in str(result.exception)
