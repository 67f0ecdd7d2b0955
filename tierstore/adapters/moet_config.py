"""VLLM_MOE_W2_* environment variables -> one validated ``MoetConfig``.

vLLM-Moet configures its tier store through environment variables
(../shared/COMPAT.md, "Environment variables a drop-in must honour"). A drop-in
reads them ONCE, here; everything below takes explicit arguments. Every bad
value is reported in one ConfigError that quotes each variable and value, so a
user fixes them all in one go. Unknown ``VLLM_MOE_W2_*`` names (typos) give one
warning, not an error: the fork has debug knobs of its own we need not know.

Policy names of the fork map onto tierstore policies:

=========  ==========  ======================================================
env value  tierstore   why
=========  ==========  ======================================================
``freq``   ``heat``    decayed frequency, the fork's default ranking
``need``   ``hybrid``  heat + an admission filter (one-hit experts do not
                       displace hot ones): the fork's "promote what is needed"
``lru``    ``lru``     recency only
=========  ==========  ======================================================

The fork decays heat by DELTA_DECAY every DELTA_DECAY_S seconds; tierstore's
heat policy takes a half-life, ``half_life_s = DECAY_S * ln 0.5 / ln DECAY``
(0.5 every 5 s -> 5 s).
"""
from __future__ import annotations

import math
import os
import warnings
from typing import Callable, Mapping

import msgspec

from tierstore.errors import ConfigError

PREFIX = "VLLM_MOE_W2_"
POLICY_MAP = {"freq": "heat", "need": "hybrid", "lru": "lru"}
AUTO = "auto"


class MoetConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Settings of a vLLM-Moet tier. GiB values are float GiB, None = "auto"."""
    store_dir: str | None = None          # STORE_DIR: pack directory
    delta_gb: float | None = None         # DELTA_GB: FP4 pool GiB, None = auto
    delta_reserve_gb: float = 3.0         # DELTA_RESERVE_GB: kept free when auto
    delta_max_gb: float = 0.0             # DELTA_MAX_GB: cap of auto, 0 = none
    delta_promote: int = 8                # DELTA_PROMOTE: lazy promotions per pass
    delta_policy: str = "freq"            # DELTA_POLICY: freq | need | lru
    delta_decay: float = 0.5              # DELTA_DECAY: heat factor per DECAY_S
    delta_decay_s: float = 5.0            # DELTA_DECAY_S
    gate: bool = True                     # GATE: fire on uncertain decode steps
    gate_max_promote: int = 64            # GATE_MAX_PROMOTE: cap per fire
    force_pool: bool = False              # FORCE_POOL: accept a pool under the fire floor
    base_ram_gb: float | None = None      # BASE_RAM_GB: arena GiB, None = 25% of the pack
    tier_direct: str = "auto"             # TIER_DIRECT: O_DIRECT misses: on | off | auto
    tier_preheat: bool = True             # TIER_PREHEAT: arena warm start from .heat.json
    tier_scan: bool = True                # TIER_SCAN: scan resistance during prefill
    store_threads: int = 8                # STORE_THREADS: reader threads
    pool_heat: bool = True                # POOL_HEAT: pool warm start + snapshots
    pool_heat_dir: str | None = None      # POOL_HEAT_DIR: None = STORE_DIR
    pool_heat_every_s: float = 10.0       # POOL_HEAT_EVERY_S: snapshot period
    pool_heat_fill: float = 0.9           # POOL_HEAT_FILL: preload at most this pool share

    @property
    def tierstore_policy(self) -> str:
        return POLICY_MAP[self.delta_policy]

    @property
    def half_life_s(self) -> float:
        return self.delta_decay_s * math.log(0.5) / math.log(self.delta_decay)

    @property
    def heat_dir(self) -> str | None:
        return self.pool_heat_dir or self.store_dir

    def as_env(self) -> dict[str, str]:
        """The environment that parses back to this config (round trip)."""
        env = {}
        for field, (var, _parse, show) in _FIELDS.items():
            value = getattr(self, field)
            if value is not None or show is _show_gib:
                env[var] = show(value)
        return env


# -- parsers: str -> value, raise ValueError(reason) ---------------------------
def _bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected 0 or 1")


def _number(lo: float, hi: float = math.inf, *, lo_open=False, integer=False) -> Callable:
    def parse(s: str):
        try:
            v = int(s, 10) if integer else float(s)
        except ValueError:
            raise ValueError("expected an integer" if integer else "expected a number") from None
        if not math.isfinite(v) or v < lo or v > hi or (lo_open and v == lo):
            bound = f"{'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi != math.inf else "")
            raise ValueError(f"expected a value {bound}")
        return v
    return parse


def _gib_or_auto(s: str) -> float | None:
    if s.strip().lower() == AUTO:
        return None
    return _number(0.0)(s)


def _choice(*names: str) -> Callable:
    def parse(s: str) -> str:
        v = s.strip().lower()
        if v not in names:
            raise ValueError(f"expected one of {' | '.join(names)}")
        return v
    return parse


def _direct(s: str) -> str:
    v = s.strip().lower()
    aliases = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}
    v = aliases.get(v, v)
    if v not in ("on", "off", "auto"):
        raise ValueError("expected 0, 1 or auto")
    return v


def _path(s: str) -> str | None:
    return s or None


def _show_float(v: float) -> str:
    return repr(float(v))


def _show_gib(v: float | None) -> str:
    return AUTO if v is None else repr(float(v))


_FIELDS: dict[str, tuple[str, Callable, Callable]] = {
    # field: (variable, parser, value -> env string)
    "store_dir": (PREFIX + "STORE_DIR", _path, str),
    "delta_gb": (PREFIX + "DELTA_GB", _gib_or_auto, _show_gib),
    "delta_reserve_gb": (PREFIX + "DELTA_RESERVE_GB", _number(0.0), _show_float),
    "delta_max_gb": (PREFIX + "DELTA_MAX_GB", _number(0.0), _show_float),
    "delta_promote": (PREFIX + "DELTA_PROMOTE", _number(0, integer=True), str),
    "delta_policy": (PREFIX + "DELTA_POLICY", _choice(*POLICY_MAP), str),
    "delta_decay": (PREFIX + "DELTA_DECAY", _number(0.0, 1.0, lo_open=True), _show_float),
    "delta_decay_s": (PREFIX + "DELTA_DECAY_S", _number(0.0, lo_open=True), _show_float),
    "gate": (PREFIX + "GATE", _bool, lambda v: str(int(v))),
    "gate_max_promote": (PREFIX + "GATE_MAX_PROMOTE", _number(1, integer=True), str),
    "force_pool": (PREFIX + "FORCE_POOL", _bool, lambda v: str(int(v))),
    "base_ram_gb": (PREFIX + "BASE_RAM_GB", _gib_or_auto, _show_gib),
    "tier_direct": (PREFIX + "TIER_DIRECT", _direct, str),
    "tier_preheat": (PREFIX + "TIER_PREHEAT", _bool, lambda v: str(int(v))),
    "tier_scan": (PREFIX + "TIER_SCAN", _bool, lambda v: str(int(v))),
    "store_threads": (PREFIX + "STORE_THREADS", _number(1, 1024, integer=True), str),
    "pool_heat": (PREFIX + "POOL_HEAT", _bool, lambda v: str(int(v))),
    "pool_heat_dir": (PREFIX + "POOL_HEAT_DIR", _path, str),
    "pool_heat_every_s": (PREFIX + "POOL_HEAT_EVERY_S", _number(0.0, lo_open=True), _show_float),
    "pool_heat_fill": (PREFIX + "POOL_HEAT_FILL", _number(0.0, 1.0), _show_float),
}
VARIABLES = tuple(var for var, _p, _s in _FIELDS.values())


def config_from_env(environ: Mapping[str, str] | None = None) -> MoetConfig:
    """Read every VLLM_MOE_W2_* variable once; unset ones take their defaults.

    Raises ConfigError listing every malformed variable as ``NAME='value' (reason)``.
    """
    environ = os.environ if environ is None else environ
    values, bad = {}, []
    for field, (var, parse, _show) in _FIELDS.items():
        raw = environ.get(var)
        if raw is None:
            continue
        try:
            values[field] = parse(raw)
        except ValueError as exc:
            bad.append(f"{var}={raw!r} ({exc})")
    if bad:
        raise ConfigError(f"bad vLLM-Moet setting{'s' if len(bad) > 1 else ''}: " + "; ".join(bad))
    unknown = sorted(k for k in environ if k.startswith(PREFIX) and k not in VARIABLES)
    if unknown:
        warnings.warn(f"ignoring unknown vLLM-Moet variable(s): {', '.join(unknown)}",
                      RuntimeWarning, stacklevel=2)
    return MoetConfig(**values)
