"""``bno-hvd simulate``: allocation strategies on random simulated profiles (no MPI, no torch), or
the simulator checked against a REAL suite's measurements (:mod:`bno_hvd.lab.sim`)."""

from __future__ import annotations

import os

import click

from bno_hvd.common.errors import UsageError

DEFAULT = "equal,balanced,lbbsp,proportional,fixed"


def check_simulate_flags(profiles: int, seed: int, updates: int, specs: list[str], rounds: int = 1) -> None:
    """The flags, before anything runs: one line naming the flag that is wrong."""
    from bno_hvd.allocation import check_spec
    from bno_hvd.common.parsing import SEED

    for flag, value, low, high in (
        ("--profiles", profiles, 1, 10**6),
        ("--seed", seed, SEED.low, SEED.high),
        ("--updates", updates, 40, 10**5),
        ("--rounds", rounds, 1, 100),
    ):
        if not low <= value <= high:
            raise UsageError(f"{flag} must be between {low} and {high}, got {value}")
    for spec in specs:
        check_spec(spec)
    if len(set(specs)) != len(specs) or len(specs) < 2:
        raise UsageError("--strategies needs at least two different strategies (each is compared with the best other)")


@click.command()
@click.option("--profiles", type=int, default=1000, show_default=True, help="How many random profiles to simulate.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the profiles and of their noise.")
@click.option(
    "--strategies",
    default=DEFAULT,
    show_default=True,
    help="Comma-separated strategies (with options, as bench takes them); fixed is the hand split "
    "proportional to each profile's limits.",
)
@click.option("--updates", type=int, default=120, show_default=True, help="Updates per run; the first 20 warm up.")
@click.option(
    "--rounds",
    type=int,
    default=1,
    show_default=True,
    help="Runs per strategy and profile, each with its own noise and CFS phases, pooled into one rate.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Write simulate.json (one row per profile) here.",
)
@click.option(
    "--validate",
    "suite_dir",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="Instead: predict every strategy's ratio to equal on the REAL suite's profiles and compare it "
    "with that suite directory's suite.json (the validation table).",
)
@click.option(
    "--calibration",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="The machine's calibration file (default: the packaged one).",
)
def simulate(profiles, seed, strategies, updates, rounds, out_dir, suite_dir, calibration):
    """Run allocation strategies on simulated profiles: per-strategy geometric means of the ratio to the best
    other strategy of each profile, and the worst profiles."""
    from bno_hvd.common.atomic import write_json_atomic
    from bno_hvd.lab.sim.families import run_families, summary, timed
    from bno_hvd.lab.sim.machine import CALIBRATION, Machine
    from bno_hvd.lab.sim.realsuite import table, validate

    machine = Machine.load(calibration or CALIBRATION)
    if suite_dir is not None:
        click.echo(table(validate(suite_dir, machine)))
        return
    specs = [s.strip() for s in str(strategies).split(",") if s.strip()]
    check_simulate_flags(profiles, seed, updates, specs, rounds)
    many = f", {rounds} rounds each" if rounds > 1 else ""
    click.echo(f"simulating {profiles} random profiles, seed {seed}, strategies {','.join(specs)}{many}")
    rows, seconds = timed(run_families, machine, profiles, seed, specs, updates, rounds=rounds)
    click.echo(f"{'strategy':<28} {'geomean vs best peer':>21} {'>= 0.97x peer':>14} {'>= 0.97x fixed':>15}  worst")
    for name, s in summary(rows, specs).items():
        fixed = "-" if s["share_at_0.97_of_fixed"] is None else f"{s['share_at_0.97_of_fixed']:.1%}"
        worst = ", ".join(f"{p} {r:.2f}" for p, r in s["worst"])
        peer = f"{s['share_at_0.97_of_best_peer']:.1%}"
        click.echo(f"{name:<28} {s['geomean_vs_best_peer']:>21.3f} {peer:>14} {fixed:>15}  {worst}")
    click.echo(f"{profiles} profiles in {seconds:.0f} s (seed {seed}{many})")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        path = write_json_atomic(os.path.join(out_dir, "simulate.json"), rows)
        click.echo(f"wrote {path}")


COMMANDS = [simulate]
