"""--version, a top-level help that describes the tool, and help with a default shown
for every option of every command."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from tierstore import __version__
from tierstore.cli import build_parser, main
from tierstore.cli.args import HelpFormatter


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def _commands(parser, prefix=()):
    for action in parser._actions:  # noqa: SLF001 - argparse has no public walk
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            for name, sub in action.choices.items():
                yield from _commands(sub, prefix + (name,))
    if prefix:
        yield prefix, parser


COMMANDS = [(" ".join(p), sub) for p, sub in _commands(build_parser())]


def test_version():
    rc, out, _ = _run(["--version"])
    assert rc == 0 and out.strip() == f"tierstore {__version__}"


def test_top_level_help_describes_the_tool():
    rc, out, _ = _run(["--help"])
    assert rc == 0
    for word in ("GPU", "pinned", "pack", "TIERSTORE_", "demo --quick", "exit status"):
        assert word in out
    for group in ("pack", "warm", "bench", "demo"):
        assert f"    {group}" in out


@pytest.mark.parametrize("name, parser", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_option_has_help_and_a_stated_default(name, parser):
    shown = HelpFormatter("tierstore")
    parser.format_help()  # formats without error (every %(default)s expands)
    one_of = {
        a
        for g in parser._mutually_exclusive_groups
        if g.required  # noqa: SLF001
        for a in g._group_actions
    }  # noqa: SLF001 - "give one of": no default to show
    for action in parser._actions:  # noqa: SLF001
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):  # noqa: SLF001
            continue
        assert action.help, f"tierstore {name}: {action.option_strings or action.dest} has no help"
        takes_value = (
            action.nargs != 0 and action.option_strings and not action.required and action not in one_of
        )
        if takes_value:
            assert "default" in shown._get_help_string(action), (
                f"tierstore {name} {action.option_strings[0]}: no default shown"
            )


@pytest.mark.parametrize("name", [c[0] for c in COMMANDS if " " in c[0] or c[0] == "demo"])
def test_help_of_each_command_exits_0(name):
    rc, out, _ = _run([*name.split(), "--help"])
    assert rc == 0 and "usage: tierstore" in out
