"""The layout rules of the package (docs/architecture.md), checked on the code as it stands.

- at most 10 entries at the top of bno_hvd/, one wing per role;
- every wing's ``__init__`` docstring says what it holds and what it may import, and the imports
  keep to it (the production path - common, allocation, data, processes, library, training - never imports the lab
  or the CLI; the method is pure);
- every package's ``__init__`` docstring names each of its modules and subpackages;
- no import circle between the package's modules (imports inside functions count too);
- no module name used twice in the package; no file over 350 lines (package, tests, examples,
  benchmarks); no function over complexity 15 (ruff C901, which the test command runs).
"""

import ast
import os
import re

import pytest
import tomllib
from support.jobs import ROOT

PACKAGE = os.path.join(ROOT, "bno_hvd")
# wing -> the wings it may import (besides itself)
MAY_IMPORT = {
    "common": set(),
    "allocation": {"common"},
    "data": {"common"},
    "processes": {"common"},
    "library": {"common", "allocation", "data", "processes"},
    "training": {"common", "allocation", "data", "processes", "library"},
    "lab": {"common", "allocation", "data", "processes", "library", "training"},
    "cli": {"common", "allocation", "data", "processes", "library", "training", "lab"},
}
# the method is pure: no MPI, no Horovod, no torch, no clock
NOT_IN_THE_METHOD = {"mpi4py", "horovod", "torch", "torchvision", "time"}
MAX_LINES = 350


def python_files(*tops):
    for top in tops:
        for folder, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            yield from (os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))


def imports_of(path):
    """Every module a file imports (also inside functions), as dotted names."""
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import (the package imports absolutely)"
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def test_the_top_of_the_package_shows_the_wings():
    entries = sorted(e for e in os.listdir(PACKAGE) if e != "__pycache__")
    assert len(entries) <= 10, entries
    wings = {e for e in entries if os.path.isdir(os.path.join(PACKAGE, e))}
    assert wings == set(MAY_IMPORT), wings
    assert set(entries) - wings == {"__init__.py", "__main__.py"}


@pytest.mark.parametrize("wing", sorted(MAY_IMPORT))
def test_each_wing_says_what_it_holds_and_may_import(wing):
    doc = ast.get_docstring(ast.parse(open(os.path.join(PACKAGE, wing, "__init__.py")).read()))
    assert doc and re.search(r"\b(may import|imports nothing)\b", doc, re.I), f"bno_hvd/{wing}/__init__.py"
    for other in MAY_IMPORT[wing]:
        assert other in doc, f"bno_hvd/{wing}/__init__.py does not name {other}, which it may import"


@pytest.mark.parametrize("wing", sorted(MAY_IMPORT))
def test_a_wing_imports_only_what_it_may(wing):
    allowed = MAY_IMPORT[wing] | {wing}
    wrong = []
    for path in python_files(os.path.join("bno_hvd", wing)):
        for name in imports_of(path):
            parts = name.split(".")
            if parts[0] == "bno_hvd" and len(parts) > 1 and parts[1] in MAY_IMPORT and parts[1] not in allowed:
                wrong.append(f"{os.path.relpath(path, ROOT)} imports {name}")
            if wing == "allocation" and parts[0] in NOT_IN_THE_METHOD:
                wrong.append(f"{os.path.relpath(path, ROOT)} imports {name}: the method is pure")
    assert not wrong, "\n".join(wrong)


def packages():
    """Every package directory of bno_hvd below the top (wings and their subpackages)."""
    for folder, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        if folder != PACKAGE and "__init__.py" in files:
            yield folder


@pytest.mark.parametrize("folder", sorted(os.path.relpath(f, ROOT) for f in packages()))
def test_every_package_lists_its_modules(folder):
    doc = ast.get_docstring(ast.parse(open(os.path.join(ROOT, folder, "__init__.py")).read())) or ""
    entries = sorted(os.listdir(os.path.join(ROOT, folder)))
    modules = [e[:-3] for e in entries if e.endswith(".py") and e != "__init__.py"]
    modules += [e for e in entries if os.path.isfile(os.path.join(ROOT, folder, e, "__init__.py"))]
    missing = [m for m in modules if f":mod:`.{m}`" not in doc]
    assert not missing, f"{folder}/__init__.py's docstring does not name {missing} (as :mod:`.name`)"


def test_the_package_docstring_names_every_wing():
    doc = ast.get_docstring(ast.parse(open(os.path.join(PACKAGE, "__init__.py")).read()))
    missing = [wing for wing in MAY_IMPORT if f":mod:`bno_hvd.{wing}`" not in doc]
    assert not missing, f"bno_hvd/__init__.py's docstring does not name {missing}"


def module_graph():
    """{module: the bno_hvd modules it imports}, read from the source (imports inside functions too).
    ``from a import b`` is an edge to ``a.b`` when that is a module, else to ``a``."""
    names = {}
    for path in python_files("bno_hvd"):
        rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
        names[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = path
    graph = {}
    for module, path in names.items():
        edges = set()
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    edges.add(full if full in names else node.module)
        graph[module] = sorted(e for e in edges if e in names and e != module)
    return graph


def find_cycle(graph):
    """One import circle as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle():
    graph = module_graph()
    assert "bno_hvd.library.balancer" in graph["bno_hvd.library.dropin"]  # the graph was read
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"], "d": []}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b", "c"], "b": ["c"], "c": []}) is None


def test_no_module_name_is_used_twice():
    seen = {}
    for path in python_files("bno_hvd"):
        name = os.path.basename(path)[:-3]
        if name == "__init__":
            name = os.path.basename(os.path.dirname(path))
            if name == "bno_hvd":
                continue
        seen.setdefault(name, []).append(os.path.relpath(path, ROOT))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, twice


def test_no_file_is_over_350_lines():
    long = {}
    for path in python_files("bno_hvd", "tests", "examples", "benchmarks"):
        with open(path) as fh:
            lines = sum(1 for _ in fh)
        if lines > MAX_LINES:
            long[os.path.relpath(path, ROOT)] = lines
    assert not long, long


def test_the_complexity_limit_is_part_of_the_lint():
    with open(os.path.join(ROOT, "ruff.toml"), "rb") as fh:
        conf = tomllib.load(fh)
    assert "C90" in conf["lint"]["select"] and conf["lint"]["mccabe"]["max-complexity"] == 15
    assert "ruff check" in open(os.path.join(ROOT, "launch", "test")).read()


def test_tests_mirror_the_wings():
    tests = os.path.join(ROOT, "tests")
    folders = {d for d in os.listdir(tests) if os.path.isdir(os.path.join(tests, d)) and d != "__pycache__"}
    # besides the wings: helpers (support/), data files (fixtures/) and the documentation's own tests
    # (docs/: the site builds)
    assert folders == set(MAY_IMPORT) - {"common"} | {"support", "fixtures", "docs"}, folders
    loose = [f for f in os.listdir(tests) if f.endswith(".py") and f not in ("conftest.py", "test_layout.py")]
    assert not loose, f"helpers belong in tests/support/, tests in a wing's folder: {loose}"


def test_the_public_imports_users_write_keep_working():
    import bno_hvd
    from bno_hvd import Balancer, MetricsMonitor, build_model, make_strategy  # noqa: F401
    from bno_hvd.allocation import bno_batch_sizes  # noqa: F401
    from bno_hvd.data import torchvision_root  # noqa: F401

    assert all(getattr(bno_hvd, name) is not None for name in bno_hvd.__all__ if name != "__version__")


def test_the_tiers_are_the_registered_markers_and_launch_test_runs_them_in_its_phases():
    import configparser

    from support.tiers import ALONE, FAST, PARALLEL, TIERS

    pytest_cfg = configparser.ConfigParser()
    pytest_cfg.read(os.path.join(ROOT, "setup.cfg"))
    markers = [line.split(":")[0] for line in pytest_cfg["tool:pytest"]["markers"].strip().splitlines()]
    assert tuple(markers) == (*TIERS, "alone") and "--strict-markers" in pytest_cfg["tool:pytest"]["addopts"]
    assert set(ALONE) <= set(markers)
    script = open(os.path.join(ROOT, "launch", "test")).read()
    # --fast, then the two groups: what must run alone starts first at normal priority, then the
    # script takes the idle priority that the rest, on two workers, inherits
    assert f'-m "{FAST}"' in script and f'-m "{PARALLEL}"' in script and f'-m "not ({PARALLEL})"' in script
    assert script.index(f'-m "not ({PARALLEL})"') < script.index("chrt --idle -p 0 $$") < script.index(PARALLEL + '"')


def test_an_unmarked_test_that_starts_a_process_fails_even_if_it_catches_the_error(pytester):
    pytester.makepyfile(
        """
        import os, subprocess

        def test_runs_a_process():
            subprocess.run(["true"])

        def test_hides_it():
            try:
                os.system("true")
            except Exception:
                pass

        def test_pure():
            assert os.getpid() > 0
        """
    )
    result = pytester.runpytest_inprocess("-p", "support.tiers", "-q")
    result.assert_outcomes(passed=1, failed=2)
    result.stdout.fnmatch_lines(["*started a process (system: true) without a tier marker: mark this test*"])


@pytest.mark.slow
def test_in_phase_1_a_test_file_runs_on_one_worker(pytester, monkeypatch):
    """Its module-scoped jobs run once: the files are grouped also inside xdist's workers."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([os.path.join(ROOT, "tests"), os.environ.get("PYTHONPATH", "")]))
    for name in ("test_a", "test_b", "test_c"):
        pytester.makepyfile(
            **{
                name: f"""
                import os

                def record():
                    with open({str(pytester.path / "workers.txt")!r}, "a") as fh:
                        fh.write("{name} " + os.environ["PYTEST_XDIST_WORKER"] + "\\n")

                def test_1(): record()
                def test_2(): record()
                def test_3(): record()
                """
            }
        )
    result = pytester.runpytest_subprocess("-p", "support.tiers", "-n", "2", "--dist", "loadfile", "-q")
    result.assert_outcomes(passed=9)
    seen = {}
    for line in (pytester.path / "workers.txt").read_text().split("\n")[:-1]:
        name, worker = line.split()
        seen.setdefault(name, set()).add(worker)
    assert sorted(seen) == ["test_a", "test_b", "test_c"] and all(len(w) == 1 for w in seen.values()), seen


def test_test_files_start_longest_first_and_an_unknown_one_by_its_markers():
    from support.tiers import GUESS, longest_first

    class Item:
        def __init__(self, *markers):
            self.markers = markers

        def get_closest_marker(self, name):
            return name if name in self.markers else None

    files = {"a.py": [Item()], "b.py": [Item(), Item("slow")], "c.py": [Item("mpi")], "d.py": [Item()]}
    assert longest_first(files, {"a.py": 50.0, "c.py": 1.0}) == ["a.py", "b.py", "c.py", "d.py"]
    assert longest_first(files, {}) == ["c.py", "b.py", "a.py", "d.py"]  # mpi's guess, slow's, then collection order
    assert GUESS["mpi"] > GUESS["slow"] > 0
