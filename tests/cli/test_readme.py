"""README stays true: its CLI reference lists every command and flag that exists, its API
example is the file the suite runs, and CI calls README's test command."""

import os
import re
import subprocess

from support.jobs import ROOT, mpi_env
from support.port_twin import example_source, port_diff, port_markers

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


def test_text_example_is_the_tested_file():
    example = open(os.path.join(ROOT, "examples", "text_loop.py")).read()
    assert example in README.split("<!-- text-example:start -->")[1].split("<!-- text-example:end -->")[0]


def test_ci_calls_readme_test_command():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert "launch/test" in ci and "launch/test" in README and "launch/run" in README


def test_readme_shows_the_whole_horovod_port_as_a_diff():
    """README's diff of the port is the diff from the plain Horovod twin (rebuilt from the
    example's markers, tests/support/port_twin.py) to the example, as launch/update-readme writes it."""
    section = README.split("<!-- horovod-port:start -->\n")[1].split("<!-- horovod-port:end -->")[0]
    assert section == "```diff\n" + port_diff(example_source()) + "```\n", "stale: run launch/update-readme"
    marks = port_markers(example_source())
    added = sum(was is None for was in marks.values())
    assert f"({len(marks)} lines: {added} added, {len(marks) - added} replaced)" in README
    assert f"the {example_source().count('  # offline')} `# offline` lines" in README


def test_every_file_the_documents_name_exists():
    """A path in README or the result documents that no longer exists (a module moved) is stale."""
    named = set()
    for doc in ("README.md", "BENCHMARKS.md", "EXPERIMENTS.md", "FUZZING.md"):
        text = open(os.path.join(ROOT, doc)).read()
        named |= set(re.findall(r"\b((?:bno_hvd|tests|benchmarks|examples|launch)/[\w/.-]+\.(?:py|json|sbatch))", text))
    missing = sorted(p for p in named if not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, missing
