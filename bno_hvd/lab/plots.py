"""PNG figures (matplotlib, Agg backend: no display needed), written atomically."""

from __future__ import annotations

from bno_hvd.common.atomic import atomic_write


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str) -> None:
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=110), binary=True)


def _finish(fig, ax, path: str, *, xlabel: str | None, ylabel: str, title: str, grid: str = "both") -> None:
    """Labels, grid, legend, layout, atomic save, close: the tail every figure shares."""
    if xlabel:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(axis=grid, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    _pyplot().close(fig)


def plot_update_times(series: dict[str, list], path: str, *, title: str, markers=(), smooth: int = 10) -> None:
    """Weight-update time per update (``UpdateRecord`` lists), one line per strategy (moving average
    over ``smooth``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for name, records in series.items():
        t = [r.weight_update_time * 1e3 for r in records]
        k = max(1, min(smooth, len(t)))
        avg = [sum(t[max(0, i - k + 1) : i + 1]) / len(t[max(0, i - k + 1) : i + 1]) for i in range(len(t))]
        ax.plot([r.update for r in records], avg, label=name, linewidth=1.4)
    for m in markers:
        ax.axvline(m, color="grey", linestyle="--", linewidth=0.8)
    _finish(fig, ax, path, xlabel="update", ylabel=f"weight-update time (ms, moving avg of {smooth})", title=title)


def plot_block_averages(series: dict[str, list], path: str, *, title: str, every: int) -> None:
    """Paper Figures 3-6: mean weight-update time per block of ``every`` updates, one line per
    strategy. ``series`` maps strategy -> list of :class:`bno_hvd.lab.averages.BlockAverage`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for name, blocks in series.items():
        ax.plot(
            [b.block for b in blocks],
            [b.mean_weight_update_time for b in blocks],
            marker="o",
            markersize=3.5,
            linewidth=1.4,
            label=name,
        )
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    _finish(
        fig,
        ax,
        path,
        xlabel=f"weight updates (x{every})",
        ylabel=f"average weight-update time (s, per {every} updates)",
        title=title,
    )


def plot_summary_bars(means: dict[str, dict[str, float]], path: str, *, title: str) -> None:
    """Paper Figure 7: overall mean weight-update time per model (groups) and strategy (bars).
    ``means`` maps model -> {strategy: seconds}."""
    plt = _pyplot()
    models = list(means)
    strategies = list(dict.fromkeys(s for m in models for s in means[m]))
    width = 0.8 / max(1, len(strategies))
    fig, ax = plt.subplots(figsize=(max(6, 1.9 * len(models) + 2), 4.6))
    for k, strategy in enumerate(strategies):
        xs = [i + (k - (len(strategies) - 1) / 2) * width for i in range(len(models))]
        ys = [means[m].get(strategy) for m in models]
        ys = [float("nan") if y is None else y for y in ys]
        bars = ax.bar(xs, ys, width, label=strategy)
        ax.bar_label(bars, labels=[f"{y:.3g}" if y == y else "" for y in ys], fontsize=7, padding=1)
        for x, y in zip(xs, ys):
            if y != y:  # no run (failed, or not part of the experiment)
                ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(models)), models)
    _finish(fig, ax, path, xlabel=None, ylabel="average weight-update time (s)", title=title, grid="y")


def plot_accuracy(series: dict[str, list[dict]], path: str, *, title: str, target: float | None = None) -> None:
    """Test accuracy over training seconds, one line per strategy (``series``: strategy -> evals)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    for name, evals in series.items():
        ax.plot(
            [e["time"] for e in evals],
            [100 * e["accuracy"] for e in evals],
            marker="o",
            markersize=3,
            linewidth=1.4,
            label=name,
        )
    if target is not None:
        ax.axhline(100 * target, color="grey", linestyle="--", linewidth=0.8, label=f"target {100 * target:g}%")
    _finish(
        fig, ax, path, xlabel="training wall time (s, evaluation excluded)", ylabel="test accuracy (%)", title=title
    )


def plot_stragglers(rank_steps: list, path: str, *, title: str, max_columns: int = 400) -> None:
    """One row per rank, one column per update: the rank's compute, the time it waited for the
    last rank to arrive, and the exchange after that arrival (every rank's alike), stacked, so a
    column is the whole update as that rank saw it (:mod:`bno_hvd.training.stragglers` defines each part).
    Above ``max_columns`` updates, each column is the mean of a block of updates (never smoothed
    across the edges). ``rank_steps``: every rank's ``RankStep`` list."""
    from bno_hvd.training.stragglers import block_means, straggler_timeline

    timeline = straggler_timeline(rank_steps)
    n = timeline.updates
    block = max(1, -(-n // max_columns))
    parts = [
        (block_means(timeline.compute, block), "compute", "tab:blue"),
        (block_means(timeline.waited, block), "waited for the last rank", "tab:orange"),
        (block_means(timeline.exchange[None, :].repeat(timeline.ranks, axis=0), block), "exchange", "0.75"),
    ]
    if not timeline.has_sync:
        parts = parts[:1]
    edges = [min(k * block, n) for k in range(parts[0][0].shape[1] + 1)]
    top = 1e3 * float(max(1e-9, sum(p[0] for p in parts).max(initial=0.0)))
    plt = _pyplot()
    fig, axes = plt.subplots(timeline.ranks, 1, figsize=(9, 1.9 + 1.25 * timeline.ranks), sharex=True, squeeze=False)
    last, waited = timeline.last_share(), timeline.mean_waited()
    for r, ax in enumerate(axes[:, 0]):
        base = 0.0
        for values, name, color in parts:
            ax.stairs(1e3 * (base + values[r]), edges, baseline=1e3 * base, fill=True, color=color, label=name)
            base = base + values[r]
        ax.set_ylim(0, top * 1.05)
        ax.set_xlim(0, max(1, n))
        ax.set_ylabel("ms", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(axis="y", alpha=0.3)
        stats = (
            f": arrived last in {100 * last[r]:.0f}% of the updates, waited {1e3 * waited[r]:.1f} ms per update"
            if timeline.has_sync and n
            else ""
        )
        ax.set_title(f"rank {r}{stats}", loc="left", fontsize=8)
    fig.suptitle(title, fontsize=9)
    axes[-1, 0].set_xlabel("update" if block == 1 else f"update (each column: mean of {block} updates)", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.03), ncol=3, fontsize=8, frameon=False)
    note = (
        "waited = this rank's allreduce (+ rebalance) time minus the shortest one of that update, the one of the rank "
        "that arrived last;\nexchange = that shortest time. Each rank times itself: ranks on different hosts need no "
        "common clock."
        if timeline.has_sync
        else "this log has no sync times (written by an older version): waiting cannot be shown"
    )
    fig.text(0.5, 0.005, note, fontsize=7, color="0.3", ha="center", va="bottom")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    _save(fig, path)
    plt.close(fig)


def plot_time_to_accuracy(runs: dict[str, list[dict]], summary: dict[str, dict], path: str, *, title: str) -> None:
    """Time to target per strategy (``bno-hvd time-to-accuracy``): every run a point (hollow where
    the mean left it out, a red cross above the rest where it never reached the target), the mean
    without the fastest and the slowest run a black bar."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(runs) + 2), 4.6))
    reached = [r["time_to_target_s"] for rs in runs.values() for r in rs if r["time_to_target_s"] is not None]
    ceiling = 1.08 * max(reached, default=1.0)  # where runs that never reached the target are drawn
    labels = {"in": "a run", "out": "a run left out", "missed": "not reached", "mean": "mean without fastest, slowest"}
    for x, (name, rs) in enumerate(runs.items()):
        left_out = summary[name]["left_out"]
        for k, r in enumerate(rs):
            at = x + 0.25 * (k / max(1, len(rs) - 1) - 0.5)  # spread in round order
            if r["time_to_target_s"] is None:
                ax.scatter([at], [ceiling], marker="x", color="C3", label=labels.pop("missed", None))
            elif k in left_out:
                ax.scatter(
                    [at],
                    [r["time_to_target_s"]],
                    s=22,
                    facecolors="none",
                    edgecolors="C0",
                    label=labels.pop("out", None),
                )
            else:
                ax.scatter([at], [r["time_to_target_s"]], s=22, color="C0", label=labels.pop("in", None))
        if summary[name]["mlperf_mean_s"] is not None:
            ax.hlines(summary[name]["mlperf_mean_s"], x - 0.3, x + 0.3, color="k", lw=2, label=labels.pop("mean", None))
    ax.set_xticks(range(len(runs)), list(runs))
    ax.set_ylim(0, 1.06 * ceiling)  # the crosses of runs that missed stay inside
    _finish(fig, ax, path, xlabel=None, ylabel="training seconds to the target", title=title, grid="y")
