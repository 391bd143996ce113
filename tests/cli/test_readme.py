"""README stays true: its CLI reference lists every command and flag that exists, its API
example is the file the suite runs, and CI calls README's test command."""

import os
import re
import subprocess

from support.jobs import ROOT, mpi_env

README = open(os.path.join(ROOT, "README.md")).read()


def test_cli_reference_is_complete_and_current():
    ref = subprocess.run(["bno-hvd", "cli-reference"], capture_output=True, text=True, env=mpi_env(), cwd=ROOT)
    assert ref.returncode == 0, ref.stderr
    assert ref.stdout.strip() in README, "README's CLI reference is stale: run launch/update-readme"
    flags = set(re.findall(r"`(--[a-z0-9-]+)`", ref.stdout))
    assert {"--strategy", "--rebalance-every", "--emulate-speed", "--metrics", "--resume"} <= flags


def test_api_example_is_the_tested_file():
    example = open(os.path.join(ROOT, "examples", "custom_loop.py")).read()
    assert example in README
    assert len(example.strip().splitlines()) <= 40  # setup, a DataLoader and the loop


def test_ci_calls_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "launch/test" in ci and "launch/test" in README and "launch/run" in README


def test_readme_shows_the_whole_horovod_port_as_a_diff():
    """README's diff of the port: its added lines are exactly the file's marked lines, in order
    (7 '# bno-hvd' lines of port, at most 8; '# offline' lines for the local data), and its
    context lines are the file's; launch/update-readme refreshes the added lines."""
    port = open(os.path.join(ROOT, "examples", "horovod_mnist.py")).read().splitlines()
    marked = [line.strip() for line in port if "# bno-hvd" in line or "# offline" in line]
    assert 1 <= sum("# bno-hvd" in line for line in marked) <= 8
    assert sum("# offline" in line for line in marked) <= 6
    section = README.split("<!-- horovod-port:start -->")[1].split("<!-- horovod-port:end -->")[0]
    diff = [line for line in section.splitlines() if line and not line.startswith(("```", "@@"))]
    added = [line[1:].strip() for line in diff if line.startswith("+") and line[1:].strip()]
    assert added == marked, "README's diff of the port is stale: run launch/update-readme"
    context = [line[1:] for line in diff if line.startswith(" ")]
    at = 0
    for line in context:  # in the file's order
        assert line in port[at:], f"README's diff shows a context line the port does not have: {line!r}"
        at = port.index(line, at) + 1
    assert all(line.startswith(("+", "-", " ")) for line in diff)


def test_every_file_the_documents_name_exists():
    """A path in README or the result documents that no longer exists (a module moved) is stale."""
    named = set()
    for doc in ("README.md", "BENCHMARKS.md", "EXPERIMENTS.md", "FUZZING.md"):
        text = open(os.path.join(ROOT, doc)).read()
        named |= set(re.findall(r"\b((?:bno_hvd|tests|benchmarks|examples|launch)/[\w/.-]+\.(?:py|json|sbatch))", text))
    missing = sorted(p for p in named if not os.path.exists(os.path.join(ROOT, p)))
    assert missing == ["examples/pytorch/pytorch_mnist.py"], missing  # (Horovod's own example)
