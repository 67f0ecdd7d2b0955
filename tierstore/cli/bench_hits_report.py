"""``tierstore bench hits``: the latency-view options (lead-time model, read-ratio
sweep of the prefetching models) and the run that prints, plots and reports both
views (``tierstore.cli.bench_hits_views``)."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

from tierstore.cli.args import float_in, non_negative_int, output_file, positive_float, say
from tierstore.errors import ConfigError

DEFAULT_READ_RATIOS = (1.0,)
UNTIMED_MODELS = ("predict", "prefetch")  # their own prefetch: one layer, untimed


def ratio_list(text: str) -> list[float]:
    """Comma-separated read ratios >= 0 (prefetch budget: reads against LRU's)."""
    import argparse

    out = []
    for part in str(text).split(","):
        try:
            v = float(part)
        except ValueError:
            v = -1.0
        if not v >= 0 or v == float("inf"):
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers >= 0, found {part.strip()!r}")
        out.append(v)
    return list(dict.fromkeys(out))


def add_latency_args(p) -> None:
    g = p.add_argument_group("latency view (lead-time model, <policy>+prefetch models)")
    g.add_argument(
        "--lead",
        type=non_negative_int,
        default=1,
        help="layers between the read that issues a prefetch and its target (>= 1)",
    )
    g.add_argument(
        "--read-gbps",
        type=positive_float,
        default=None,
        help="measured read bandwidth, GB/s: a timed model (needs --row-bytes, "
        "--layer-us); default: untimed (a prefetch lands in time)",
    )
    g.add_argument(
        "--layer-us",
        type=positive_float,
        default=None,
        help="compute time of one layer's read group, microseconds (default: none; needed with --read-gbps)",
    )
    g.add_argument(
        "--read-latency-us",
        type=float_in(0.0, 1e9),
        default=0.0,
        help="time from a read leaving the queue to its row being usable",
    )
    g.add_argument(
        "--read-ratios",
        type=ratio_list,
        default=list(DEFAULT_READ_RATIOS),
        help="prefetch read budgets against LRU's reads, comma-separated; "
        "each ratio but 1 adds '<model>@<ratio>' rows (a hit-vs-reads curve)",
    )
    g.add_argument(
        "--report",
        type=output_file("report prefix"),
        default=None,
        help="write PREFIX.md, PREFIX.json and PREFIX.png (default: none)",
    )


def lead_time_of(args):
    from tierstore.sim.leadtime import LeadTime

    return LeadTime.measured(args.lead, args.row_bytes, args.read_gbps, args.layer_us, args.read_latency_us)


def _prefetch_names(names) -> list[str]:
    from tierstore.sim.runner import PREFETCH_SUFFIX

    return [n for n in names if n.endswith(PREFETCH_SUFFIX)]


def replay_views(trace, names, slots, *, params: dict, lead, ratios, **kw):
    """Every model once (prefetching ones at the first ratio), then the prefetching
    models at every further ratio (labelled ``<model>@<ratio>``); gaps compared
    across all. Returns the results (each prefetching one with ``read_ratio``)."""
    from tierstore import sim
    from tierstore.sim.runner import compare

    prep = sim.Prepared(trace)
    names = sim.expand_names(names)
    pf_names = _prefetch_names(names)
    if lead.timed:
        bad = [n for n in names if n in UNTIMED_MODELS]
        if bad:
            raise ConfigError(
                f"models {', '.join(bad)} have no timed lead-time model: use "
                f"<policy>+prefetch, or drop --read-gbps"
            )

    def with_ratio(r):
        return {**params, **{n: {**params.get(n, {}), "lead_time": lead, "read_ratio": r} for n in pf_names}}

    first = ratios[0] if 1.0 not in ratios else 1.0
    total = len(slots) * (len(names) + len(pf_names) * sum(r != first for r in ratios))
    done = [0]

    def progress_at(ratio):  # one stderr line per run: `--policies all` takes minutes
        def progress(r):
            done[0] += 1
            label = r.policy if ratio is None else f"{r.policy}@{ratio:g}"
            say(f"[bench hits] {done[0]}/{total} {label} at {r.slots} slots: {r.seconds:.2f} s")

        return progress

    results = sim.replay(
        prep, names, slots, policy_params=with_ratio(first), progress=progress_at(None), **kw
    )
    for r in results:
        r.read_ratio = first if r.policy in pf_names else None
    for ratio in ratios:
        if ratio == first or not pf_names:
            continue
        for r in sim.replay(
            prep, pf_names, slots, policy_params=with_ratio(ratio), progress=progress_at(ratio), **kw
        ):
            r.policy = f"{r.policy}@{ratio:g}"
            r.read_ratio = ratio
            results.append(r)
    compare(results)
    return results


def run_views(args, trace, params: dict) -> None:
    from tierstore.cli import bench_hits_views as views

    lead = lead_time_of(args)
    t0 = time.perf_counter()
    results = replay_views(
        trace,
        args.policies,
        args.slots,
        params=params,
        lead=lead,
        ratios=args.read_ratios,
        budget=args.budget,
        row_bytes=args.row_bytes,
        ticks_per_second=args.ticks_per_second,
        granularity=args.granularity,
    )
    title = f"{trace.name}: {trace.n_layers} layers x {trace.n_experts} experts, {trace.n_ticks} ticks"
    text = lead.describe()
    if args.plot:
        views.plot_views(results, args.plot, title=title, lead_text=text)
    if args.report:
        meta = {
            "command": "tierstore " + " ".join(sys.argv[1:]) if sys.argv[1:] else "",
            "machine": f"{platform.node()} {platform.platform()}, {_cpus()} CPUs",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "python": sys.version.split()[0],
            "seconds": time.perf_counter() - t0,
        }
        write_report(Path(args.report), results, trace, lead, meta, title)
    if args.json:
        json.dump([r.as_dict() for r in results], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        views.print_views(results, trace, text)


def write_report(prefix: Path, results, trace, lead, meta: dict, title: str) -> None:
    from tierstore.cli import bench_hits_views as views
    from tierstore.files.atomic import write_atomic_with

    body = json.dumps(
        {
            **meta,
            "trace": trace.name,
            "n_keys": trace.n_keys,
            "ticks": trace.n_ticks,
            "accesses": int(trace.n_rows),
            "lead_time": lead.as_dict(),
            "results": [r.as_dict() for r in results],
        },
        indent=1,
    )
    md = views.markdown(results, trace, lead.describe(), meta)
    base = str(prefix)
    write_atomic_with(Path(base + ".json"), lambda f: f.write(body.encode()))
    write_atomic_with(Path(base + ".md"), lambda f: f.write(md.encode()))
    views.plot_views(results, base + ".png", title=title, lead_text=lead.describe())


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
