"""The generated parts of the docs stay true (``launch/update-docs`` writes them): the CLI
reference lists every command and flag that exists, the example loops are the files the suite
runs, the port's diff is the one from the plain Horovod twin to the example, and every path the
documents name exists. Pure: no subprocess."""

import glob
import os
import re

from support.jobs import ROOT
from support.port_twin import example_source, port_diff, port_markers

from bno_hvd.cli.docs import command_reference
from bno_hvd.cli.main import main

STALE = "stale: run launch/update-docs"
WINGS = "|".join(d for d in os.listdir(os.path.join(ROOT, "bno_hvd")) if not d.startswith(("_", ".")))


def read(page):
    return open(os.path.join(ROOT, page)).read()


def section(page, marker):
    """What ``<!-- marker:start -->`` ... ``<!-- marker:end -->`` of ``page`` holds."""
    text = read(page)
    assert f"<!-- {marker}:start -->\n" in text, f"{page} has no {marker} section"
    return text.split(f"<!-- {marker}:start -->\n")[1].split(f"<!-- {marker}:end -->")[0]


def test_cli_reference_is_complete_and_current():
    ref = command_reference(main)
    assert section("docs/cli.md", "cli-reference") == ref + "\n", STALE  # click.echo's newline
    flags = set(re.findall(r"`(--[a-z0-9-]+)`", ref))
    assert {"--strategy", "--rebalance-every", "--emulate-speed", "--metrics", "--resume"} <= flags
    commands = set(re.findall(r"^## `bno-hvd ([a-z-]+)`$", ref, re.M))
    assert {"train", "bench", "experiment", "allocate", "report"} <= commands


def test_api_example_is_the_tested_file():
    example = read("examples/custom_loop.py")
    assert section("docs/porting.md", "example") == "```python\n" + example + "```\n", STALE
    assert len(example.strip().splitlines()) <= 40  # setup, a DataLoader and the loop


def test_text_example_is_the_tested_file():
    example = read("examples/text_loop.py")
    assert section("docs/text.md", "text-example") == "```python\n" + example + "```\n", STALE


def test_ci_calls_readme_test_command():
    ci = read(".ci/run")
    readme = read("README.md")
    assert "launch/test" in ci and "launch/test" in readme and "launch/run" in readme


def test_readme_and_docs_show_the_whole_horovod_port_as_a_diff():
    """The diff of the port is the diff from the plain Horovod twin (rebuilt from the example's
    markers, tests/support/port_twin.py) to the example, as launch/update-docs writes it."""
    diff = "```diff\n" + port_diff(example_source()) + "```\n"
    for page in ("README.md", "docs/porting.md"):
        assert section(page, "horovod-port") == diff, f"{page}: {STALE}"
    marks = port_markers(example_source())
    added = sum(was is None for was in marks.values())
    counts = f"({len(marks)} lines: {added} added, {len(marks) - added} replaced)"
    assert counts in read("docs/porting.md") and counts in read("README.md")
    assert f"the {example_source().count('  # offline')} `# offline` lines" in read("docs/porting.md")


def test_every_file_the_documents_name_exists():
    """A path in README or a docs page that no longer exists (a module moved) is stale."""
    named = set()
    for doc in ["README.md"] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))):
        text = read(doc)
        named |= set(re.findall(r"\b((?:bno_hvd|tests|benchmarks|examples|launch)/[\w/.-]+\.(?:py|json|sbatch))", text))
        # the architecture names modules by wing: `library/loader.py` is bno_hvd/library/loader.py
        named |= {"bno_hvd/" + p for p in re.findall(rf"(?<![\w/.-])((?:{WINGS})/[\w/]+\.py)", text)}
    missing = sorted(p for p in named if not os.path.exists(os.path.join(ROOT, p)))
    assert not missing, missing
