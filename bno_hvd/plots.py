"""PNG figures (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

import os


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def plot_update_times(series: dict[str, list[dict]], path: str, *, title: str, markers=(), smooth: int = 10) -> None:
    """Weight-update time per update, one line per strategy (moving average over ``smooth``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    for name, records in series.items():
        t = [r["weight_update_time"] * 1e3 for r in records]
        k = max(1, min(smooth, len(t)))
        avg = [sum(t[max(0, i - k + 1):i + 1]) / len(t[max(0, i - k + 1):i + 1]) for i in range(len(t))]
        ax.plot([r["update"] for r in records], avg, label=name, linewidth=1.4)
    for m in markers:
        ax.axvline(m, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("update")
    ax.set_ylabel(f"weight-update time (ms, moving avg of {smooth})")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
