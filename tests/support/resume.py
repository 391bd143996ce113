"""The kill-and-resume scenario, written once: the same 4-rank job run straight through, and run
again killed for real (rank 0 sends itself SIGKILL at ``--inject-fault kill:0:U``, after a
checkpoint) and resumed with ``--resume``. The tests compare the two ends. A test whose module
already ran the uninterrupted job (for another comparison) passes it as ``reference`` instead of
running it again: each 4-rank job costs seconds of start-up alone.

Usage::

    r = kill_and_resume(tmp_path, run_flags, after_kill=lambda r: ...)   # checks between the kill and the resume
    torch.load(r.model), torch.load(r.ref_model), read_updates(str(r.log_dir)), ...
"""

from dataclasses import dataclass
from pathlib import Path

from support.jobs import assert_ok, bno_cmd, mpirun


@dataclass
class Resumed:
    ref_model: Path  # the uninterrupted run's model, and its log directory
    ref_log: Path
    model: Path  # the killed-and-resumed run's model, log directory and checkpoints
    log_dir: Path
    ckpt: Path
    killed: object  # the CompletedProcess of the killed job


def kill_and_resume(
    tmp_path: Path, run: list[str], *, kill_at=13, every=5, keep=2, timeout=240, after_kill=None, reference=None
):
    """Run ``run`` (train flags) on 4 ranks twice - through, and killed at ``kill_at`` then resumed.

    ``reference``: (model, log directory) of the same run already made straight through on 4 ranks;
    then only the killed and the resumed jobs run."""
    ref_model, ref_log = reference or (tmp_path / "ref.pt", tmp_path / "ref-log")
    r = Resumed(Path(ref_model), Path(ref_log), tmp_path / "resumed.pt", tmp_path / "log", tmp_path / "ck", None)
    if reference is None:
        ref_flags = ["--save-model", str(r.ref_model), "--log-dir", str(r.ref_log)]
        assert_ok(mpirun(4, bno_cmd(*run, *ref_flags), timeout=timeout))
    flags = ["--save-model", str(r.model), "--log-dir", str(r.log_dir), "--checkpoint-dir", str(r.ckpt)]
    flags += ["--checkpoint-every", str(every), "--keep-checkpoints", str(keep)]
    r.killed = mpirun(4, bno_cmd(*run, *flags, "--inject-fault", f"kill:0:{kill_at}"), timeout=timeout)
    out = r.killed.stdout + r.killed.stderr
    assert r.killed.returncode != 0 and "signal 9" in out, r.killed.stderr[-2000:]
    if after_kill is not None:
        after_kill(r)
    assert_ok(mpirun(4, bno_cmd(*run, *flags, "--resume"), timeout=timeout))
    return r
