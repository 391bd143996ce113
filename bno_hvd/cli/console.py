"""What the user sees of a job: rank 0's output without mpirun's tags, and a live progress bar.

``bno-hvd console -- horovodrun -np 4 ... bno-hvd train ...`` (what ``launch/run`` does) runs the
job with ``BNO_HVD_PROGRESS=events``: under mpirun no rank has a terminal, so rank 0 writes its
progress as event lines (:class:`bno_hvd.training.runlog.Progress`) and the console draws the bar on its
own terminal. ``horovodrun --mpi`` runs ``mpirun --tag-output``: every line a rank writes arrives
as ``[job,rank]<stdout>:text`` (a ``print`` of several pieces may even arrive in several tagged
pieces). The console reassembles the lines (:class:`Untagger`) and shows (:class:`Console`):

- rank 0's stdout lines on stdout and its stderr lines on stderr, without tags;
- rank 0's progress as a tqdm bar when stderr is a terminal, else a line every ~10% of the run;
- ``bno-hvd: error:`` and ``bno-hvd: warning:`` lines and Python ``...Warning:`` lines of any
  rank, each distinct text once (the other ranks' bno-hvd warnings already reach the user through
  rank 0, which prints what they report at each rebalance);
- nothing else of the other ranks while the job runs;
- the launcher's own lines (mpirun, horovodrun) as they come, except after a ``bno-hvd: error:``
  line, when they only say that the job was aborted;
- when the job fails without a ``bno-hvd: error:`` line (a rank killed, a crash), the last
  stderr lines of every other rank, which would otherwise be hidden.

Every byte of the job's output goes to a temporary file, removed after a successful job and named
after a failed one. The console's exit code is the job's (128 + N for a job killed by signal N).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass

import click

from bno_hvd.common.errors import UsageError
from bno_hvd.training.runlog import PROGRESS_ENV, PROGRESS_EVENT, ProgressDisplay

TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr|stddiag)>:")
PYTHON_WARNING = re.compile(r"\b[A-Z]\w*Warning: ")
TAIL = 12  # stderr lines kept per other rank, shown when the job fails without an error line


@dataclass(frozen=True)
class Line:
    """One whole line of the job: ``rank`` None is the launcher itself (mpirun, horovodrun)."""

    rank: int | None
    stream: str  # "stdout" or "stderr"
    text: str


class Untagger:
    """Turns the physical lines of ``mpirun --tag-output`` into whole :class:`Line` objects.

    mpirun tags every piece a rank writes; a piece without a newline is followed, on the same
    physical line, by the tag of the next piece (``[1,0]<stderr>:text[1,0]<stderr>:`` for a
    ``print`` that wrote its text and its newline separately). Pieces are kept per rank and
    stream until their line ends."""

    def __init__(self):
        self._pending: dict[tuple[int, str], str] = {}

    def feed(self, physical: str) -> list[Line]:
        """One physical line of the job's output (without its newline)."""
        tags = list(TAG.finditer(physical))
        if not tags:
            return [Line(None, "stderr", physical)]
        out = []
        if tags[0].start() > 0:
            out.append(Line(None, "stderr", physical[: tags[0].start()]))
        for i, tag in enumerate(tags):
            key = (int(tag.group(1)), "stdout" if tag.group(2) == "stdout" else "stderr")
            end = tags[i + 1].start() if i + 1 < len(tags) else len(physical)
            piece = self._pending.pop(key, "") + physical[tag.end() : end]
            if i + 1 < len(tags):  # no newline after this piece: its line goes on later
                self._pending[key] = piece
            else:
                out.append(Line(key[0], key[1], piece))
        return out

    def flush(self) -> list[Line]:
        """At the end of the output: the pieces whose newline never came."""
        out = [Line(rank, stream, text) for (rank, stream), text in self._pending.items() if text]
        self._pending.clear()
        return out


def notice_kind(text: str) -> str | None:
    """'error' or 'warning' for the lines every rank may print (shown once), else None."""
    if text.startswith("bno-hvd: error:"):
        return "error"
    if text.startswith("bno-hvd: warning:") or PYTHON_WARNING.search(text):
        return "warning"
    return None


class Console:
    """Decides what of the job reaches ``out`` / ``err`` (see the module doc)."""

    def __init__(self, out, err):
        self.out, self.err = out, err
        self.error_shown = False
        self._seen: set[str] = set()
        self._display: ProgressDisplay | None = None
        self._tails: dict[int, deque] = {}

    def show(self, line: Line) -> None:
        text = line.text
        if line.rank is None:
            if not self.error_shown:
                self._write(self.err, text)
            return
        if line.rank == 0 and line.stream == "stderr" and text.startswith(PROGRESS_EVENT):
            if self._progress(text[len(PROGRESS_EVENT) :]):
                return
        kind = notice_kind(text)
        if kind is not None:
            if text not in self._seen:
                self._seen.add(text)
                self._write(self.err, text)
                self.error_shown = self.error_shown or kind == "error"
            return
        if line.rank == 0:
            self._write(self.out if line.stream == "stdout" else self.err, text)
        elif line.stream == "stderr":
            self._tails.setdefault(line.rank, deque(maxlen=TAIL)).append(text)

    def finish(self, code: int, raw_path: str | None = None) -> None:
        """After the job: close the bar; after a failure, what else the user needs to know."""
        self._close_display()
        if code == 0:
            return
        if not self.error_shown:
            for rank, tail in sorted(self._tails.items()):
                self._write(self.err, f"bno-hvd: rank {rank}'s last lines on stderr:")
                for text in tail:
                    self._write(self.err, f"  {text}")
        where = f"; every rank's whole output: {raw_path}" if raw_path else ""
        self._write(self.err, f"bno-hvd: the job exited with code {code}{where}")

    def _progress(self, payload: str) -> bool:
        try:
            event = json.loads(payload)
            kind = event["event"]
            if kind == "start":
                self._close_display()
                self._display = ProgressDisplay(
                    int(event["total"]), str(event["label"]), self.err, int(event["initial"])
                )
            elif kind == "update" and self._display is not None:
                self._display.show(int(event["n"]), str(event["info"]))
            elif kind == "close":
                self._close_display()
        except (ValueError, KeyError, TypeError):
            return False  # not an event after all: shown as text
        return True

    def _close_display(self) -> None:
        if self._display is not None:
            self._display.close()
            self._display = None

    def _write(self, stream, text: str) -> None:
        if self._display is not None and self._display.bar is not None:
            from tqdm import tqdm

            tqdm.write(text, file=stream)  # above the bar, which is drawn again below
        else:
            stream.write(text + "\n")
        stream.flush()


def run_job(command: list[str], out=None, err=None) -> int:
    """Run ``command`` (an mpirun/horovodrun job), show its output through a :class:`Console`,
    return its exit code (128 + N when a signal N ended it)."""
    out, err = out or sys.stdout, err or sys.stderr
    env = dict(os.environ, **{PROGRESS_ENV: "events"})
    raw = tempfile.NamedTemporaryFile("w", prefix="bno-hvd-job.", suffix=".log", delete=False, errors="replace")
    try:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, errors="replace"
        )
    except OSError as error:
        raw.close()
        os.remove(raw.name)
        raise UsageError(f"cannot run {command[0]}: {error.strerror}") from None
    console, untagger = Console(out, err), Untagger()
    interrupts = []

    def on_interrupt(signum, frame):
        # Ctrl-C reached the job too (one process group): it stops itself and says so; a second one kills it
        interrupts.append(signum)
        if len(interrupts) > 1:
            proc.kill()

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        with raw:
            for physical in proc.stdout:
                raw.write(physical)
                for line in untagger.feed(physical.rstrip("\n")):
                    console.show(line)
            for line in untagger.flush():
                console.show(line)
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    code = code if code >= 0 else 128 - code
    console.finish(code, raw.name if code else None)
    if code == 0:
        os.remove(raw.name)
    return code


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def console(command):
    """Run COMMAND (a horovodrun/mpirun job) and show rank 0's output without mpirun's
    `[1,0]<stdout>:` tags: a progress bar on a terminal (a line every 10% otherwise), errors and
    warnings of any rank once; exits with the job's exit code. launch/run uses it."""
    sys.exit(run_job(list(command)))


COMMANDS = [console]
