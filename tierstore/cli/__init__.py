"""The ``tierstore`` command.

This file only assembles sub-commands; each lives in a module of ``tierstore/cli/`` and
exposes ``register(subparsers)`` that adds its parser and sets ``func``.
Every user error becomes one line on stderr and exit status 1 (2 for usage),
never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from tierstore.errors import TierstoreError

# (group, module) pairs; a group with several modules gets one sub-parser each.
_GROUPS = {
    "pack": ("Build, inspect and verify pack files", ["pack"]),
    "warm": ("Inspect, merge and convert warm-start files", ["warm"]),
    "bench": ("Benchmarks: pool hits on traces, promote I/O", ["bench_hits", "bench_io"]),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tierstore", description=__doc__.splitlines()[0])
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    for group, (help_text, modules) in _GROUPS.items():
        gp = groups.add_parser(group, help=help_text, description=help_text)
        sub = gp.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
        for mod in modules:
            importlib.import_module(f"tierstore.cli.{mod}").register(sub)
    importlib.import_module("tierstore.cli.demo").register(groups)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except TierstoreError as exc:
        print(f"tierstore: error: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"tierstore: error: {exc.filename or exc}: no such file or directory", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tierstore: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `tierstore ... --json | head`: the reader left; not an error of ours.
        # Point stdout at devnull so the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
