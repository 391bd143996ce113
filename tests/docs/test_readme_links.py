"""README.md is the short front door: at most 300 lines, its first screen says what the project is,
gives a number and how to start, and every relative link in it leads to a file (and heading) that
exists. Pure: reads files only."""

import os
import re
import unicodedata

from support.jobs import ROOT

README = open(os.path.join(ROOT, "README.md")).read()
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub and MyST (``myst_heading_anchors``) make
    them: lower case, punctuation but ``-`` and ``_`` removed, spaces as ``-``."""
    anchors, fence = set(), False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        match = None if fence else re.match(r"^#{1,6}\s+(.*?)\s*#*$", line)
        if match:
            text = unicodedata.normalize("NFKC", match.group(1)).lower()
            text = re.sub(r"[^\w\- ]", "", text)
            anchors.add(text.replace(" ", "-"))
    return anchors


def test_readme_is_short():
    assert len(README.splitlines()) <= 300


def test_readme_first_screen_says_what_how_much_and_how_to_start():
    first = "\n".join(README.splitlines()[:60])
    assert "Horovod" in first and "heterogeneous" in first
    assert re.search(r"\d\.\d+×", first), "a headline number"
    assert "bno-hvd bench" in first, "the headline's command"
    assert "<!-- horovod-port:start -->" in first, "the port diff"
    for start in ("launch/run", "launch/test", "pip install ."):
        assert start in README


def test_every_relative_link_in_readme_exists():
    broken = []
    for target in LINK.findall(README):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, ...: no network here
            continue
        path, _, anchor = target.partition("#")
        full = os.path.join(ROOT, path) if path else os.path.join(ROOT, "README.md")
        if not os.path.exists(full):
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in heading_anchors(open(full).read()):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, broken
    assert LINK.findall(README), "README links into the docs"


def test_the_heading_anchors_are_the_ones_github_makes():
    text = "# Limits and FAQ\n## Where `balanced` still falls short (measured)\n```\n# not a heading\n```\n"
    assert heading_anchors(text) == {"limits-and-faq", "where-balanced-still-falls-short-measured"}


def test_the_package_description_is_the_short_readme():
    cfg = open(os.path.join(ROOT, "setup.cfg")).read()
    assert re.search(r"^long_description = file: README\.md$", cfg, re.M)
    assert len(README.encode()) < 20_000
