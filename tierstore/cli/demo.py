"""`tierstore demo`: the main job, end to end, on a small generated model.

Where things go: with ``--out DIR`` the packs, the poolmon snapshot and the PNG stay
in DIR. Without it they go to a temp directory that is removed at the end (also on
an error, Ctrl-C or SIGTERM) unless ``--keep`` is given; the PNG then goes to
``--plot`` (default ``./tierstore-demo.png``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

from tierstore.cli.args import check_cuda, int_in, non_negative_int, output_dir, output_file

DEFAULT_PLOT = "tierstore-demo.png"


def register(groups) -> None:
    p = groups.add_parser(
        "demo",
        help="the main job, end to end, on a small generated model",
        description="Generate a small quantised MoE model, serve a decode loop "
        "from an ExpertStore with the uncertainty gate, save a "
        "poolmon snapshot, then compare a cold start with a warm "
        "restart on routing the snapshot never saw (another seed "
        "of the same router). Prints a summary and writes a PNG "
        "(hit rate over steps, fire latency distribution). "
        "Deterministic for a seed (timings aside).",
    )
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="pool device; auto = cuda when present, else the CPU pool",
    )
    p.add_argument(
        "--out",
        type=output_dir("demo directory"),
        default=None,
        help="directory for the packs, poolmon snapshot and PNG, kept "
        "(default: a temp directory, removed at the end)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temp directory (its path is printed)")
    picture = p.add_mutually_exclusive_group()  # both: which one did the user mean?
    picture.add_argument(
        "--plot",
        type=output_file("PNG file"),
        default=None,
        help=f"where to write the PNG (default: OUT/demo.png with --out or --keep, else ./{DEFAULT_PLOT})",
    )
    picture.add_argument("--no-plot", action="store_true", help="write no PNG")
    p.add_argument(
        "--steps",
        type=int_in(1, 100_000),
        default=None,
        help="decode steps of the learning run (default: 200, 80 with --quick)",
    )
    p.add_argument(
        "--warm-steps",
        type=int_in(1, 100_000),
        default=None,
        help="steps of the cold and warm runs on unseen routing (default: 50, 30 with --quick)",
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="seed of the model, the router and the learning run's routing",
    )
    p.add_argument(
        "--warm-seed",
        type=non_negative_int,
        default=None,
        help="routing seed of the cold/warm comparison (default: SEED + 1)",
    )
    p.add_argument(
        "--rows",
        choices=["auto", "small", "large"],
        default="auto",
        help="row size: small 13 KiB, large ~200 KiB (promote GB/s means bandwidth); auto = large on a GPU",
    )
    p.add_argument("--quick", action="store_true", help="fewer steps (CI)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=main)


def _config(args):
    from tierstore import cuda_available
    from tierstore.cli.demo_run import DemoConfig

    cfg = DemoConfig(seed=args.seed, warm_seed=args.warm_seed, device=args.device)
    if args.quick:
        cfg.steps, cfg.warm_steps = 80, 30
    if args.steps is not None:
        cfg.steps = args.steps
    if args.warm_steps is not None:
        cfg.warm_steps = args.warm_steps
    gpu = args.device == "cuda" or (args.device == "auto" and cuda_available())
    if args.rows == "large" or (args.rows == "auto" and gpu):
        cfg.large()
    return cfg


def main(args) -> int:
    from tierstore.cli.demo_run import print_summary, run

    if args.device == "cuda":
        check_cuda("--device")
    cfg = _config(args)
    made = args.out is None
    out_dir = tempfile.mkdtemp(prefix="tierstore-demo-") if made else args.out
    keep = not made or args.keep
    plot = (
        None if args.no_plot else (args.plot or (os.path.join(out_dir, "demo.png") if keep else DEFAULT_PLOT))
    )
    try:
        os.makedirs(out_dir, exist_ok=True)
        cfg.out = out_dir
        result = run(cfg, out_dir)
        if plot:
            from tierstore.cli.demo_plot import write_demo_png

            write_demo_png(result, plot)
        result["plot"] = plot
        result["kept"] = out_dir if keep else None
        if args.json:
            json.dump(result, sys.stdout, indent=2, default=str)
            print()
        else:
            print_summary(result)
            if plot:
                print(f"picture (hit rate over steps, fire latencies): {plot}")
            print(
                f"packs and poolmon snapshot in {out_dir}"
                if keep
                else "temp directory removed (give --out DIR or --keep to keep the packs)"
            )
    finally:
        if not keep:
            shutil.rmtree(out_dir, ignore_errors=True)
    return 0
