"""The ``tierstore`` command.

This file only assembles sub-commands; each lives in a module of ``tierstore/cli/`` and
exposes ``register(subparsers)`` that adds its parser and sets ``func``.
Every user error becomes one line on stderr and exit status 1 (2 for usage: the
parser refuses bad values before any work), never a traceback. SIGTERM is turned
into the same clean path as Ctrl-C (KeyboardInterrupt), so the atomic writers
remove their temp files either way; the exit status is 128 + the signal.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import warnings

from tierstore.cli.args import Parser, RawHelpFormatter
from tierstore.errors import TierstoreError, one_line

DESCRIPTION = """\
tierstore keeps the expert weights of a mixture-of-experts model in three tiers: a
slot pool in GPU memory, a pinned host-RAM arena and an on-disk pack, and promotes
the experts a decode step routes to. This command builds and checks packs, works
on warm-start files, benchmarks policies and I/O, and runs an end-to-end demo.

Runtime knobs are TIERSTORE_* environment variables (docs/SETTINGS.md); they are
checked when the command starts.
"""

EPILOG = """\
examples:
  tierstore demo --quick                          end to end on a small generated model
  tierstore pack build --synthetic 4,16,65536 out/
  tierstore pack verify out/
  tierstore bench hits --synthetic --slots 51,102,205
  tierstore plan --config config.json --card-gb 95.59 --context 32768 --trace routing.npy
  tierstore warm inspect out/poolmon.json

exit status: 0 ok, 1 error, 2 bad arguments, 130/143 interrupted (SIGINT/SIGTERM)
"""

# (group, module) pairs; a group with several modules gets one sub-parser each.
_GROUPS = {
    "pack": ("Build, inspect and verify pack files", ["pack"]),
    "warm": ("Inspect, merge and convert warm-start files", ["warm"]),
    "bench": (
        "Benchmarks: pool hits on traces, promote I/O, store fires, decode tokens/s",
        ["bench_hits", "bench_io", "bench_fire", "bench_decode"],
    ),
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so every cleanup of Ctrl-C runs for it too."""


def build_parser() -> Parser:
    from tierstore import __version__

    parser = Parser(
        prog="tierstore", description=DESCRIPTION, epilog=EPILOG, formatter_class=RawHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"tierstore {__version__}")
    groups = parser.add_subparsers(dest="group", metavar="COMMAND", required=True)
    for group, (help_text, modules) in _GROUPS.items():
        gp = groups.add_parser(group, help=help_text, description=help_text)
        sub = gp.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
        for mod in modules:
            importlib.import_module(f"tierstore.cli.{mod}").register(sub)
    importlib.import_module("tierstore.cli.demo").register(groups)
    importlib.import_module("tierstore.cli.plan").register(groups)
    return parser


@contextlib.contextmanager
def _signals_and_warnings():
    """SIGTERM -> Terminated and one-line warnings, for the duration of one command
    (restored after, so main() can be called in-process by tests)."""

    def on_term(signum, frame):
        raise Terminated()

    def show_one_line(message, category, filename, lineno, file=None, line=None):
        print(f"tierstore: warning: {one_line(str(message))}", file=sys.stderr)

    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, on_term) if main_thread else None
    old_show = warnings.showwarning
    warnings.showwarning = show_one_line
    try:
        yield
    finally:
        warnings.showwarning = old_show
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)


def _error(text: str) -> int:
    print(f"tierstore: error: {one_line(str(text))}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    from tierstore import settings

    with _signals_and_warnings():
        try:
            parser = build_parser()
            try:
                args = parser.parse_args(argv)  # bad values exit 2 here, nothing done yet
            except SystemExit as exc:  # --help, --version, usage errors
                return exc.code if isinstance(exc.code, int) else 2
            settings.check_environment()  # every TIERSTORE_* at once, before any work
            rc = args.func(args)
        except Terminated:
            print("tierstore: terminated (SIGTERM); nothing partial was left behind", file=sys.stderr)
            return 128 + signal.SIGTERM
        except KeyboardInterrupt:
            print("tierstore: interrupted; nothing partial was left behind", file=sys.stderr)
            return 128 + signal.SIGINT
        except TierstoreError as exc:
            return _error(str(exc))
        except FileNotFoundError as exc:
            return _error(f"{exc.filename or exc}: no such file or directory")
        except BrokenPipeError:
            # `tierstore ... --json | head`: the reader left; not an error of ours.
            # Point stdout at devnull so the interpreter's final flush stays quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        except OSError as exc:  # a permission, a full disk ...: name the file, no traceback
            where = exc.filename or "tierstore"
            return _error(f"{where}: {exc.strerror or exc}")
        except MemoryError:
            return _error("out of memory; try smaller sizes")
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
