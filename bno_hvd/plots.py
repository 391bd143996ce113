"""PNG figures (matplotlib, Agg backend: no display needed), written atomically."""

from __future__ import annotations

from .atomic import atomic_write


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
    strategy. ``series`` maps strategy -> list of :class:`bno_hvd.experiment.BlockAverage`."""
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


def plot_stragglers(rank_steps: list, path: str, *, title: str, smooth: int = 5) -> None:
    """One row per rank, over updates: its compute time and the time it waited for the others
    (its sync time minus the shortest sync of that update, which is the allreduce itself: the
    last rank to arrive waits least). ``rank_steps``: every rank's ``RankStep`` list."""
    import numpy as np

    plt = _pyplot()
    n = min(len(s) for s in rank_steps)
    compute = np.array([[s.compute for s in steps[:n]] for steps in rank_steps]) * 1e3
    sync = np.array([[s.sync for s in steps[:n]] for steps in rank_steps]) * 1e3
    waited = sync - sync.min(axis=0)
    k = max(1, min(smooth, n))
    kernel = np.ones(k) / k
    updates = np.arange(n)
    fig, axes = plt.subplots(len(rank_steps), 1, figsize=(9, 1.2 + 1.15 * len(rank_steps)), sharex=True, squeeze=False)
    top = float(max(1e-9, (compute + waited).max()))
    for r, ax in enumerate(axes[:, 0]):
        c = np.convolve(compute[r], kernel, mode="same")
        w = np.convolve(waited[r], kernel, mode="same")
        ax.fill_between(updates, 0, c, color="tab:blue", linewidth=0, label="compute")
        ax.fill_between(updates, c, c + w, color="tab:orange", linewidth=0, label="waiting for others")
        ax.set_ylim(0, top * 1.05)
        ax.set_ylabel(f"rank {r}\nms", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=7, loc="upper right", ncol=2)
    axes[0, 0].set_title(title, fontsize=9)
    axes[-1, 0].set_xlabel(f"update (moving average of {k})")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
