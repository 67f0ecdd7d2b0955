"""`tierstore demo`: the main job, end to end, on a small generated model."""
from __future__ import annotations


def register(groups) -> None:
    p = groups.add_parser("demo", help="the main job, end to end, on a small generated model",
                          description="Generate a small quantised MoE model, serve a decode loop "
                                      "from an ExpertStore with the uncertainty gate, restart "
                                      "warm-started, and print a summary.")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="pool device (default: cuda when present, else the CPU pool)")
    p.add_argument("--out", help="directory for the packs and the poolmon snapshot (default: a temp dir)")
    p.add_argument("--steps", type=int, default=None, help="decode steps of the cold run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="fewer steps (CI)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from tierstore.cli.demo_run import main
    return main(args)
