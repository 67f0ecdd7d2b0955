"""``tierstore bench hits`` output: the bandwidth and latency views as terminal tables,
markdown, a JSON report and a PNG of hit rate against reads.

- bandwidth view: ``1 - (reads + unserved) / accesses``, gap to the MIN that
  bounds each model, share of the LRU -> MIN gap closed;
- latency view: resident (and landed) when the layer reads, under the stated
  lead-time model (``tierstore.sim.leadtime``), with reads against LRU's at the
  same pool; a model reading more than LRU is marked "not comparable" and gets
  no gap share.
"""

from __future__ import annotations

import sys
from pathlib import Path

CEILINGS = ("belady", "belady_skip", "unbounded")
BANDWIDTH_COLUMNS = (
    "policy",
    "slots",
    "bandwidth hit",
    "gap to MIN",
    "ceiling",
    "BW gap closed",
    "reads/tick",
    "unserved",
    "M acc/s",
)
LATENCY_COLUMNS = (
    "policy",
    "slots",
    "latency hit",
    "reads/tick",
    "reads vs LRU",
    "comparable",
    "latency gap closed",
    "prefetched",
    "prefetch hits",
    "wasted",
)


def _opt(v, fmt: str) -> str:
    return "" if v is None else format(v, fmt)


def comparable_text(r) -> str:
    if r.policy in CEILINGS:  # MIN bounds demand fill, not prefetch: the gap's scale here
        return {
            "belady": "MIN: the gap's scale",
            "belady_skip": "MIN that may skip",
            "unbounded": "no evictions",
        }[r.policy]
    if r.latency_comparable is None:
        return "no LRU run at this pool"
    return "yes" if r.latency_comparable else "NOT comparable: reads > LRU"


def bandwidth_rows(results) -> list[list[str]]:
    return [
        [
            r.policy,
            str(r.slots),
            f"{r.bandwidth_hit_rate:.3f}",
            _opt(r.gap_to_min, "+.3f"),
            r.ceiling or "",
            _opt(r.gap_closed, ".2f"),
            f"{r.reads_per_tick:.1f}",
            str(r.unserved),
            f"{r.accesses_per_s / 1e6:.3f}",
        ]
        for r in results
    ]


def latency_rows(results) -> list[list[str]]:
    return [
        [
            r.policy,
            str(r.slots),
            f"{r.latency_hit_rate:.3f}",
            f"{r.reads_per_tick:.1f}",
            _opt(r.reads_vs_lru, ".4f"),
            comparable_text(r),
            _opt(r.latency_gap_closed, ".2f"),
            str(r.prefetched),
            str(r.prefetch_hits),
            str(r.wasted_prefetch),
        ]
        for r in results
    ]


def print_views(results, trace, lead_text: str) -> None:
    """Both views as rich tables, the lead-time model stated under the second."""
    from rich.console import Console
    from rich.table import Table

    con = Console(width=None if sys.stdout.isatty() else 200)
    head = f"{trace.name}: {trace.n_keys} keys, {trace.n_ticks} ticks, {trace.n_rows} accesses"
    for title, cols, rows in (
        ("bandwidth view", BANDWIDTH_COLUMNS, bandwidth_rows(results)),
        ("latency view", LATENCY_COLUMNS, latency_rows(results)),
    ):
        table = Table(title=f"{head} -- {title}")
        for col in cols:
            table.add_column(col, justify="left" if col in ("policy", "ceiling", "comparable") else "right")
        for row in rows:
            table.add_row(*row)
        con.print(table)
    con.print(lead_text, soft_wrap=True)
    con.print(
        "latency gap closed = (latency hit - LRU's) / (MIN's - LRU's), only for "
        "models whose reads <= LRU's at the same pool (MIN bounds demand fill "
        "only: a prefetching model may pass 1)",
        soft_wrap=True,
    )


def markdown(results, trace, lead_text: str, meta: dict) -> str:
    out = [
        f"# Hit rates, both views: {trace.name}",
        "",
        f"{trace.n_keys} keys ({trace.n_layers} layers x {trace.n_experts} experts), "
        f"{trace.n_ticks} ticks, {trace.n_rows} accesses. Command: `{meta['command']}`; "
        f"machine: {meta['machine']}; {meta['date']}.",
        "",
        "## Latency view",
        "",
        f"{lead_text}.",
        "",
        "Latency gap closed = (latency hit - LRU's) / (MIN's - LRU's) at the same pool, "
        "only for models whose reads (demand + lazy + prefetch) are <= LRU's; others are "
        "marked NOT comparable. MIN bounds demand fill only, so a prefetching model "
        "may pass 1.",
        "",
    ]
    out += _md_table(LATENCY_COLUMNS, latency_rows(results))
    out += [
        "## Bandwidth view",
        "",
        "1 - (reads + unserved) / accesses; ceiling = the MIN "
        "that bounds the model (belady: forced admission; belady_skip: may skip a miss).",
        "",
    ]
    out += _md_table(BANDWIDTH_COLUMNS, bandwidth_rows(results))
    return "\n".join(out)


def _md_table(cols, rows) -> list[str]:
    left = ("policy", "ceiling", "comparable")
    return (
        ["| " + " | ".join(cols) + " |", "|" + "|".join("---" if c in left else "---:" for c in cols) + "|"]
        + ["| " + " | ".join(row) + " |" for row in rows]
        + [""]
    )


def plot_views(results, path: str, title: str = "", lead_text: str = "") -> None:
    """PNG, two panels: bandwidth-view hit rate vs pool size, and latency-view hit
    rate vs reads per tick (every read counted), one curve per model over the
    pools, dotted per pool over the read ratios of a prefetching model; points of
    models reading more than LRU are hollow (not comparable)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tierstore.files.atomic import write_atomic_with

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    for name in dict.fromkeys(r.policy for r in results):
        mine = sorted((r for r in results if r.policy == name), key=lambda r: r.slots)
        style = "--" if name in CEILINGS else "-"
        (line,) = ax.plot(
            [r.slots for r in mine], [r.bandwidth_hit_rate for r in mine], style, marker="o", label=name
        )
        pts = sorted(mine, key=lambda r: r.reads_per_tick)
        ax2.plot(
            [r.reads_per_tick for r in pts],
            [r.latency_hit_rate for r in pts],
            style,
            color=line.get_color(),
            label=name,
        )
        for r in pts:
            hollow = r.latency_comparable is False
            ax2.plot(
                [r.reads_per_tick],
                [r.latency_hit_rate],
                "o",
                color=line.get_color(),
                markerfacecolor="none" if hollow else line.get_color(),
            )
    colors = {line.get_label(): line.get_color() for line in ax.get_lines()}
    for (base, _slots), pts in _ratio_curves(results).items():
        ax2.plot(
            [r.reads_per_tick for r in pts],
            [r.latency_hit_rate for r in pts],
            ":",
            color=colors.get(base, "grey"),
            linewidth=1,
        )
    ax.set_xscale("log")
    ticks = sorted({r.slots for r in results})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("pool slots")
    ax.set_ylabel("bandwidth view: 1 - (reads + unserved) / accesses")
    ax2.set_xscale("log")
    ax2.set_xlabel("reads per tick (demand + lazy + prefetch); hollow: reads > LRU's")
    ax2.set_ylabel("latency view: resident (landed) when the layer reads")
    for a in (ax, ax2):
        a.set_ylim(0, 1)
        a.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax2.set_title(_wrap(lead_text, 90), fontsize=7)
    ax2.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    write_atomic_with(Path(path), lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def _ratio_curves(results) -> dict:
    """(model, slots) -> its results at every read ratio, by reads (the dotted
    hit-vs-reads curves of the prefetching models); only where 2+ ratios ran."""
    out: dict = {}
    for r in results:
        if r.read_ratio is not None:
            out.setdefault((r.policy.split("@")[0], r.slots), []).append(r)
    return {k: sorted(v, key=lambda r: r.reads_per_tick) for k, v in out.items() if len(v) > 1}


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))
