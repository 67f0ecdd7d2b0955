"""Runtime settings: every ``TIERSTORE_*`` knob in one place.

Each knob has a default, is read once from its environment variable (lazily, on
first use), and can be changed at run time::

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
"""
from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from tierstore.errors import ConfigError


def _parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected 0/1/true/false, found {text!r}")


def _parse_direct(text: str) -> str:
    low = text.strip().lower()
    if low not in ("auto", "on", "off"):
        raise ValueError(f"expected auto, on or off, found {text!r}")
    return low


def _non_negative(kind: Callable[[str], Any]) -> Callable[[Any], Any]:
    def parse(text):
        value = kind(text)
        if value < 0:
            raise ValueError(f"expected a value >= 0, found {text!r}")
        return value
    return parse


def _positive_int(text) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"expected an integer >= 1, found {text!r}")
    return value


def _fraction(text) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"expected a fraction in [0, 1], found {text!r}")
    return value


@dataclass(frozen=True)
class Knob:
    name: str                       # settings.get(name)
    default: Any
    parse: Callable[[Any], Any]     # str (from the environment) or value -> typed value
    doc: str

    @property
    def env(self) -> str:
        return "TIERSTORE_" + self.name.upper()


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("threads", 8, _positive_int, "reader threads of the store's I/O engine"),
    Knob("direct", "auto", _parse_direct,
         "O_DIRECT for pack reads: auto (probe, fall back to buffered), on (require), off"),
    Knob("lazy_per_step", 8, _non_negative(int),
         "most lazy (background) promotions that one step() queues"),
    Knob("half_life_steps", 256.0, _non_negative(float),
         "heat half-life in decode steps (0: the policy's own default)"),
    Knob("half_life_s", 0.0, _non_negative(float),
         "heat half-life in wall-clock seconds; > 0 replaces half_life_steps"),
    Knob("reserve_gb", 3.0, _non_negative(float),
         "GiB left free when a pool or arena is sized \"auto\""),
    Knob("max_gb", 0.0, _non_negative(float), "cap on an \"auto\" pool in GiB (0: no cap)"),
    Knob("max_promote", 64, _non_negative(int), "default cap on new promotions per fire"),
    Knob("pool_policy", "heat", str, "replacement policy of the VRAM pool"),
    Knob("arena_policy", "lru", str, "replacement policy of the pinned RAM arena"),
    Knob("scan_keep", 0.5, _fraction,
         "share of each tier's capacity (its hottest residents) a prefill (scan) batch may not evict"),
    Knob("fire_rounds", 3, _positive_int,
         "rounds a fire retries keys another thread was loading before giving up"),
    Knob("latency_window", 4096, _positive_int,
         "fire latencies kept for the p50/p99 in stats()"),
    Knob("snapshot_every_s", 10.0, _non_negative(float),
         "seconds between poolmon snapshots when a snapshot path is set (0: off)"),
)}

_lock = threading.Lock()
_values: dict[str, Any] = {}


def _check_name(name: str) -> Knob:
    knob = KNOBS.get(name)
    if knob is None:
        raise ConfigError(f"unknown setting {name!r}; known: {', '.join(sorted(KNOBS))}")
    return knob


def _parse(knob: Knob, raw: Any, origin: str) -> Any:
    try:
        return knob.parse(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{origin}: {exc}") from None


def get(name: str) -> Any:
    """Current value of a knob: set() > $TIERSTORE_<NAME> > default."""
    knob = _check_name(name)
    with _lock:
        if name in _values:
            return _values[name]
        raw = os.environ.get(knob.env)
        value = knob.default if raw is None else _parse(knob, raw, f"${knob.env}")
        _values[name] = value
        return value


def set(name: str, value: Any) -> None:  # noqa: A001 - mirrors get()
    """Change a knob for the whole process (validated like the environment)."""
    knob = _check_name(name)
    typed = _parse(knob, value, f"setting {name}")
    with _lock:
        _values[name] = typed


def reset(name: str | None = None) -> None:
    """Forget set() values (one knob or all) so the environment is read again."""
    with _lock:
        if name is None:
            _values.clear()
        else:
            _check_name(name)
            _values.pop(name, None)


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Temporarily set knobs; the previous values come back on exit, even on error."""
    for name in values:
        _check_name(name)
    saved = {name: get(name) for name in values}
    try:
        for name, value in values.items():
            set(name, value)
        yield
    finally:
        with _lock:
            _values.update(saved)


def describe() -> list[tuple[str, str, Any, str]]:
    """(name, environment variable, default, doc) for every knob, for docs and --help."""
    return [(k.name, k.env, k.default, k.doc) for k in KNOBS.values()]
