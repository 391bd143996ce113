"""``bno-hvd console`` (what ``launch/run`` shows): the filter on real ``horovodrun`` output
(tags gone, rank 0's lines kept, each distinct warning and error once, progress events drawn),
and the command itself on a real job: a tqdm bar on a terminal, the job's exit code kept."""

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest
from support.jobs import ROOT, bno_cmd, mpi_env, python_cmd

from bno_hvd.cli.console import TAG, Console, Line, Untagger
from bno_hvd.training.runlog import PROGRESS_ENV, PROGRESS_EVENT

HOROVODRUN = os.path.join(os.path.dirname(sys.executable), "horovodrun")
TRAIN = "train --dataset synthetic --updates 10 --base-batch-size 8 --rebalance-every 5 --no-eval --latency-interval 1"


def horovodrun_merged(np_, args, env=None, timeout=300):
    """A real job with stdout and stderr in one pipe, as the console reads it."""
    cmd = [HOROVODRUN, "-np", str(np_), "-H", f"localhost:{np_}", "--mpi", *args]
    return subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=mpi_env(env), cwd=ROOT, timeout=timeout
    )


def filtered(raw: str, err_tty=False):
    """``raw`` through Untagger and Console: (stdout text, stderr text)."""
    out, err = io.StringIO(), (TTY() if err_tty else io.StringIO())
    console, untagger = Console(out, err), Untagger()
    for physical in raw.splitlines():
        for line in untagger.feed(physical):
            console.show(line)
    for line in untagger.flush():
        console.show(line)
    console.finish(0)
    return out.getvalue(), err.getvalue()


class TTY(io.StringIO):
    def isatty(self):
        return True


# --- the untagging, on pieces copied from real mpirun output --------------------------------


def test_pieces_of_one_line_are_joined_per_rank_and_stream():
    u = Untagger()
    # rank 2 printed "bno-hvd: warning:", " ", the text and "\n" in separate writes (a real line)
    real = "[1,2]<stderr>:bno-hvd: warning:[1,2]<stderr>: [1,2]<stderr>:the same on every rank[1,2]<stderr>:"
    assert u.feed(real) == [Line(2, "stderr", "bno-hvd: warning: the same on every rank")]
    assert u.feed("[1,0]<stdout>:half[1,1]<stdout>:whole") == [Line(1, "stdout", "whole")]
    assert u.feed("[1,0]<stdout>: and the rest") == [Line(0, "stdout", "half and the rest")]
    assert u.feed("mpirun noticed that process rank 1 exited") == [
        Line(None, "stderr", "mpirun noticed that process rank 1 exited")
    ]
    assert u.feed("[1,3]<stderr>:never ended[1,0]<stdout>:x") == [Line(0, "stdout", "x")]
    assert u.flush() == [Line(3, "stderr", "never ended")]


# --- the filter on real horovodrun output ---------------------------------------------------


@pytest.mark.mpi
def test_every_rank_printing_reaches_the_user_once():
    proc = horovodrun_merged(
        3, python_cmd(os.path.join(ROOT, "tests", "support", "mpi_scripts", "every_rank_prints.py"))
    )
    assert proc.returncode == 0, proc.stdout
    assert "[1,1]<stderr>:" in proc.stdout  # real tagged output from every rank
    out, err = filtered(proc.stdout)
    assert out == "line from rank 0\n"
    assert err.count("bno-hvd: warning: the same on every rank") == 1
    assert err.count("UserWarning: every rank warns") == 1
    assert err.count("bno-hvd: error: the same on every rank") == 1
    for rank in range(3):  # distinct errors: each shown once
        assert err.count(f"bno-hvd: error: rank {rank}: only mine") == 1
    assert not TAG.search(out + err)


@pytest.fixture(scope="module")
def training_output():
    proc = horovodrun_merged(2, bno_cmd(*TRAIN.split(), "--emulate-speed", "1,0.5"), env={PROGRESS_ENV: "events"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout


@pytest.mark.mpi
def test_training_output_without_a_terminal(training_output):
    assert PROGRESS_EVENT in training_output and "[1,0]<stderr>:" in training_output
    out, err = filtered(training_output)
    # --no-eval: rank 0's one result line is the run's compute balance and share outside compute
    assert re.fullmatch(
        r"compute balance [0-9.]+ per update, [0-9.]+ of the ranks' means; \d+% of the update "
        r"outside compute; [0-9.]+ samples/s\n",
        out,
    ), out
    assert not TAG.search(out + err) and PROGRESS_EVENT not in err
    lines = err.splitlines()
    progress = [line for line in lines if line.startswith("train:")]
    assert 2 <= len(progress) <= 11 and "10/10" in progress[-1]  # a line every ~10% and the last


@pytest.mark.mpi
def test_training_progress_on_a_terminal_is_a_bar(training_output):
    _, err = filtered(training_output, err_tty=True)
    assert "\r" in err and "10/10" in err and "100%|" in err  # tqdm redraws one line
    assert PROGRESS_EVENT not in err and not TAG.search(err)


# --- the command on real jobs -----------------------------------------------------------------


def run_under_terminal(args, timeout=300):
    """``args`` with stdout and stderr on a pseudo-terminal: (exit code, what the terminal showed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 40 rows, 120 columns
    proc = subprocess.Popen(args, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, env=mpi_env(), cwd=ROOT)
    os.close(slave)
    shown = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(master)
    return proc.wait(timeout=timeout), shown.decode(errors="replace")


@pytest.mark.mpi
def test_console_draws_a_bar_on_a_terminal_and_keeps_exit_code_0():
    code, shown = run_under_terminal(
        bno_cmd("console", "--", HOROVODRUN, "-np", "2", "-H", "localhost:2", "--mpi", *bno_cmd(*TRAIN.split()))
    )
    assert code == 0, shown
    assert "\r" in shown and "10/10" in shown and "100%|" in shown
    assert not TAG.search(shown) and PROGRESS_EVENT not in shown


# rank 1 SIGKILLs itself while rank 0 still runs: what the console does with a failed job does not
# depend on what the job ran, so the job is a plain Python process per rank (no torch to load)
KILL_RANK_1 = (
    "import os, signal, time; rank = os.environ['OMPI_COMM_WORLD_RANK']; print('rank', rank, 'started', flush=True); "
    "rank == '1' and os.kill(os.getpid(), signal.SIGKILL); time.sleep(120)"
)


@pytest.mark.mpi
def test_console_keeps_a_failed_jobs_exit_code_and_says_why(tmp_path):
    proc = subprocess.run(
        bno_cmd("console", HOROVODRUN, "-np", "2", "-H", "localhost:2", "--mpi", *python_cmd("-c", KILL_RANK_1)),
        capture_output=True,
        text=True,
        env=mpi_env(),
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 137, proc.stderr  # mpirun's code for a rank killed by signal 9
    assert "exited on signal 9" in proc.stderr  # the launcher's explanation is shown
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("bno-hvd: the job exited with code 137; every rank's whole output: ")
    raw = last.rsplit(" ", 1)[1]
    assert "exited on signal 9" in open(raw).read()
    os.remove(raw)
    assert not TAG.search(proc.stdout + proc.stderr.replace(raw, ""))


@pytest.mark.slow
def test_console_without_a_command_is_one_line():
    proc = subprocess.run(bno_cmd("console"), capture_output=True, text=True, env=mpi_env(), cwd=ROOT)
    assert proc.returncode == 2 and proc.stderr.startswith("bno-hvd: error:") and "Traceback" not in proc.stderr
    proc = subprocess.run(
        bno_cmd("console", "--", "no-such-launcher-xyz"), capture_output=True, text=True, env=mpi_env(), cwd=ROOT
    )
    assert proc.returncode == 2 and "no-such-launcher-xyz" in proc.stderr and "Traceback" not in proc.stderr
