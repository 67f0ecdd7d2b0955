"""The demo's picture: pool hit rate over decode steps (cold vs warm start on the same
unseen routing) and the distribution of fire latencies, in one PNG."""

from __future__ import annotations

import numpy as np


def _smooth(values, window: int) -> np.ndarray:
    v = np.asarray(values, float)
    if v.size == 0 or window <= 1:
        return v
    kernel = np.ones(min(window, v.size)) / min(window, v.size)
    head = np.cumsum(v[: kernel.size - 1]) / np.arange(1, kernel.size)  # no ramp-in dip
    return np.concatenate([head, np.convolve(v, kernel, mode="valid")])


def write_demo_png(result: dict, path: str) -> None:
    """PNG at ``path`` (atomically: all of it or nothing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tierstore.files.atomic import write_atomic_with

    cold, warm = result["cold"], result["warm"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    window = max(1, len(cold["hit_rate_per_step"]) // 10)
    for run, label, style in ((cold, "cold start", "-"), (warm, "warm restart (poolmon)", "-")):
        steps = np.arange(1, len(run["hit_rate_per_step"]) + 1)
        ax1.plot(
            steps,
            _smooth(run["hit_rate_per_step"], window),
            style,
            label=f"{label}: {run['pool_hit_rate']:.1%} overall",
        )
    ax1.set_xlabel("decode step (routing the snapshot never saw)")
    ax1.set_ylabel(f"pool hit rate ({window}-step mean)")
    ax1.set_ylim(0, 1)
    ax1.grid(True, alpha=0.3)
    ax1.legend(fontsize=8, loc="lower right")
    ax1.set_title("pool hit rate over steps, cold vs warm", fontsize=10)

    runs = {label: run for run, label in ((result["learn"], "learning run"), (cold, "cold"), (warm, "warm"))}
    lat = {label: np.asarray(run["fire_latencies_ms"], float) for label, run in runs.items()}
    every = (
        np.concatenate([v for v in lat.values() if v.size])
        if any(v.size for v in lat.values())
        else np.zeros(0)
    )
    if every.size:
        lo, hi = max(every.min(), 1e-3), max(every.max(), 2e-3)
        bins = np.geomspace(lo, hi * 1.01, 30)
        for label, v in lat.items():
            if v.size:  # counted as the table counts them: store fires on the steps that fired
                ax2.hist(
                    v,
                    bins=bins,
                    alpha=0.55,
                    label=f"{label}: {v.size} store fires on {runs[label]['fires']} steps, "
                    f"p50 {np.median(v):.2f} ms",
                )
        ax2.set_xscale("log")
        ax2.legend(fontsize=8)
    else:
        ax2.text(0.5, 0.5, "no fires", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xlabel("fire latency (ms)")
    ax2.set_ylabel("store fires")
    ax2.grid(True, alpha=0.3)
    ax2.set_title(f"fire latency, rows of {result['row_bytes'] / 1024:.0f} KiB", fontsize=10)
    fig.suptitle(f"tierstore demo: {result['device']} pool, seed {result['config']['seed']}", fontsize=10)
    fig.tight_layout()
    try:
        write_atomic_with(path, lambda f: fig.savefig(f, format="png", dpi=110))
    finally:
        plt.close(fig)
