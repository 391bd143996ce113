"""Every bad input costs one line on stderr ("bno-hvd: error: ..."), exit code 2, no traceback.

Most cases run the real ``bno-hvd`` command in-process through click's CliRunner (the same
``Group.main`` -> ``fail`` path as the console script, but without paying a torch import per
case); a few run it as a real subprocess, and two under real horovodrun with 2 ranks, where the
message must appear once (rank 0) and no rank may print a traceback or hang.
"""

import json

import pytest
from click.testing import CliRunner
from support.jobs import bno_cmd, horovodrun, run_cli

from bno_hvd.cli.main import main

DRY = ["train", "--dry-run", "--world-size", "4", "--dataset", "synthetic", "--no-progress"]


def cli(*args):
    return CliRunner().invoke(main, list(args))


def assert_user_error(code, stdout, stderr, *words, exit_code=2):
    """One ``bno-hvd: error:`` line holding ``words``, the exit code, and no traceback."""
    assert code == exit_code, f"exit {code}\nSTDOUT:\n{stdout}\nSTDERR:\n{stderr}"
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line, got:\n{stderr}"
    assert lines[0].startswith("bno-hvd: error: "), lines[0]
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"
    assert "Traceback" not in stdout + stderr


def assert_cli_error(result, *words):
    # a Python exception escaping the command would be result.exception (not SystemExit)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert_user_error(result.exit_code, result.stdout, result.stderr, *words)


# -- CLI values ------------------------------------------------------------------------------

CLI_CASES = [
    ("unknown model", ["--model", "lenet"], ["--model", "'lenet' is not one of"]),
    ("unknown strategy", ["--strategy", "fastest"], ["--strategy", "unknown strategy 'fastest'"]),
    ("strategy option", ["--strategy", "balanced:dedband=0.1"], ["--strategy", "no option 'dedband'"]),
    (
        "option of the old balanced",
        ["--strategy", "balanced:smoothing=0.5"],
        ["--strategy", "no option 'smoothing' any more", "sit_out"],
    ),
    ("unknown dataset", ["--dataset", "cifar"], ["--dataset", "'cifar' is not one of"]),
    ("unknown flag", ["--batchsize", "3"], ["No such option '--batchsize'"]),
    ("non-integer updates", ["--updates", "ten"], ["--updates", "not a valid integer"]),
    ("zero updates", ["--updates", "0"], ["--updates must be a positive integer, got 0"]),
    ("negative updates", ["--updates", "-5"], ["--updates must be a positive integer, got -5"]),
    ("zero base batch", ["--base-batch-size", "0"], ["--base-batch-size must be a positive integer"]),
    ("negative base batch", ["--base-batch-size", "-1"], ["--base-batch-size must be a positive integer"]),
    ("zero in batch sizes", ["--strategy", "fixed", "--batch-sizes", "4,0,4,4"], ["--batch-sizes", ">= 1"]),
    ("negative batch sizes", ["--strategy", "fixed", "--batch-sizes", "4,-2,4,4"], ["--batch-sizes", ">= 1"]),
    ("text batch sizes", ["--strategy", "fixed", "--batch-sizes", "a,b,c,d"], ["comma-separated integers"]),
    ("too few batch sizes", ["--strategy", "fixed", "--batch-sizes", "5,11,3"], ["3 entries but the job has 4 ranks"]),
    (
        "too many batch sizes",
        ["--strategy", "fixed", "--batch-sizes", "1,1,1,1,1"],
        ["5 entries but the job has 4 ranks"],
    ),
    ("fixed without sizes", ["--strategy", "fixed"], ["--strategy fixed needs --batch-sizes"]),
    ("sizes without fixed", ["--strategy", "equal", "--batch-sizes", "1,2,3,4"], ["only applies to --strategy fixed"]),
    ("too few speeds", ["--emulate-speed", "1,1,0.5"], ["--emulate-speed has 3 entries but the job has 4"]),
    ("zero speed", ["--emulate-speed", "1,1,1,0"], ["every speed must be a finite number > 0"]),
    ("negative speed", ["--emulate-speed", "1,-1,1,1"], ["every speed must be a finite number > 0"]),
    ("nan speed", ["--emulate-speed", "1,nan,1,1"], ["every speed must be a finite number > 0"]),
    ("zero emulate rate", ["--emulate-rate", "0"], ["--emulate-rate must be a positive number"]),
    ("nan emulate rate", ["--emulate-rate", "nan"], ["--emulate-rate must be a positive number"]),
    ("nan lr", ["--lr", "nan"], ["--lr must be a positive number"]),
    ("negative lr", ["--lr", "-0.1"], ["--lr must be a positive number"]),
    ("negative momentum", ["--momentum", "-1"], ["--momentum must be a number >= 0"]),
    ("zero threads", ["--threads", "0"], ["--threads must be a positive integer"]),
    ("zero rebalance", ["--rebalance-every", "0"], ["--rebalance-every must be a positive integer"]),
    ("nan latency interval", ["--latency-interval", "nan"], ["--latency-interval must be >= 0"]),
    ("global batch below ranks", ["--global-batch", "3"], ["--global-batch 3 is smaller than the 4 ranks"]),
    ("zero max batch", ["--max-batch", "0"], ["--max-batch '0': every cap must be >= 1"]),
    ("text max batch", ["--max-batch", "lots"], ["--max-batch 'lots'", "comma-separated integers"]),
    ("too few caps", ["--max-batch", "8,8,8"], ["--max-batch has 3 entries but the job has 4 ranks"]),
    ("huge cap", ["--max-batch", "8,8,8,99999999999"], ["--max-batch", "between 1 and 1e+06"]),
    ("auto cap on a cpu", ["--max-batch", "auto", "--device", "cpu"], ["--max-batch auto measures GPU memory"]),
    ("cuda without a gpu", ["--device", "cuda"], ["--device cuda: no CUDA device here"]),
    ("quota count", ["--cpu-quota", "0.5,0.5"], ["--cpu-quota has 2 entries but the job has 4 ranks"]),
    ("tiny quota", ["--cpu-quota", "0.5,0.5,0.5,0.001"], ["--cpu-quota", "between 0.01 and 64"]),
    ("period too short", ["--cpu-quota", "0.5,0.5,0.5,0.05", "--cpu-quota-period", "10"], ["at least 20 ms"]),
    ("zero world size", ["--world-size", "0"], ["--world-size must be a positive integer"]),
    ("checkpoint every without dir", ["--checkpoint-every", "5"], ["--checkpoint-every needs --checkpoint-dir"]),
    ("resume without dir", ["--resume"], ["--resume needs --checkpoint-dir"]),
    (
        "zero kept checkpoints",
        ["--checkpoint-dir", "ck", "--keep-checkpoints", "0"],
        ["--keep-checkpoints must be a positive"],
    ),
    ("bad fault spec", ["--inject-fault", "explode:1:2"], ["--inject-fault entry 'explode:1:2'"]),
    ("model module missing", ["--model", "no_such_package.models:net"], ["--model", "cannot import no_such_package"]),
    (
        "model not a module",
        ["--model", "tests.support.user_model:not_a_module"],
        ["returned str, not a torch.nn.Module"],
    ),
    ("model function missing", ["--model", "tests.support.user_model:nothing"], ["has no function nothing"]),
    ("negative workers", ["--num-workers", "-1"], ["--num-workers must be >= 0"]),
    ("zero prefetch", ["--num-workers", "2", "--prefetch-factor", "0"], ["--prefetch-factor must be a positive"]),
    (
        "lag too small",
        ["--num-workers", "2", "--allocation-lag", "3"],
        ["--allocation-lag 3 is too small", "at least 5"],
    ),
    ("imagefolder without dir", ["--dataset", "imagefolder"], ["--dataset imagefolder needs --data-dir"]),
]


@pytest.mark.parametrize("args, words", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_bad_cli_value(args, words):
    assert_cli_error(cli(*DRY, *args), *words)


def test_unreadable_paths(tmp_path):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert_cli_error(cli(*DRY, "--log-dir", str(a_file / "logs")), "--log-dir", "is a file, not a directory")
    assert_cli_error(
        cli(*DRY, "--checkpoint-dir", str(a_file), "--checkpoint-every", "5"), "--checkpoint-dir", "is a file"
    )
    assert_cli_error(cli(*DRY, "--save-model", str(tmp_path)), "--save-model", "is a directory")
    assert_cli_error(cli(*DRY, "--save-model", str(a_file / "m.pt")), "--save-model", "is a file, not a directory")
    assert_cli_error(cli(*DRY, "--emulate-schedule", str(tmp_path / "none.json")), "--emulate-schedule", "cannot read")
    bad_schedule = tmp_path / "schedule.json"
    bad_schedule.write_text("{not json")
    assert_cli_error(cli(*DRY, "--emulate-schedule", str(bad_schedule)), "--emulate-schedule", "not valid JSON")
    assert_cli_error(
        cli(*DRY, "--dataset", "mnist", "--data-dir", str(tmp_path / "nowhere")), "mnist: missing train-images"
    )
    assert_cli_error(cli(*DRY, "--dataset", "fashion-mnist", "--data-dir", str(tmp_path)), "fashion-mnist: missing")
    (tmp_path / "empty" / "train").mkdir(parents=True)
    assert_cli_error(
        cli(*DRY, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "empty")),
        "imagefolder",
        "class folder",
        "train",
    )
    (tmp_path / "noimg" / "train" / "cats").mkdir(parents=True)
    (tmp_path / "noimg" / "train" / "cats" / "notes.txt").write_text("not an image")
    assert_cli_error(
        cli(*DRY, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "noimg")), "imagefolder", "no valid file"
    )
    # and the same pre-flight accepts what is right (nothing is created by it)
    ok = cli(*DRY, "--log-dir", str(tmp_path / "new" / "logs"), "--checkpoint-dir", str(tmp_path / "ck"))
    assert ok.exit_code == 0 and ok.stdout.strip() == "ok", ok.stderr
    assert not (tmp_path / "new").exists()


# -- hostfiles (`bno-hvd check-hostfile`, what launch/run calls before horovodrun) -----------

HOSTFILE_CASES = [
    ("missing slots", "localhost\n", ["line 1", "missing 'slots=N'"]),
    ("zero slots", "localhost slots=0\n", ["bad slot count '0'"]),
    ("text slots", "localhost slots=four\n", ["bad slot count 'four'"]),
    ("negative slots", "# cluster\nlocalhost slots=-1\n", ["line 2", "bad slot count '-1'"]),
    ("unknown host", "localhost slots=2\nno-such-node.invalid slots=2\n", ["unknown host(s) 'no-such-node.invalid'"]),
    ("only comments", "# nothing\n\n", ["no hosts in it"]),
    ("too few slots", "localhost slots=2\n", ["has 2 slots but -np 4 was asked"]),
]


@pytest.mark.parametrize("text, words", [c[1:] for c in HOSTFILE_CASES], ids=[c[0] for c in HOSTFILE_CASES])
def test_bad_hostfile(tmp_path, text, words):
    path = tmp_path / "hostfile"
    path.write_text(text)
    assert_cli_error(cli("check-hostfile", str(path), "--np", "4"), *words)


def test_blank_lines_and_comments_pass_and_the_clean_copy_suits_horovodrun(tmp_path):
    from horovod.runner.common.util.hosts import parse_hosts

    path, clean = tmp_path / "hostfile", tmp_path / "clean"
    path.write_text("# two entries\n\nlocalhost slots=2   # this box\n\n127.0.0.1 slots=2\n\n")
    result = cli("check-hostfile", str(path), "--np", "4", "--write-clean", str(clean))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "localhost:2,127.0.0.1:2"
    # horovodrun's own parser crashes on the original (trailing blank line) but reads the copy
    lines = clean.read_text().splitlines()
    assert lines == ["localhost slots=2", "127.0.0.1 slots=2"]
    hosts = parse_hosts(",".join(f"{line.split()[0]}:{line.split('=')[1]}" for line in lines))
    assert [(h.hostname, h.slots) for h in hosts] == [("localhost", 2), ("127.0.0.1", 2)]


def test_missing_hostfile():
    assert_cli_error(cli("check-hostfile", "/nonexistent/hostfile"), "cannot read it")


# -- metrics files (`bno-hvd allocate --metrics`) --------------------------------------------

GOOD = {
    "ops": [100.0, 100.0, 50.0],
    "memory_used": [1e9, 1e9, 2e9],
    "latency": [[0, 1e-4, 2e-4], [1e-4, 0, 2e-4], [2e-4, 2e-4, 0]],
}


def metrics(**changes):
    data = json.loads(json.dumps(GOOD))
    data.update(changes)
    return json.dumps(data)


METRICS_CASES = [
    ("malformed json", '{"ops": [1, 2,', ["is not valid JSON"]),
    ("not an object", "[1, 2, 3]", ["must hold a JSON object"]),
    ("missing key", json.dumps({"ops": [1.0], "memory_used": [1.0]}), ["lacks 'latency'"]),
    ("unknown key", metrics(speed=[1, 2, 3]), ["unknown key 'speed'"]),
    ("memory length", metrics(memory_used=[1e9, 1e9]), ["'memory_used' has 2 entries but 'ops' has 3"]),
    ("latency rows", metrics(latency=[[0, 1e-4, 2e-4], [1e-4, 0, 2e-4]]), ["must be a list of 3 rows"]),
    ("non-square latency", metrics(latency=[[0, 1e-4], [1e-4, 0], [2e-4, 2e-4]]), ["latency must be square (3x3)"]),
    ("nan ops", metrics(ops=[100.0, float("nan"), 50.0]), ["ops[1] is nan"]),
    ("infinite memory", metrics(memory_used=[1e9, float("inf"), 1e9]), ["memory_used[1] is inf"]),
    (
        "nan latency",
        metrics(latency=[[0, float("nan"), 2e-4], [1e-4, 0, 2e-4], [2e-4, 2e-4, 0]]),
        ["latency[0][1] is nan"],
    ),
    ("negative ops", metrics(ops=[100.0, -1.0, 50.0]), ["ops[1] is -1.0; values must be >= 0"]),
    ("negative memory", metrics(memory_used=[1e9, 1e9, -5.0]), ["memory_used[2] is -5.0"]),
    (
        "negative latency",
        metrics(latency=[[0, -1e-4, 2e-4], [-1e-4, 0, 2e-4], [2e-4, 2e-4, 0]]),
        ["latency[0][1] is -0.0001"],
    ),
    (
        "asymmetric latency",
        metrics(latency=[[0, 1e-4, 0.5], [1e-4, 0, 2e-4], [2e-4, 2e-4, 0]]),
        ["latency is asymmetric at [0][2]"],
    ),
    (
        "non-zero diagonal",
        metrics(latency=[[0, 1e-4, 2e-4], [1e-4, 3e-4, 2e-4], [2e-4, 2e-4, 0]]),
        ["latency[1][1] is 0.0003; the diagonal must be 0"],
    ),
    ("text in ops", metrics(ops=[100.0, "fast", 50.0]), ['ops[1] is "fast"']),
]


@pytest.mark.parametrize("text, words", [c[1:] for c in METRICS_CASES], ids=[c[0] for c in METRICS_CASES])
def test_bad_metrics_file(tmp_path, text, words):
    path = tmp_path / "metrics.json"
    path.write_text(text)
    assert_cli_error(cli("allocate", "--metrics", str(path), "--strategy", "bno"), *words)


def test_good_metrics_file_allocates_every_rank(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(metrics())
    result = cli("allocate", "--metrics", str(path), "--strategy", "bno", "--base-batch-size", "32")
    assert result.exit_code == 0, result.stderr
    sizes = json.loads(result.stdout)["batch_sizes"]
    assert len(sizes) == 3 and all(b >= 1 for b in sizes)


def test_unreadable_metrics_file(tmp_path):
    assert_cli_error(cli("allocate", "--metrics", str(tmp_path / "none.json")), "cannot read metrics file")
    assert_cli_error(cli("allocate", "--metrics", str(tmp_path)), "--metrics", "is a directory")


# -- the same through real processes --------------------------------------------------------


@pytest.mark.slow
def test_real_processes_print_one_line(tmp_path):
    proc = run_cli(*DRY, "--strategy", "fixed", "--batch-sizes", "5,11,3")
    assert_user_error(proc.returncode, proc.stdout, proc.stderr, "3 entries but the job has 4 ranks")
    (tmp_path / "hostfile").write_text("localhost slots=x\n")
    proc = run_cli("check-hostfile", str(tmp_path / "hostfile"))
    assert_user_error(proc.returncode, proc.stdout, proc.stderr, "bad slot count 'x'")
    (tmp_path / "m.json").write_text(metrics(ops=[1.0, float("inf"), 2.0]))
    proc = run_cli("allocate", "--metrics", str(tmp_path / "m.json"))
    assert_user_error(proc.returncode, proc.stdout, proc.stderr, "ops[1] is inf")


def horovodrun_train(*flags):
    """``bno-hvd train`` on 2 ranks under real horovodrun that must fail: the process."""
    common = ("--dataset", "synthetic", "--no-progress", "--no-eval", "--latency-interval", "0")
    proc = horovodrun(2, bno_cmd("train", *common, *flags), timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stdout + proc.stderr
    return proc


def one_error_line(proc):
    """The one ``bno-hvd: error:`` line of the whole job (rank 0's; no other rank prints one)."""
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "bno-hvd: error:" in line]
    assert len(lines) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return lines[0]


@pytest.mark.mpi
def test_horovodrun_bad_value_gives_one_message_and_no_traceback():
    proc = horovodrun_train("--strategy", "fixed", "--batch-sizes", "5,11,3", "--updates", "5")
    assert "--batch-sizes has 3 entries but the job has 2 ranks" in one_error_line(proc)


@pytest.mark.mpi
def test_horovodrun_damaged_checkpoint_ends_every_rank(tmp_path):
    # rank 0 alone reads the checkpoint: its error must reach the other ranks (no hang)
    ckpt = tmp_path / "ck"
    ckpt.mkdir()
    (ckpt / "ckpt-00000010.pt").write_bytes(b"not a torch file")
    proc = horovodrun_train("--updates", "20", "--checkpoint-dir", str(ckpt), "--resume")
    line = one_error_line(proc)
    assert "ckpt-00000010.pt cannot be read" in line and "remove it" in line


@pytest.mark.parametrize(
    "args, words",
    [
        (["--strategies", "equal,balanced,equal"], ["--strategies names equal more than once"]),
        (["--strategies", "equal,balanced", "--batch-sizes", "4,4"], ["--batch-sizes only applies", "fixed"]),
    ],
)
def test_bench_refuses_before_any_run(args, words):
    # the table is keyed by strategy, and --batch-sizes belongs to 'fixed' alone: refused up
    # front, not after the first strategy has trained
    assert_cli_error(cli("bench", "--dataset", "synthetic", "--no-progress", *args), *words)
