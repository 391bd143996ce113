"""An error out of Horovod's own code (a collective that cannot complete because another rank
ended) is one line on stderr, not a traceback (bno_hvd/cli/main.py)."""

import os

import pytest

from bno_hvd.cli.main import raised_in_horovod


def raise_from(filename: str):
    code = compile(
        "def collective():\n    raise RuntimeError('Horovod has been shut down.\\nmore')\n", filename, "exec"
    )
    space = {}
    exec(code, space)
    try:
        space["collective"]()
    except RuntimeError as err:
        return err
    pytest.fail("nothing raised")


def test_errors_from_horovods_code_are_told_apart():
    inside = os.path.join(os.sep, "venv", "site-packages", "horovod", "torch", "mpi_ops.py")
    assert raised_in_horovod(raise_from(inside))
    assert not raised_in_horovod(raise_from(os.path.join(os.sep, "work", "bno_hvd", "training", "loop.py")))


def test_a_failed_collective_is_one_line(monkeypatch, capsys):
    from bno_hvd.cli import main as cli_main

    def broken(*args, **kwargs):
        raise raise_from(os.path.join(os.sep, "x", "horovod", "torch", "mpi_ops.py"))

    monkeypatch.setattr(cli_main.click.Group, "main", broken)
    with pytest.raises(SystemExit) as exit_info:
        cli_main.main.main(["train"])
    assert exit_info.value.code == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("bno-hvd: error: rank 0: Horovod's collectives failed")
    assert "Horovod has been shut down." in lines[0] and "another rank probably ended" in lines[0]
