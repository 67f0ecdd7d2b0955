"""Runtime settings: every ``TIERSTORE_*`` knob in one place, and THE env-var parser.

Each knob has a default, is read from its environment variable (the whole
``TIERSTORE_*`` family at once, on first use), and can be changed at run time::

    from tierstore import settings
    settings.get("threads")                 # 8, or $TIERSTORE_THREADS
    settings.set("threads", 4)              # process-wide until changed again
    with settings.override(threads=2):      # tests: restored on exit
        ...

Explicit arguments to :class:`tierstore.ExpertStore` always win over a setting;
a setting only fills in what the caller left out. The list of knobs is
``settings.KNOBS``; docs/SETTINGS.md documents each one (a test checks the two
agree). Thread safety: get/set are atomic per knob; ``override`` is meant for
tests and changes the value for every thread while it is active.

The parser is one table-driven engine for every environment family
(``TIERSTORE_*`` here, ``VLLM_MOE_W2_*`` in the vLLM-Moet adapter): an
:class:`EnvSpec` is a prefix plus :class:`Var` rows (variable, key, converter,
default, doc); ``spec.parse(environ)`` converts every variable that is set,
collects ALL bad values into one :class:`ConfigError` (``NAME=value: reason``
each, so a user fixes them in one go) and warns once per unknown name with the
family's prefix (a typo must not pass silently, but must not stop a server
either). Converters take a string (or an already typed value, for ``set``) and
raise ``ValueError(reason)``; ``boolean``, ``integer``, ``number``,
``fraction``, ``choice``, ``gib_or_auto`` and ``optional_path`` cover the common
kinds.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import shlex
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tierstore.errors import ConfigError

Converter = Callable[[Any], Any]

#: Policy names a TIERSTORE_*_POLICY may take. settings sits below tierstore.policies
#: (which reads settings), so the names are listed here; a test keeps them equal to
#: policies.available().
POLICY_NAMES = ("lru", "heat", "hybrid", "auto", "phase", "blend", "freq", "need")
AUTO = "auto"


# -- converters: value -> typed value, raise ValueError(reason) ----------------------
def boolean(value: Any) -> bool:
    """1/true/yes/on -> True, 0/false/no/off/"" -> False."""
    if isinstance(value, bool):
        return value
    low = str(value).strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 0/1/true/false")


def _num(v) -> str:
    return str(v) if isinstance(v, int) else f"{v:g}"


def bound_text(lo, hi, lo_open: bool = False) -> str:
    """ ">= 1 and <= 9" for the bounds given (either may be None)."""
    parts = []
    if lo is not None:
        parts.append(f"{'>' if lo_open else '>='} {_num(lo)}")
    if hi is not None:
        parts.append(f"<= {_num(hi)}")
    return " and ".join(parts)


def integer(lo: int | None = None, hi: int | None = None) -> Converter:
    """A base-10 integer in [lo, hi] (either bound may be None): an int (numpy's too), a
    float with no fraction (1.5 is refused, not truncated), or its text."""

    def parse(value: Any) -> int:
        v = None
        if isinstance(value, bool):
            pass
        elif isinstance(value, numbers.Integral):
            v = int(value)
        elif isinstance(value, numbers.Real):
            with contextlib.suppress(OverflowError, ValueError):
                f = float(value)
                v = int(f) if math.isfinite(f) and f.is_integer() else None
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                v = int(value.strip(), 10)
        if v is None or (lo is not None and v < lo) or (hi is not None and v > hi):
            bound = bound_text(lo, hi, False)
            raise ValueError(f"expected an integer{' ' + bound if bound else ''}")
        return v

    return parse


def number(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> Converter:
    """A finite float in [lo, hi] ((lo, hi] with ``lo_open``): a real number (numpy's
    too) or its text; nan, inf and what overflows a float (1e400) are refused."""

    def parse(value: Any) -> float:
        v = None
        if isinstance(value, bool):
            pass
        elif isinstance(value, numbers.Real):
            try:
                v = float(value)
            except (OverflowError, ValueError):
                v = math.inf
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                v = float(value.strip())
        if (
            v is None
            or not math.isfinite(v)
            or (lo is not None and (v < lo or (lo_open and v == lo)))
            or (hi is not None and v > hi)
        ):
            bound = bound_text(lo, hi, lo_open)
            raise ValueError(f"expected a finite number{' ' + bound if bound else ''}")
        return v

    return parse


def fraction(value: Any) -> float:
    """A float in [0, 1]."""
    try:
        return number(0.0, 1.0)(value)
    except ValueError:
        raise ValueError("expected a fraction in [0, 1]") from None


def choice(*names: str, what: str = "value", aliases: Mapping[str, str] | None = None) -> Converter:
    """One of ``names`` (case-insensitive); ``aliases`` map other spellings onto them."""
    aliases = dict(aliases or {})

    def parse(value: Any) -> str:
        low = str(value).strip().lower()
        low = aliases.get(low, low)
        if low not in names:
            raise ValueError(f"unknown {what} {str(value)!r}; expected one of {', '.join(names)}")
        return low

    return parse


#: ExpertStore's checksum modes (store/verify.py): every read verified, or the opt-out.
VERIFY_MODES = ("always", "off")


def verify_mode(value: Any) -> str:
    """``always`` | ``off``. ``first`` named a mode that published a row re-read after an
    eviction unchecked; it is read as ``always``, with a FutureWarning."""
    if str(value).strip().lower() == "first":
        warnings.warn(
            "verify mode 'first' now verifies every read, as 'always' does (a row "
            "re-read after an eviction is hashed again): write 'always', or 'off' "
            "to opt out",
            FutureWarning,
            stacklevel=4,
        )
        return "always"
    return choice(*VERIFY_MODES, what="verify mode")(value)


#: The largest size in GiB any argument takes (an exbibyte): GiB * 2**30 stays an exact,
#: finite float and an int64 byte count.
GIB_MAX = 1 << 30
#: The largest count (slots, promotions, steps' worth of keys...): far above any pack's
#: 2**22 keys, and it fits every index type the store uses.
COUNT_MAX = (1 << 31) - 1

gib = number(0.0, GIB_MAX)  # GiB >= 0
count = integer(0, COUNT_MAX)  # 0, 1, 2 ...
positive_count = integer(1, COUNT_MAX)  # 1, 2 ...
seconds = number(0.0)  # finite seconds >= 0


def gib_or_auto(value: Any) -> float | None:
    """``auto`` -> None, else GiB >= 0."""
    if value is None or str(value).strip().lower() == AUTO:
        return None
    try:
        return gib(value)
    except ValueError:
        raise ValueError(f"expected GiB >= 0 and <= {GIB_MAX}, or auto") from None


def timeout(name: str, value: Any) -> float | None:
    """A wait's limit, as ``argument`` checks it: None (no limit) or finite seconds >= 0
    (inf is refused: Python's own waits overflow on it; pass None)."""
    return None if value is None else argument(name, value, seconds)


# -- API arguments: the same converters, one message ------------------------------------
_NO_VALUE = object()  # fails every converter: its message says what the converter expects


def expected(convert: Converter) -> str:
    """What ``convert`` accepts, as its refusal says it ("an integer >= 1")."""
    try:
        convert(_NO_VALUE)
    except (TypeError, ValueError) as exc:
        return str(exc).removeprefix("expected ")
    return "a valid value"


def argument(name: str, value: Any, convert: Converter, words: Iterable[str] = (), text: bool = False) -> Any:
    """An API argument through the converter its environment variable and command-line
    option use (ONE validation for env, CLI and API): the typed value, or ConfigError
    ``name must be <what convert expects>, found <value>`` before anything is allocated
    or written. A number must come as a number (int, float, numpy scalar): text, bools
    and other objects are refused (``"8"`` or ``True`` for a count is a caller's bug),
    except the ``words`` the argument also takes (``"auto"``); ``text``: the argument is
    a word (a mode name), and ``convert`` judges any text."""
    if text:
        ok = True
    elif isinstance(value, str):
        ok = value.strip().lower() in words
    else:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    reason = "expected " + expected(convert)
    if ok:
        try:
            return convert(value)
        except (TypeError, ValueError) as exc:
            reason = str(exc)
    if reason.startswith("expected "):
        raise ConfigError(f"{name} must be {reason[len('expected ') :]}, found {_shown(value)}")
    raise ConfigError(f"{name}={_shown(value)}: {reason}")


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past Python's digit limit
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def optional_path(value: Any) -> str | None:
    """A path; empty means unset."""
    text = os.fspath(value) if value is not None else ""
    return str(text) or None


# -- the table and its parser ---------------------------------------------------------
@dataclass(frozen=True)
class Var:
    """One environment variable: its full name, the key it fills, converter, default, doc.

    ``show`` turns a value back into the string that parses to it (round trips)."""

    env: str
    key: str
    parse: Converter
    default: Any
    doc: str
    show: Callable[[Any], str] = str

    @property
    def name(self) -> str:  # settings.get(name) for TIERSTORE_* knobs
        return self.key


def _quote(raw: Any) -> str:
    """The value as a shell would take it; a long one cut (a 64 KiB value must not make a
    64 KiB error line)."""
    text = str(raw)
    if len(text) > 80:
        return shlex.quote(text[:60]) + f"...({len(text)} characters)"
    return shlex.quote(text)


_PREFIXES: set[str] = set()  # every EnvSpec's prefix: a nested family owns its names


class EnvSpec:
    """A family of environment variables sharing a prefix, parsed in one pass. Names
    under a longer prefix of another EnvSpec (TIERSTORE_VLLM_* inside TIERSTORE_*)
    belong to that family and are not reported as unknown here."""

    def __init__(self, prefix: str, variables: Iterable[Var], family: str | None = None):
        self.prefix = prefix
        self.vars: dict[str, Var] = {}
        for var in variables:
            if not var.env.startswith(prefix) or var.env in self.vars:
                raise ValueError(f"{var.env}: not under {prefix} or listed twice")
            self.vars[var.env] = var
        self.family = family or f"{prefix}*"
        self._warned: dict[str, None] = {}  # module-level set() shadows the builtin
        self._lock = threading.Lock()
        _PREFIXES.add(prefix)

    def by_key(self, key: str) -> Var | None:
        for var in self.vars.values():
            if var.key == key:
                return var
        return None

    def unknown(self, environ: Mapping[str, str]) -> list[str]:
        """Names with this prefix that no Var lists, sorted."""
        nested = [p for p in _PREFIXES if p != self.prefix and p.startswith(self.prefix)]
        return sorted(
            k
            for k in environ
            if k.startswith(self.prefix) and k not in self.vars and not any(k.startswith(p) for p in nested)
        )

    def warn_unknown(self, environ: Mapping[str, str], stacklevel: int = 2) -> list[str]:
        """One RuntimeWarning per unknown name per process; returns the newly warned names."""
        with self._lock:
            new = [k for k in self.unknown(environ) if k not in self._warned]
            self._warned.update(dict.fromkeys(new))
        if new:
            known = ", ".join(self.vars)
            warnings.warn(
                f"ignoring unknown {self.family} variable(s): {', '.join(new)} (known: {known})",
                RuntimeWarning,
                stacklevel=stacklevel + 1,
            )
        return new

    def convert(self, var: Var, raw: Any, origin: str | None = None) -> Any:
        """One value through its converter; ConfigError ``origin: reason`` on failure."""
        try:
            return var.parse(raw)
        except (TypeError, ValueError) as exc:
            where = origin or f"{var.env}={_quote(raw)}"
            raise ConfigError(f"{where}: {exc}") from None

    def parse(
        self, environ: Mapping[str, str] | None = None, *, defaults: bool = True, warn: bool = True
    ) -> dict[str, Any]:
        """{key: value} for every variable (set ones converted; with ``defaults`` the
        others at their default). All bad values -> ONE ConfigError whose
        ``problems`` lists each ``NAME=value: reason``; unknown names warn once."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        problems: list[str] = []
        for env, var in self.vars.items():
            raw = environ.get(env)
            if raw is None:
                if defaults:
                    values[var.key] = var.default
                continue
            try:
                values[var.key] = var.parse(raw)
            except (TypeError, ValueError) as exc:
                problems.append(f"{env}={_quote(raw)}: {exc}")
        if problems:
            head = "" if len(problems) == 1 else f"{len(problems)} bad {self.family} variables: "
            err = ConfigError(head + "; ".join(problems))
            err.problems = problems
            raise err
        if warn:
            self.warn_unknown(environ, stacklevel=3)
        return values

    def describe(self) -> list[tuple[str, str, Any, str]]:
        """(key, variable, default, doc) per row, for docs and --help."""
        return [(v.key, v.env, v.default, v.doc) for v in self.vars.values()]


# -- the TIERSTORE_* family -----------------------------------------------------------
def _knob(name: str, default: Any, parse: Converter, doc: str) -> Var:
    return Var("TIERSTORE_" + name.upper(), name, parse, default, doc)


Knob = Var  # the old name of a row; kept for callers of settings.KNOBS
_non_negative = number(0.0)

# The one default heat half-life, in decode steps (ticks), for the live store's
# policies and for the simulator (policies.heat imports it). 256 steps is ~3.4 s
# at 75 tok/s: the value the store always ran with, kept so that sharing one constant
# with the simulator changed no store behaviour; the simulator now replays the store
# as it ships instead of a 375-step copy (5 s at 75 tok/s, the reference manager's
# halving, which stays a separate constant of the reference model). On the FLAME trace
# the two agree within 0.003 of hit rate at 10/20/40% pools (bench/results/hits.md).
HEAT_HALF_LIFE_STEPS = 256.0

# TIERSTORE_TEST_*: the test suite's own switches (.ci/run sets TIERSTORE_TEST_REQUIRE_VLLM=1);
# the library never reads them, and they are not typos of a setting: no "unknown" warning
# (a warning line on stderr would break every command's one-line error contract under CI).
TEST_PREFIX = "TIERSTORE_TEST_"
_PREFIXES.add(TEST_PREFIX)

SPEC = EnvSpec(
    "TIERSTORE_",
    (
        _knob("threads", 8, integer(1, 512), "reader threads of the store's I/O engine"),
        _knob(
            "direct",
            "auto",
            choice("auto", "on", "off", what="O_DIRECT mode"),
            "O_DIRECT for pack reads: auto (probe, fall back to buffered), on (require), off",
        ),
        _knob("lazy_per_step", 8, count, "most lazy (background) promotions that one step() queues"),
        _knob(
            "half_life_steps",
            HEAT_HALF_LIFE_STEPS,
            _non_negative,
            "heat half-life in decode steps (0: the policy's own default)",
        ),
        _knob(
            "half_life_s",
            0.0,
            _non_negative,
            "heat half-life in wall-clock seconds; > 0 replaces half_life_steps",
        ),
        _knob("reserve_gb", 3.0, gib, 'GiB left free when a pool or arena is sized "auto"'),
        _knob("max_gb", 0.0, gib, 'cap on an "auto" pool in GiB (0: no cap)'),
        _knob("max_promote", 64, count, "default cap on new promotions per fire"),
        _knob(
            "pool_policy", "heat", choice(*POLICY_NAMES, what="policy"), "replacement policy of the VRAM pool"
        ),
        _knob(
            "arena_policy",
            "lru",
            choice(*POLICY_NAMES, what="policy"),
            "replacement policy of the pinned RAM arena",
        ),
        _knob(
            "scan_keep",
            0.5,
            fraction,
            "share of each tier's capacity (its hottest residents) a prefill (scan) batch may not evict",
        ),
        _knob(
            "fire_rounds",
            3,
            positive_count,
            "rounds a fire retries keys another thread was loading before giving up",
        ),
        _knob("latency_window", 4096, positive_count, "fire latencies kept for the p50/p99 in stats()"),
        _knob(
            "verify",
            "always",
            verify_mode,
            "check each row read from the pack (disk or page cache) against its sidecar xxh3-64 "
            "before it is published: always, or off (the opt-out); first = always (deprecated)",
        ),
        _knob(
            "snapshot_every_s",
            10.0,
            seconds,
            "seconds between poolmon snapshots when a snapshot path is set (0: off)",
        ),
        _knob(
            "metrics",
            True,
            boolean,
            "Prometheus metrics of every store (per-layer counts, fire histogram, exporter); "
            "0 turns them off",
        ),
        _knob(
            "metrics_dir",
            None,
            optional_path,
            "directory worker processes write metrics into for a scraping process "
            "(PROMETHEUS_MULTIPROC_DIR wins when set)",
        ),
        _knob(
            "metrics_interval_s",
            1.0,
            number(0.05, 3600.0),
            "seconds between a worker process's writes into the metrics directory",
        ),
        _knob(
            "capture",
            None,
            optional_path,
            "routing capture: trace file (.npy) a face writes the routed experts into",
        ),
        _knob(
            "capture_max_steps",
            20000,
            integer(1),
            "most steps (ticks) a routing capture keeps; later steps are not recorded",
        ),
        _knob(
            "capture_max_mb",
            256.0,
            number(0.0, lo_open=True),
            "most MiB of trace rows a routing capture keeps",
        ),
    ),
    family="TIERSTORE_*",
)

KNOBS: dict[str, Var] = {v.key: v for v in SPEC.vars.values()}

_lock = threading.Lock()
_values: dict[str, Any] = {}  # set() values win over the environment
_env: dict[str, Any] | None = None  # the parsed environment, None until first use


def _check_name(name: str) -> Var:
    knob = KNOBS.get(name)
    if knob is None:
        raise ConfigError(f"unknown setting {name!r}; known: {', '.join(sorted(KNOBS))}")
    return knob


def check_environment(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Parse every TIERSTORE_* variable now: {name: value}, one ConfigError for all bad
    ones, one warning per unknown name. The CLI calls it at start-up."""
    return SPEC.parse(environ)


def _environment() -> dict[str, Any]:
    global _env
    if _env is None:
        _env = SPEC.parse(os.environ)
    return _env


def get(name: str) -> Any:
    """Current value of a knob: set() > $TIERSTORE_<NAME> > default."""
    _check_name(name)
    with _lock:
        if name in _values:
            return _values[name]
        return _environment()[name]


def set(name: str, value: Any) -> None:  # noqa: A001 - mirrors get()
    """Change a knob for the whole process (validated like the environment)."""
    knob = _check_name(name)
    typed = SPEC.convert(knob, value, f"setting {name}={_quote(value)}")
    with _lock:
        _values[name] = typed


def reset(name: str | None = None) -> None:
    """Forget set() values (one knob or all) and re-read the environment on next use."""
    global _env
    with _lock:
        if name is None:
            _values.clear()
        else:
            _check_name(name)
            _values.pop(name, None)
        _env = None


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Temporarily set knobs; the previous values come back on exit, even on error."""
    for name in values:
        _check_name(name)
    with _lock:
        had = {name: _values[name] for name in values if name in _values}
    try:
        for name, value in values.items():
            set(name, value)
        yield
    finally:
        with _lock:
            for name in values:
                if name in had:
                    _values[name] = had[name]
                else:
                    _values.pop(name, None)


def describe() -> list[tuple[str, str, Any, str]]:
    """(name, environment variable, default, doc) for every knob, for docs and --help."""
    return SPEC.describe()
