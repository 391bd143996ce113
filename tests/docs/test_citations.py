"""No docstring or comment cites a section number of the old benchmark log ("BENCHMARKS 14.11",
"BENCHMARKS.md section 9.1"): those numbers went stale at every renumbering, and the log is gone.
The fact goes in the sentence instead; the docs' benchmark page holds today's numbers."""

import os
import re

from support.jobs import ROOT

CITATION = re.compile("BENCHMARKS" + r"(\.md)? (section )?[0-9]+\.[0-9]+")


def test_no_code_cites_a_benchmark_section():
    found = []
    for top in ("bno_hvd", "examples", "benchmarks", "launch", "tests"):
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                path = os.path.join(folder, name)
                if path == __file__:  # its own examples of what a citation looks like
                    continue
                try:
                    lines = open(path, encoding="utf-8").read().splitlines()
                except UnicodeDecodeError:
                    continue
                found += [
                    f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()}"
                    for n, line in enumerate(lines, 1)
                    if CITATION.search(line)
                ]
    assert not found, "\n".join(found)


def test_the_pattern_finds_what_it_must():
    for text in ("see BENCHMARKS 14.11", "BENCHMARKS.md 9.1", "(BENCHMARKS.md section 12.1)"):
        assert CITATION.search(text), text
    assert not CITATION.search("the REAL suite of the benchmarks page")
