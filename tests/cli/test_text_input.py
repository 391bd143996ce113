"""Bad text under real mpirun with 2 ranks: a file that is not UTF-8 ends every rank with one
``bno-hvd: error:`` line naming the file (exit 2, no traceback, no hang); a line longer than
--max-seq-len is cut into pieces, said once in a note, and trains. The other bad inputs (an empty
directory, an empty line, a JSON line without text) raise in the same call on every rank
(``read_documents``); their messages are ``tests/data/test_text.py``'s, and a line of spaces is
an empty line here."""

import json

import pytest
from support.jobs import bno_cmd, mpirun

from bno_hvd.common.errors import UsageError
from bno_hvd.data.corpus import read_documents

RUN = ["train", "--dataset", "text", "--model", "gpt-mini", "--max-seq-len", "16", "--vocab-size", "300"]
RUN += ["--updates", "3", "--base-batch-size", "2", "--no-progress", "--latency-interval", "0"]
LINES = [f"document number {i} says {'hello ' * (i % 5)}" for i in range(40)]


def lines_with(proc, marker):
    return [line for line in (proc.stdout + proc.stderr).splitlines() if marker in line]


def test_a_line_of_spaces_is_an_empty_line(tmp_path):
    (tmp_path / "docs.txt").write_text("\n".join(LINES[:5] + ["   "] + LINES[5:]) + "\n")
    with pytest.raises(UsageError, match="docs.txt line 6 is empty"):
        read_documents(str(tmp_path))


@pytest.mark.mpi
def test_bad_text_ends_every_rank_with_one_line(tmp_path):
    (tmp_path / "docs.txt").write_bytes("\n".join(LINES).encode() + b"\nna\xefve\n")
    words = ["docs.txt is not UTF-8", "line 41", "iconv"]
    proc = mpirun(2, bno_cmd(*RUN, "--data-dir", str(tmp_path)), timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = lines_with(proc, "bno-hvd: error:")
    assert len(errors) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert all(word in errors[0] for word in words), errors[0]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.mpi
def test_a_line_longer_than_max_seq_len_is_cut_into_pieces(tmp_path):
    long_line = " ".join(f"w{i}" for i in range(300))  # hundreds of tokens at --max-seq-len 16
    (tmp_path / "docs.txt").write_text("\n".join(LINES + [long_line]) + "\n")
    tb, log = tmp_path / "tb", tmp_path / "log"
    proc = mpirun(2, bno_cmd(*RUN, "--data-dir", str(tmp_path), "--tensorboard", str(tb), "--log-dir", str(log)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = lines_with(proc, "bno-hvd: note:")
    cut = [n for n in notes if "longer than --max-seq-len 16 tokens and were cut into pieces" in n]
    assert len(cut) == 1, notes
    assert len(lines_with(proc, "test perplexity:")) == 1
    assert len(lines_with(proc, "tokens/s")) == 1  # the last line: tokens/s beside samples/s
    # tokens/s per update in updates.jsonl and TensorBoard (read back with TensorBoard's own reader)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    records = [json.loads(line) for line in (log / "updates.jsonl").read_text().splitlines()]
    assert all(r["tokens_per_s"] == r["global_tokens"] / r["weight_update_time"] for r in records)
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    logged = {e.step: e.value for e in acc.Scalars("update/tokens_per_s")}
    assert logged == pytest.approx({r["update"]: r["tokens_per_s"] for r in records}, rel=1e-6)
