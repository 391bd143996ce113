"""The simulator of the update (bno_hvd.lab.sim): CFS arithmetic with hand-computed cases, the
metrics a strategy gets, the REAL suite's profiles as bench runs them, and ``bno-hvd simulate``."""

import json
import os
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from bno_hvd.cli.simulate import simulate as simulate_command
from bno_hvd.common.errors import UsageError
from bno_hvd.lab import profiles as real_profiles
from bno_hvd.lab.sim import calibration
from bno_hvd.lab.sim.calibration import STEP_CPU, measured_step, step_noise
from bno_hvd.lab.sim.cfs import Quota
from bno_hvd.lab.sim.engine import Windows, simulate
from bno_hvd.lab.sim.machine import Machine, SimProfile
from bno_hvd.lab.sim.realsuite import BY_NAME, REAL, against, ratio_errors, validate

MS = 1e-3


def quota(limit, period=10 * MS, phase=0.0, share=1.0, cold=0.0):
    return Quota([limit], [period], [phase], [share], cold)


def test_a_phase_under_a_quota_runs_in_whole_periods():
    # 0.25 of a core, 10 ms periods: 2.5 ms of CPU per period, at full speed from each period's start
    q = quota(0.25)
    assert q.run(np.zeros(1), np.array([2 * MS]))[0] == pytest.approx(2 * MS)  # within the budget
    assert q.budget[0] == pytest.approx(0.5 * MS)
    # 6 ms more: 0.5 now, 2.5 in the next period, 2.5 in the one after, 0.5 in the fourth
    assert q.run(np.array([2 * MS]), np.array([6 * MS]))[0] == pytest.approx(30.5 * MS)
    # from a fresh budget: 2.5 + 2.5 + 1 ms (21 ms); losing 0.5 ms each time it resumes: 2.5 + 2 + 1.5
    assert quota(0.25).run(np.zeros(1), np.array([6 * MS]))[0] == pytest.approx(21 * MS)
    assert quota(0.25, cold=0.5 * MS).run(np.zeros(1), np.array([6 * MS]))[0] == pytest.approx(22 * MS)
    # no limit: a share of a core stretches the phase
    assert quota(np.inf, share=0.25).run(np.zeros(1), np.array([6 * MS]))[0] == pytest.approx(24 * MS)


def test_a_wait_that_spins_spends_the_budget_and_one_that_sleeps_does_not():
    q = quota(0.25)
    mask = np.ones(1, bool)
    assert q.spin(np.zeros(1), np.array([5 * MS]), 0.0, mask)[0] == 0 and np.isinf(q.index[0])
    assert q.spin(np.zeros(1), np.array([5 * MS]), 1.0, mask)[0] == pytest.approx(5 * MS)
    assert q.budget[0] == 0  # the allreduce that follows starts throttled
    assert q.run(np.array([5 * MS]), np.array([1 * MS]))[0] == pytest.approx(11 * MS)


def test_the_metrics_are_what_a_real_job_reports():
    w = Windows(3, window=4, updates=10)
    for u in range(6):
        inside = np.array([True, True, u < 3])  # rank 2 sits out from update 3
        w.add(u, inside, [np.array([5, 6, 7]), np.full(3, 0.1), np.full(3, 0.02), np.full(3, 0.004)]
              + [np.full(3, 0.05), np.full(3, 0.12), np.full(3, 0.1), np.array([0.05, 0.05, 0.005])])  # fmt: skip
    m = w.metrics(6, np.array([0.4, np.inf, 0.2]), [0, 8, 0])
    assert m.compute_samples[0] == [(5, 0.1)] * 4 and m.compute_samples[2] == [(7, 0.1)] * 3  # window 4
    assert [u for u, _ in m.sync_samples[0]] == [2, 3, 4, 5] and [u for u, _ in m.sync_samples[2]] == [0, 1, 2]
    assert m.ops[1] == pytest.approx(60) and m.max_batch == [None, 8, None]
    # a limit is reported where the rank's compute used at least half of it: rank 0's compute 0.05 CPU s
    # in 0.1 s (>= 0.2), rank 2's 0.005 (not >= 0.1; over the whole update it would: 0.05 / 0.12)
    assert m.cpu_limit == [0.4, None, None] and m.cpu_share[0] == pytest.approx(0.5)
    w.forget(np.array([False, False, True]))
    assert w.metrics(6, np.array([0.4, np.inf, 0.2]), [0] * 3).compute_samples[2] == []


def test_equal_ranks_split_equally_and_the_update_is_compute_and_the_allreduce():
    machine = replace(Machine.load(), noise=(0.0,), spin=0.0, ring_spin=0.0, cold=0.0)
    profile = SimProfile("free", [np.inf] * 2, global_batch=64)
    run = simulate(profile, machine, "balanced", 40)
    assert all(s == [32, 32] for s in run.splits)
    compute = machine.fixed_cpu + 32 * machine.per_sample_cpu
    early = machine.overlap * machine.sync_cpu  # reduced during the backward pass
    expected = compute + early + max(machine.sync_cpu - early, machine.network / 1.5)  # the slowest part, or the wire
    assert run.seconds[0] == pytest.approx(expected)
    # from the second on, each rank first takes its optimizer step after the last allreduce
    assert run.seconds[1:9] == pytest.approx(np.full(8, expected + machine.step_cpu))  # no rebalance in them
    # a rank at 0 samples sits out: nothing measured, and the other has no allreduce to wait for
    out = simulate(profile, machine, [64, 0], 20)
    assert out.ranks["local"][1] == 0 and out.seconds[0] == pytest.approx(
        machine.fixed_cpu + 64 * machine.per_sample_cpu
    )


def test_the_real_suite_profiles_are_lab_profiles_as_bench_runs_them():
    for p in REAL:
        real = real_profiles.BY_NAME[p.name]
        limits = real.outside or (tuple(real.flags[1].split(",")) if real.flags else None)
        if limits:
            assert p.limits == [float(x) for x in limits] and p.period_ms == real.period_ms
        assert BY_NAME[p.name].hand_split() == real_profiles.hand_split(real), p.name
        changes = real_profiles.scaled_schedule(real, 180, 20)[1:]
        assert [u for u, _, _ in p.schedule] == [u for u, _ in changes]
        assert [lim for _, lim, _ in p.schedule] == [list(q) for _, q in changes]
        assert sum(p.busy) == real.competing


@pytest.mark.parametrize("layout", ["balanced-updates.jsonl", "runs/balanced/updates.jsonl"])
def test_step_noise_is_read_from_the_recorded_updates(tmp_path, layout):
    # (bench keeps every run under runs/ since 2026-11-27; until 2026-11-28 the fit read no noise there)
    path = tmp_path / "competing-process" / layout
    path.parent.mkdir(parents=True)
    lines = [
        {"update": u, "batch_sizes": [32] * 4, "compute_time": 0.1 * (1.2 if u % 5 == 0 else 1.0)} for u in range(40)
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines))
    q = step_noise([str(tmp_path)], quantiles=5)
    assert q[:4] == [0.0] * 4 and q[4] == pytest.approx(0.2)  # one update in five was 20% slower


def test_the_optimizer_step_is_the_measured_one_and_the_fitted_rest_goes_to_the_allreduce():
    fitted = replace(Machine.load(), sync_cpu=3e-3, step_cpu=4e-3)  # what the fit suites gave
    moved = measured_step(fitted)
    assert moved.step_cpu == STEP_CPU
    assert moved.sync_cpu + moved.step_cpu == pytest.approx(7e-3)  # the sync phase's CPU is what was fitted
    committed = Machine.load()
    # (fitted to suite-1127a's times and then its ratios, 2026-11-28: 3.4 ms either way)
    assert committed.step_cpu == STEP_CPU and committed.sync_cpu == pytest.approx(3.4e-3)


SUITES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "real-suites")


@pytest.mark.parametrize(
    "suite, within", [("suite-1127a", 41), ("suite-1127b", 42), ("suite-1128", 40), ("suite-1128b", 42)]
)
def test_the_simulator_predicts_the_real_suites(suite, within):
    # REAL suites of 2026-11-27 and 2026-11-28 (suite.json: every strategy's ratio to equal per round).
    # The calibration was fitted to suite-1127a's times and then its ratios; 1127b and 1128 were not
    # fitted on, and 1128b was run after the fit (today's code). Issue 40's bars: the same winner on
    # 7 of 9 profiles, each ratio within 15% (here: as many as measured on 2026-11-28, and within 15%
    # on average; docs/simulator.md has the table and where it misses)
    rows = validate(os.path.join(SUITES, suite), Machine.load())
    assert len(rows) == 9
    assert sum(r["winner"][0] == r["winner"][1] for r in rows) >= 7, [(r["profile"], r["winner"]) for r in rows]
    errors = ratio_errors(rows)
    assert len(errors) == 45 and np.exp(np.mean(np.abs(errors))) - 1 <= 0.15
    assert _within(errors) >= within
    if suite != "suite-1127a":  # held out: predicted about as well as the REAL suite fitted on predicts it
        real = ratio_errors(against(os.path.join(SUITES, suite), os.path.join(SUITES, "suite-1127a")))
        assert np.mean(np.abs(errors)) <= np.mean(np.abs(real)) + 0.01
        assert _within(errors) >= _within(real) - 1


def _within(errors) -> int:
    return int(sum(abs(np.exp(e) - 1) <= 0.15 for e in errors))


def test_simulate_writes_one_row_per_profile_with_every_strategys_rate(tmp_path):
    out = CliRunner().invoke(
        simulate_command,
        ["--profiles", "3", "--seed", "5", "--strategies", "equal,balanced,fixed", "--out", str(tmp_path)],
    )
    assert out.exit_code == 0, out.output
    assert "seed 5" in out.output and "balanced" in out.output
    rows = json.load(open(os.path.join(tmp_path, "simulate.json")))
    assert len(rows) == 3 and all(set(r["rates"]) == {"equal", "balanced", "fixed"} for r in rows)
    assert all(r["rates"]["balanced"] > 0 and 2 <= len(r["profile"]["limits"]) <= 64 for r in rows)
    again = CliRunner().invoke(
        simulate_command, ["--profiles", "3", "--seed", "5", "--strategies", "equal,balanced,fixed"]
    )
    assert again.output.splitlines()[:5] == out.output.splitlines()[:5]  # the seed fixes the profiles and the noise


def test_rounds_pool_runs_with_their_own_noise_and_the_first_is_the_single_run(tmp_path):
    from bno_hvd.lab.sim.engine import simulate
    from bno_hvd.lab.sim.families import random_profile, run_families, run_seed
    from bno_hvd.lab.sim.machine import Machine

    machine, rng = Machine.load(), np.random.default_rng(7)
    one, pooled = (run_families(machine, 4, 7, ("equal", "balanced"), rounds=r) for r in (1, 3))
    assert [r["profile"] for r in one] == [r["profile"] for r in pooled]
    for k, (a, b) in enumerate(zip(one, pooled)):
        profile = random_profile(rng, f"random-7-{k}", 120)
        assert profile.to_dict() == b["profile"]
        runs = [simulate(profile, machine, "balanced", 120, seed=run_seed(7, k, j)) for j in range(3)]
        rates = [r.samples[20:].sum() / r.seconds[20:].sum() for r in runs]
        assert a["rates"]["balanced"] == pytest.approx(rates[0], rel=1e-12)  # round 0 is the single run
        assert min(rates) - 1e-9 <= b["rates"]["balanced"] <= max(rates) + 1e-9  # all samples over all seconds
    assert any(a["rates"]["balanced"] != b["rates"]["balanced"] for a, b in zip(one, pooled))  # its own noise
    out = CliRunner().invoke(
        simulate_command, ["--profiles", "2", "--seed", "7", "--rounds", "2", "--out", str(tmp_path)]
    )
    assert out.exit_code == 0 and "2 rounds each" in out.output, out.output
    bad = CliRunner().invoke(simulate_command, ["--rounds", "0"])
    assert isinstance(bad.exception, UsageError) and "--rounds must be" in str(bad.exception)


def test_a_miss_is_told_apart_as_the_split_or_the_run(tmp_path, capsys):
    from bno_hvd.lab.sim.engine import simulate
    from bno_hvd.lab.sim.families import random_profile, run_families, run_seed
    from bno_hvd.lab.sim.machine import Machine
    from bno_hvd.lab.sim.misses import explain, held_longest, main

    assert held_longest([[16, 16], [20, 12], [18, 14], [20, 12], [18, 14]]) == [20, 12]  # ties: the earliest
    assert held_longest([[16, 16], [16, 16]]) == [16, 16]
    machine = Machine.load()
    rows = run_families(machine, 3, 7, ("equal", "balanced", "lbbsp"))
    rows[1]["rates"]["balanced"] = 0.5 * rows[1]["rates"]["lbbsp"]  # a miss against lbbsp, as if measured
    found = [m for m in explain(rows, machine) if m["profile"] == "random-7-1"]
    assert len(found) == 1 and found[0]["peer"] == "lbbsp" and found[0]["ratio"] == pytest.approx(0.5)
    # its kind is read off the two splits each held longest, kept fixed with the run's own noise
    rng = np.random.default_rng(7)
    profile = [random_profile(rng, f"random-7-{k}", 120) for k in range(2)][1]
    runs = {s: simulate(profile, machine, s, 120, seed=run_seed(7, 1)) for s in ("balanced", "lbbsp")}
    fixed = {}
    for s, run in runs.items():
        assert found[0]["split" if s == "balanced" else "peer_split"] == held_longest(run.splits)
        kept = simulate(profile, machine, held_longest(run.splits), 120, seed=run_seed(7, 1))
        fixed[s] = kept.samples[20:].sum() / kept.seconds[20:].sum()
    assert found[0]["fixed_ratio"] == pytest.approx(fixed["balanced"] / fixed["lbbsp"], rel=1e-12)
    assert found[0]["kind"] == ("split" if fixed["balanced"] < 0.97 * fixed["lbbsp"] else "run")
    path = tmp_path / "simulate.json"
    path.write_text(json.dumps(rows))
    main([str(path)])
    printed = capsys.readouterr().out
    assert f"| random-7-1 | 0.500 | lbbsp | {found[0]['fixed_ratio']:.3f} |" in printed, printed
    assert f"of 3 profiles below 0.97 of the best peer: {{'{found[0]['kind']}': 1" in printed, printed
    rows[2]["profile"]["period_ms"] += 1.0  # not the profile its name draws
    with pytest.raises(ValueError, match="differs from the file's"):
        rows[2]["rates"]["balanced"] = 0.1
        explain(rows, machine)


@pytest.mark.parametrize(
    "args, says",
    [(["--profiles", "0"], "--profiles must be"), (["--strategies", "equal,nope"], "unknown strategy"),
     (["--strategies", "equal"], "at least two")],
)  # fmt: skip
def test_simulate_refuses_bad_flags_with_one_line(args, says):
    out = CliRunner().invoke(simulate_command, args)
    assert isinstance(out.exception, UsageError) and says in str(out.exception)


@pytest.mark.parametrize("seed", [20261126, 2**32 - 1])
def test_every_seed_the_flag_takes_runs(seed):
    # seed * 100003 + k, the run's noise seed, once went past what a strategy's seed takes:
    # --seed 20261126 failed naming 2026173383378
    from bno_hvd.lab.sim.families import run_seed

    assert run_seed(40, 673, 2) == 40 * 100003 + 673 + 7919 * 2  # the seeds of the figures measured so far
    out = CliRunner().invoke(
        simulate_command, ["--profiles", "1", "--seed", str(seed), "--updates", "40", "--strategies", "equal,fixed"]
    )
    assert out.exit_code == 0, out.output + repr(out.exception)
    assert f"seed {seed}" in out.output


def test_the_simulator_needs_only_the_allocation_and_common_wings():
    import ast

    import bno_hvd.lab.sim as sim

    folder = os.path.dirname(sim.__file__)
    for name in os.listdir(folder):
        if name.endswith(".py"):
            tree = ast.parse(open(os.path.join(folder, name)).read())
            for node in ast.walk(tree):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                mods += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                for mod in mods:
                    top = mod.split(".")
                    assert top[0] not in ("torch", "horovod", "mpi4py"), (name, mod)
                    if top[0] == "bno_hvd":
                        assert top[1] in ("allocation", "common") or mod.startswith("bno_hvd.lab.sim"), (name, mod)


@pytest.mark.slow
def test_the_ratio_fit_takes_a_value_only_where_the_suites_ratios_are_predicted_better(monkeypatch, tmp_path):
    # one field on a grid of two: from a machine whose busy processes cost nothing (busy_weight 0),
    # the fit takes the committed 0.4 only because competing-process's ratios come out closer with it;
    # two of suite-1127b's nine profiles (the whole suite took 11 minutes of the test run)
    with open(os.path.join(SUITES, "suite-1127b", "suite.json")) as fh:
        rows = json.load(fh)

    def suite(*profiles):
        path = tmp_path / "-".join(profiles) / "suite-1127b"
        path.mkdir(parents=True)
        (path / "suite.json").write_text(json.dumps([r for r in rows if r["profile"] in profiles]))
        return str(path)

    monkeypatch.setattr(calibration, "GRID", {"busy_weight": np.array([0.0, 0.4]), "step_cpu": np.array([9.0])})
    start = replace(Machine.load(), busy_weight=0.0, fitted_on=("x",))
    both = suite("competing-process", "outside-equal-10ms")
    before = np.sum(ratio_errors(validate(both, start)) ** 2)
    fitted = calibration.fit_ratios(start, both, echo=lambda line: None)
    assert fitted.busy_weight == 0.4 and fitted.step_cpu == start.step_cpu  # (the step stays as measured)
    assert np.sum(ratio_errors(validate(both, fitted)) ** 2) < before
    assert fitted.fitted_on == ("x", "suite-1127b (ratios)")
    assert fitted.per_token_cpu == fitted.per_sample_cpu / 64  # the costs the suite cannot show follow
    # without a busy process in the suite, nothing fits better: the start stays
    assert calibration.fit_ratios(start, suite("outside-equal-10ms"), echo=lambda line: None).busy_weight == 0.0


def test_the_committed_calibration_is_fitted_on_the_suite_in_the_repository(monkeypatch):
    # tests/fixtures/real-suites/suite-1127a holds what the time fit reads (bench.json and balanced's
    # updates per profile): what it reads off the logs is the committed machine's, and the sweep
    # takes a value only where the replayed runs fit better
    committed = Machine.load()
    monkeypatch.setattr(calibration, "GRID", {"fixed_cpu": np.array([0.5e-3, 9e-3])})
    fitted = calibration.calibrate([os.path.join(SUITES, "suite-1127a")], echo=lambda line: None)
    assert fitted.noise == committed.noise and len(fitted.noise) == 65
    assert (fitted.rejoin, fitted.rebalance) == (committed.rejoin, committed.rebalance)
    assert fitted.fixed_cpu == 0.5e-3 and fitted.fitted_on == ("suite-1127a",)
