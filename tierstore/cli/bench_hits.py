"""``tierstore bench hits``: pool hit rates of policies on a routing trace.

Replays a capture-format trace (``--trace T.npy``) or the seeded DS4-shaped
synthetic one (``--synthetic``) through ``tierstore.sim`` at every pool size
in ``--slots`` and prints a table (or ``--json``: a list of result objects).
Both views are printed (a pool saves reads, and it has a row ready when its layer
reads; the two rank policies differently): bandwidth (every read and unserved miss
counted) with the gap to the MIN that bounds each policy (``belady``, or
``belady_skip`` for policies that may skip a miss; blank when that ceiling did
not run) and the share of the LRU -> MIN gap closed; latency (resident when the
layer reads, under the lead-time model stated with the table: ``--lead``, and
``--read-gbps``/``--layer-us`` for a timed one), compared with LRU only at no
more reads (others marked not comparable). ``<policy>+prefetch`` models take
``--read-ratios`` (their read budget against LRU's) for hit-vs-reads curves.
``--report PREFIX`` writes ``<PREFIX>.md``, ``<PREFIX>.json`` and ``<PREFIX>.png``. ``--policies
all`` runs every registered policy and simulator model.
"""

from __future__ import annotations

import argparse

from tierstore.cli.args import (
    existing_file,
    float_in,
    int_in,
    int_list_of,
    non_negative_int,
    output_file,
    positive_float,
    positive_int,
)
from tierstore.cli.bench_hits_report import add_latency_args, run_views
from tierstore.errors import ConfigError

DEFAULT_POLICIES = "lru,heat,hybrid,reference,belady"


def register(sub) -> None:
    p = sub.add_parser(
        "hits", help="Pool hit rate of policies on a routing trace", description=__doc__.splitlines()[0]
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", type=trace_file, help="int32 .npy rows [tick, layer, expert]")
    src.add_argument(
        "--synthetic",
        action="store_true",
        help="generate the DS4-shaped synthetic trace (see --ticks, --seed ...)",
    )
    p.add_argument(
        "--slots",
        default=[51, 102, 205],
        type=int_list_of(1),
        help="pool sizes, comma-separated (default: 51,102,205)",
    )
    from tierstore import sim  # the registry names the choices, so help never goes stale
    from tierstore.sim.runner import PREFETCH_SUFFIX

    p.add_argument(
        "--policies",
        default=policy_list(DEFAULT_POLICIES),
        type=policy_list,
        help=f"comma-separated: {', '.join(sim.available_models())}, "
        f"<policy>{PREFETCH_SUFFIX} for any policy, or all "
        f"(default: {DEFAULT_POLICIES})",
    )
    p.add_argument(
        "--budget", type=non_negative_int, default=8, help="predict/prefetch: prefetch rows per tick"
    )
    p.add_argument(
        "--threshold",
        type=float_in(0.0, 1.0),
        default=0.2,
        help="predict: minimum predicted probability to prefetch",
    )
    p.add_argument(
        "--granularity",
        choices=["layer", "tick"],
        default="layer",
        help="layer: each layer reads the slot table in turn; "
        "tick: the whole step is known and pinned (a fire)",
    )
    p.add_argument(
        "--ticks-per-second",
        type=positive_float,
        default=75.0,
        help="reference: ticks per second for its 5 s half-life",
    )
    p.add_argument(
        "--half-life",
        type=positive_float,
        default=None,
        help="heat/hybrid half-life in ticks (default: 256, the store's)",
    )
    p.add_argument("--row-bytes", type=non_negative_int, default=0, help="bytes per row, for bytes_read")
    p.add_argument(
        "--split",
        choices=["all", "first", "second"],
        default="all",
        help="replay only the first or second half of the trace's ticks",
    )
    g = p.add_argument_group("synthetic trace")
    g.add_argument("--ticks", type=int_in(1, 1 << 24), default=2048, help="decode ticks")
    g.add_argument("--batch", type=int_in(1, 4096), default=1, help="sequences per tick")
    g.add_argument("--seed", type=non_negative_int, default=0, help="router seed")
    g.add_argument("--layers", type=int_in(1, 4096), default=43, help="MoE layers")
    g.add_argument("--experts", type=int_in(1, 1 << 16), default=256, help="experts per layer")
    g.add_argument("--top-k", type=positive_int, default=6, help="experts routed per token")
    g.add_argument(
        "--prefill-tokens", type=non_negative_int, default=512, help="tokens of each prefill burst"
    )
    g.add_argument("--prefill-every", type=positive_int, default=1024, help="ticks between prefill bursts")
    p.add_argument("--json", action="store_true", help="print a JSON list of results")
    p.add_argument(
        "--plot",
        type=output_file("PNG file"),
        help="write a PNG: bandwidth view vs pool size, latency view vs reads (default: none)",
    )
    add_latency_args(p)
    p.set_defaults(func=main)


def policy_list(text: str) -> list[str]:
    """Comma-separated policy / sim model names: at least one, every one known."""
    from tierstore import sim

    names = list(dict.fromkeys(x.strip().lower() for x in str(text).split(",") if x.strip()))
    if not names:
        raise argparse.ArgumentTypeError(f"expected one or more policy names, found {text!r}")
    problem = sim.check_policy_names(names, raise_=False)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return names


NPY_MAGIC = b"\x93NUMPY"


def trace_file(text: str) -> str:
    """A regular, non-empty file that starts like a .npy array."""
    path = existing_file("trace file")(text)
    with open(path, "rb") as f:
        head = f.read(len(NPY_MAGIC))
    if not head:
        raise argparse.ArgumentTypeError(f"{path}: empty file, expected a .npy routing trace")
    if head != NPY_MAGIC:
        raise argparse.ArgumentTypeError(
            f"{path}: not a .npy file (no NUMPY header), expected a routing trace saved with numpy.save"
        )
    return path


# What a replay holds per trace row, with margin: `bench hits --policies all` grew by ~53 B
# per row from 264 k to 1.58 M rows (synthetic DS4, 2026-12-05); plus the trace itself.
REPLAY_BYTES_PER_ROW = 96


def _check_args(args) -> None:
    """Refuse, before generating anything, a synthetic trace that cannot be replayed."""
    if not args.synthetic:
        return
    from tierstore.sim import synth, traces

    if args.top_k > args.experts:
        raise ConfigError(f"--top-k {args.top_k}: more than --experts {args.experts}")
    if args.layers * args.experts > traces.MAX_KEYS:
        raise ConfigError(
            f"--layers {args.layers} x --experts {args.experts} = "
            f"{args.layers * args.experts:,} keys, more than the "
            f"{traces.MAX_KEYS:,} a replay keeps state for"
        )
    rows = synth.synthetic_rows(
        args.ticks,
        batch=args.batch,
        prefill_tokens=args.prefill_tokens,
        prefill_every=args.prefill_every,
        n_layers=args.layers,
        top_k=args.top_k,
    )
    traces.check_fits_memory(
        rows * REPLAY_BYTES_PER_ROW,
        f"--ticks {args.ticks} --batch {args.batch} --prefill-tokens "
        f"{args.prefill_tokens} --layers {args.layers} --top-k {args.top_k}: "
        f"{rows:,} trace rows to replay",
    )


def load_source(args):
    from tierstore.sim import synth, traces

    if args.trace:
        trace = traces.load_trace(args.trace)
    else:
        trace = synth.synthetic_trace(
            args.ticks,
            batch=args.batch,
            seed=args.seed,
            n_layers=args.layers,
            n_experts=args.experts,
            top_k=args.top_k,
            prefill_tokens=args.prefill_tokens,
            prefill_every=args.prefill_every,
        )
    if args.split != "all":
        trace = trace.split(0.5)[0 if args.split == "first" else 1]
    return trace


def main(args) -> int:
    _check_args(args)
    trace = load_source(args)
    if trace.n_rows == 0:
        raise ConfigError(f"{args.trace or 'synthetic trace'}: no routed rows to replay")
    if args.trace:
        from tierstore.sim.traces import check_fits_memory

        check_fits_memory(
            trace.n_rows * REPLAY_BYTES_PER_ROW, f"{args.trace}: {trace.n_rows:,} rows to replay"
        )
    params = {"predict": {"threshold": args.threshold}}
    if args.half_life is not None:
        for name in ("heat", "hybrid"):
            params[name] = {"half_life": args.half_life}
        params["predict"]["half_life"] = args.half_life
    run_views(args, trace, params)
    return 0
