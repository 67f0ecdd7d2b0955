"""``tierstore bench hits``: pool hit rates of policies on a routing trace.

Replays a capture-format trace (``--trace T.npy``) or the seeded DS4-shaped
synthetic one (``--synthetic``) through ``tierstore.sim`` at every pool size
in ``--slots`` and prints a table (or ``--json``: a list of result objects).
Belady's MIN and the gap to it are shown whenever ``belady`` is in the list.
"""
from __future__ import annotations

import json
import sys

from tierstore.cli.args import int_list

DEFAULT_POLICIES = "lru,heat,hybrid,reference,belady"


def register(sub) -> None:
    p = sub.add_parser("hits", help="Pool hit rate of policies on a routing trace",
                       description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="int32 .npy rows [tick, layer, expert]")
    src.add_argument("--synthetic", action="store_true",
                     help="generate the DS4-shaped synthetic trace (see --ticks, --seed ...)")
    p.add_argument("--slots", default="51,102,205", help="pool sizes, comma-separated")
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help="comma-separated: lru, heat, hybrid, reference, belady, unbounded, predict, prefetch")
    p.add_argument("--budget", type=int, default=8, help="predict/prefetch: prefetch rows per tick")
    p.add_argument("--threshold", type=float, default=0.2,
                   help="predict: minimum predicted probability to prefetch")
    p.add_argument("--granularity", choices=["layer", "tick"], default="layer",
                   help="layer: each layer reads the slot table in turn (default); "
                        "tick: the whole step is known and pinned (a fire)")
    p.add_argument("--ticks-per-second", type=float, default=75.0,
                   help="reference: ticks per second for its 5 s half-life")
    p.add_argument("--half-life", type=float, default=None,
                   help="heat/hybrid half-life in ticks (default 375)")
    p.add_argument("--row-bytes", type=int, default=0, help="bytes per row, for bytes_read")
    p.add_argument("--split", choices=["all", "first", "second"], default="all",
                   help="replay only the first or second half of the trace's ticks")
    g = p.add_argument_group("synthetic trace")
    g.add_argument("--ticks", type=int, default=2048)
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--layers", type=int, default=43)
    g.add_argument("--experts", type=int, default=256)
    g.add_argument("--top-k", type=int, default=6)
    g.add_argument("--prefill-tokens", type=int, default=512)
    g.add_argument("--prefill-every", type=int, default=1024)
    p.add_argument("--json", action="store_true", help="print a JSON list of results")
    p.add_argument("--plot", help="write a PNG of hit rate vs pool size per policy")
    p.set_defaults(func=main)


def load_source(args):
    from tierstore.sim import synth, traces
    if args.trace:
        trace = traces.load_trace(args.trace)
    else:
        trace = synth.synthetic_trace(args.ticks, batch=args.batch, seed=args.seed,
                                       n_layers=args.layers, n_experts=args.experts,
                                       top_k=args.top_k, prefill_tokens=args.prefill_tokens,
                                       prefill_every=args.prefill_every)
    if args.split != "all":
        trace = trace.split(0.5)[0 if args.split == "first" else 1]
    return trace


def main(args) -> int:
    from tierstore import sim
    slots = int_list(args.slots, "slots")
    names = [x.strip() for x in args.policies.split(",") if x.strip()]
    sim.check_policy_names(names)  # before a possibly slow trace generation
    trace = load_source(args)
    params = {"predict": {"threshold": args.threshold}}
    if args.half_life is not None:
        for name in ("heat", "hybrid"):
            params[name] = {"half_life": args.half_life}
        params["predict"]["half_life"] = args.half_life
    results = sim.replay(trace, names, slots, budget=args.budget, row_bytes=args.row_bytes,
                         ticks_per_second=args.ticks_per_second,
                         granularity=args.granularity, policy_params=params)
    if args.plot:
        plot_hits(results, args.plot, title=f"{trace.name}: {trace.n_layers} layers x "
                  f"{trace.n_experts} experts, {trace.n_ticks} ticks")
    if args.json:
        json.dump([r.as_dict() for r in results], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print_table(results, trace)
    return 0


def print_table(results, trace) -> None:
    from rich.console import Console
    from rich.table import Table
    table = Table(title=f"{trace.name}: {trace.n_keys} keys, {trace.n_ticks} ticks, "
                        f"{trace.n_rows} accesses")
    for col in ("policy", "slots", "hit rate", "distinct", "gap to MIN", "reads/tick",
                "prefetched", "wasted", "M acc/s"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        gap = "" if r.gap_to_min is None else f"{r.gap_to_min:+.3f}"
        table.add_row(r.policy, str(r.slots), f"{r.hit_rate:.3f}", f"{r.distinct_hit_rate:.3f}",
                      gap, f"{r.reads_per_tick:.1f}", str(r.prefetched), str(r.wasted_prefetch),
                      f"{r.accesses_per_s / 1e6:.2f}")
    Console(width=None if sys.stdout.isatty() else 120).print(table)


def plot_hits(results, path: str, title: str = "") -> None:
    """PNG: token-weighted hit rate vs pool size, one line per policy."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tierstore.files.atomic import write_atomic_with
    from pathlib import Path
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in dict.fromkeys(r.policy for r in results):
        pts = sorted((r.slots, r.hit_rate) for r in results if r.policy == name)
        style = "--" if name in ("belady", "unbounded") else "-"
        ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=name)
    ax.set_xscale("log")
    ticks = sorted({r.slots for r in results})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("pool slots")
    ax.set_ylabel("hit rate (token-weighted)")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic_with(Path(path), lambda f: fig.savefig(f, format="png", dpi=120))
    plt.close(fig)
