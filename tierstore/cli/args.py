"""Argument parsing shared by the command modules: typed converters and path checks.

Every converter here is an argparse ``type=``: it turns the text into a typed value
or raises ``argparse.ArgumentTypeError`` whose text says what was expected, so a bad
value is refused by the parser, before any work, as one line naming the option.
Path checks (``existing_file``, ``output_file``, ``output_dir`` ...) only look (an
output directory gets one probe file, removed at once), so a refused command leaves
nothing behind.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable

from tierstore import settings
from tierstore.errors import ConfigError, one_line


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (``tierstore CMD: error: ... (see --help)``)
    and every option's default shown in its help."""

    def __init__(self, *a, **kw):
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(*a, **kw)

    def error(self, message: str):  # noqa: D401 - argparse's hook
        # argparse quotes the user's argv, which may hold a newline: still one line.
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


class HelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to every option that takes a value and has a default
    its help text does not already state; flags (store_true) show none."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            action.nargs == 0
            or action.default in (None, argparse.SUPPRESS)
            or "default" in text
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


class RawHelpFormatter(HelpFormatter, argparse.RawDescriptionHelpFormatter):
    """HelpFormatter that keeps the description's own line breaks (top-level help)."""


def _fail(text: str):
    raise argparse.ArgumentTypeError(text)


# -- numbers: the settings module's converters (one implementation), as argparse types --
def _as_type(convert: Callable[[str], object], name: str) -> Callable[[str], object]:
    def parse(text: str):
        try:
            return convert(text)
        except (TypeError, ValueError) as exc:
            _fail(f"{exc}, found {text!r}")

    parse.__name__ = name  # argparse names the type in some messages
    return parse


def int_in(lo: int | None = None, hi: int | None = None) -> Callable[[str], int]:
    """An integer in [lo, hi]."""
    return _as_type(settings.integer(lo, hi), "integer")


def float_in(
    lo: float | None = None, hi: float | None = None, *, lo_open: bool = False
) -> Callable[[str], float]:
    """A finite number in [lo, hi] ((lo, hi] with ``lo_open``)."""
    return _as_type(settings.number(lo, hi, lo_open=lo_open), "number")


def _bounds(lo, hi) -> str:
    text = settings.bound_text(lo, hi)
    return " " + text if text else ""


positive_int = int_in(1)
non_negative_int = int_in(0)
positive_float = float_in(0.0, lo_open=True)
non_negative_float = float_in(0.0)


def int_list_of(lo: int = 1, hi: int | None = None) -> Callable[[str], list[int]]:
    """``"51,102,205"`` -> ``[51, 102, 205]``: at least one, each in [lo, hi]."""
    one = int_in(lo, hi)

    def parse(text: str) -> list[int]:
        items = [x for x in str(text).split(",") if x.strip()]
        if not items:
            _fail(f"expected comma-separated integers{_bounds(lo, hi)}, found {text!r}")
        try:
            return [one(x) for x in items]
        except argparse.ArgumentTypeError:
            _fail(f"expected comma-separated integers{_bounds(lo, hi)}, found {text!r}")

    parse.__name__ = "integer list"
    return parse


def int_list(text: str, name: str) -> list[int]:
    """``int_list_of(1)`` for values that did not come through the parser."""
    try:
        return int_list_of(1)(text)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"--{name}: {exc}") from None


def names_of(allowed: Iterable[str], what: str = "name") -> Callable[[str], list[str]]:
    """A comma-separated, non-empty list of names from ``allowed`` (case-insensitive)."""
    allowed = tuple(allowed)

    def parse(text: str) -> list[str]:
        items = [x.strip().lower() for x in str(text).split(",") if x.strip()]
        if not items:
            _fail(f"expected one or more of {', '.join(allowed)}, found {text!r}")
        bad = [x for x in items if x not in allowed]
        if bad:
            _fail(f"unknown {what} {bad[0]!r}; expected one or more of {', '.join(allowed)}")
        return list(dict.fromkeys(items))

    parse.__name__ = f"{what} list"
    return parse


# -- paths ------------------------------------------------------------------------------
def existing_file(what: str = "file") -> Callable[[str], str]:
    """A path naming a regular, readable file."""

    def parse(text: str) -> str:
        path = os.fspath(text)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            _fail(f"{path}: no such {what}")
        except OSError as exc:
            _fail(f"{path}: cannot read ({exc.strerror})")
        if stat.S_ISDIR(st.st_mode):
            _fail(f"{path}: is a directory, expected a {what}")
        if not stat.S_ISREG(st.st_mode):
            _fail(f"{path}: not a regular file, expected a {what}")
        if not os.access(path, os.R_OK):
            _fail(f"{path}: not readable")
        return path

    parse.__name__ = what
    return parse


def _existing(what: str, check: Callable[[str], None] | None) -> Callable[[str], str]:
    def parse(text: str) -> str:
        path = os.fspath(text)
        if not os.path.exists(path):
            _fail(f"{path}: no such {what}")
        if check is not None:
            check(path)
        return path

    parse.__name__ = what
    return parse


def existing_dir(what: str = "directory") -> Callable[[str], str]:
    def check(path: str) -> None:
        if not os.path.isdir(path):
            _fail(f"{path}: is not a directory, expected a {what}")
        if not os.access(path, os.R_OK | os.X_OK):
            _fail(f"{path}: not readable")

    return _existing(what, check)


def existing_path(what: str = "file or directory") -> Callable[[str], str]:
    return _existing(what, None)


def _writable_dir(path: str, label: str) -> None:
    """The nearest existing ancestor of ``path`` must be a writable directory."""
    probe = os.path.abspath(path)
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        _fail(f"{label}: {probe} is a file, not a directory; choose another place")
    if not os.access(probe, os.W_OK | os.X_OK) or not _can_create_in(probe):
        _fail(f"{label}: {probe} is not writable; choose another place")


def _can_create_in(directory: str) -> bool:
    """Whether a file can really be created there: access() says yes to root even on
    /proc or a read-only mount. The probe file is removed at once."""
    try:
        fd, name = tempfile.mkstemp(prefix=".tierstore-probe-", dir=directory)
    except OSError:
        return False
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(name)
    return True


def output_file(what: str = "output file") -> Callable[[str], str]:
    """A file to write: not a directory, in an existing writable directory (the
    atomic writer puts its temp file beside it, so that directory must exist)."""

    def parse(text: str) -> str:
        path = os.fspath(text)
        if not path or path.endswith(os.sep):
            _fail(f"{path!r}: expected a file name, not a directory")
        if os.path.isdir(path):
            _fail(f"{path}: is a directory, expected a {what} name")
        if os.path.lexists(path) and not os.path.isfile(path):
            _fail(f"{path}: exists and is not a regular file")
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            _fail(f"{path}: directory {parent} does not exist; create it first")
        _writable_dir(parent, path)
        if os.path.exists(path) and not os.access(path, os.W_OK):
            _fail(f"{path}: not writable")
        return path

    parse.__name__ = what
    return parse


def output_dir(what: str = "output directory") -> Callable[[str], str]:
    """A directory to write into: an existing writable one, or a new one whose nearest
    existing ancestor is a writable directory (it is created later, when work starts)."""

    def parse(text: str) -> str:
        path = os.fspath(text)
        if not path:
            _fail("expected a directory, found ''")
        if os.path.lexists(path) and not os.path.isdir(path):
            _fail(f"{path}: is a file, expected a directory")
        _writable_dir(path, path)
        return path

    parse.__name__ = what
    return parse


def check_cuda(option: str = "--device") -> None:
    """ConfigError unless torch sees a CUDA device (``--device cuda`` on a CPU box)."""
    from tierstore import cuda_available

    if not cuda_available():
        raise ConfigError(f"{option} cuda: no CUDA device is visible here; use {option} cpu (or auto)")


def say(text: str) -> None:
    """A progress line on stderr (plain text: fine in logs and pipes)."""
    print(text, file=sys.stderr, flush=True)
