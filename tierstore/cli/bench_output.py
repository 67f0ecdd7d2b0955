"""How a `tierstore bench` subcommand ends: run it filling a result dict, write the JSON
atomically (``--out``, also the partial result of a run cut short, marked incomplete), the
PNG (``--png``), and print the JSON (``--json``) or the text report."""

from __future__ import annotations

import json

from tierstore.files.atomic import write_atomic


def _write(path, res: dict) -> None:
    write_atomic(path, json.dumps(res, indent=1, default=str).encode())


def run_and_report(args, run, report, plot) -> dict:
    """``run(args, res)`` fills ``res``; returns it after the outputs are written."""
    res: dict = {}
    try:
        run(args, res)
    except BaseException:
        if args.out and res:
            res["incomplete"] = True
            _write(args.out, res)
        raise
    if args.out:
        _write(args.out, res)
    if args.png:
        plot(res, args.png)
    print(json.dumps(res, indent=1, default=str) if args.json else report(res))
    return res
