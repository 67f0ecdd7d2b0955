"""VLLM_MOE_W2_* environment variables -> one validated ``MoetEnv``, with vLLM-Moet's meanings.

The meanings are vLLM-Moet's own (its ``moe_w2_delta``, ``moe_w2_gate`` and
``moe_w2_store`` read them; docs/VLLM_MOET.md lists each one): a drop-in keeps
them exactly, and a setting tierstore adds gets its own ``VLLM_MOE_W2_TIERSTORE*``
name. The ones most often got wrong:

* ``DELTA_GB`` unset = ``"2.0"`` GiB; ``auto`` / ``-1`` / ``-1.0`` = auto (sized
  after the KV cache, no 8-slot minimum); any other value <= 0 = no FP4 tier at all.
* ``GATE`` unset = off; only ``"1"`` arms it (every switch here is on only for ``"1"``).
* ``GATE_MAX_PROMOTE`` = 64, <= 0 = unlimited: a per-STEP budget shared by up to
  ``GATE_FP_MAX`` (3, clamped >= 1) promote -> replay rounds.
* ``BASE_RAM_GB``, ``TIER_DIRECT`` (default ``"0"``), ``TIER_SCAN``, ``TIER_PREHEAT``
  and ``POOL_HEAT*`` belong to vLLM-Moet's base-cache tier; the FP4 tier ignores them.

Everything is read once per ``from_env`` call (vLLM-Moet reads most at import);
a malformed value of any variable is reported in ONE ConfigError naming every
bad variable and value: the table below runs through ``tierstore.settings``' one
env-var parser (``EnvSpec``).
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Callable, Mapping

import msgspec

from tierstore import settings
from tierstore.files.untrusted import file_kind
from tierstore.format.sidecar import MAX_FIELD_BYTES, MAX_LAYERS, json_field_bytes

PREFIX = "VLLM_MOE_W2_"
GIB = 1 << 30
AUTO_VALUES = ("auto", "-1", "-1.0")
ZERO_MODES = ("auto", "sign", "alt")
QUANTIZER_ABI = "tsym4-e8m0-fragmajor-a32-v2"  # vLLM-Moet's MOE_W2_QUANTIZER_ABI
DEFAULT_CUTOFF = 43  # DS4-Flash main-stack MoE layers


class MoetEnv(msgspec.Struct, frozen=True, kw_only=True):
    """The VLLM_MOE_W2_* values the FP4 tier, the gate and the store act on."""

    delta: bool = True  # DELTA == "1"
    delta_gb_raw: str = "2.0"  # DELTA_GB as given (stripped, lowercased)
    delta_gb: float = 2.0  # its float value (0.0 in auto mode)
    delta_auto: bool = False  # DELTA_GB in auto / -1 / -1.0
    delta_gb_explicit: bool = False  # DELTA_GB was set at all (matters over the base cache)
    reserve_gb: float = 3.0  # DELTA_RESERVE_GB: left free by an auto pool
    max_gb: float = 0.0  # DELTA_MAX_GB: cap of an auto pool, 0 = none
    policy: str = "freq"  # DELTA_POLICY: need | freq | lru (other = lru-like)
    policy_explicit: bool = False
    promote_per_pass: int = 8  # DELTA_PROMOTE: manager promotions per pass
    tick_s: float = 0.005  # DELTA_TICK_MS / 1e3: min gap between manager passes
    decay: float = 0.5  # DELTA_DECAY, applied every DECAY_S seconds
    decay_s: float = 5.0  # DELTA_DECAY_S (min 0.1)
    rank: str = "step_w"  # DELTA_RANK
    promo_hyst: float = 0.0  # PROMO_HYST: >1 = displacement bar into a full pool
    split: bool = False  # DELTA_SPLIT
    count_seen: bool = False  # DELTA_TRACE > 0 or DELTA_CAPTURE set: seen is int32
    capture: str = ""  # DELTA_CAPTURE: routing trace (.npy) path, "" = none
    capture_ticks: int = 20000  # DELTA_CAPTURE_TICKS: steps a capture keeps
    base_cache_gb: float = 0.0  # BASE_CACHE_GB: > 0 = vLLM-Moet's base tier exists
    force_pool: bool = False  # FORCE_POOL as parsed (the module rereads it at the check)
    fire_timing: bool = False  # GATE_FIRE_TIMING
    gate: bool = False  # GATE == "1"
    gate_max_promote: int = 64  # GATE_MAX_PROMOTE (<= 0 = unlimited)
    gate_fp_max: int = 3  # GATE_FP_MAX, clamped >= 1
    gate_reforward: bool = True  # GATE_REFORWARD
    gate_capture: bool = False  # GATE_CAPTURE: count need, promote nothing
    store_dir: str = ""  # STORE_DIR (stripped); "" = host store, no pack
    store_threads: int = 8  # STORE_THREADS: reader threads
    ckpt_id: str = ""  # CKPT_ID: pack identity
    zero_mode: str = "auto"  # ZERO_MODE: auto | sign | alt
    num_layers: int | None = None  # NUM_LAYERS: main-stack cutoff (slot-table rows = +1)
    prefill_t: int = 96  # PREFILL_T: largest decode-sized batch
    exl3_base: bool = False  # EXL3_BASE
    # tierstore's own, named VLLM_MOE_W2_TIERSTORE*
    tierstore: bool = False  # TIERSTORE == "1": the plugin installs our tier
    ts_ram_gb: float = 0.0  # TIERSTORE_RAM_GB: pinned arena over the FP4 pack
    ts_direct: str = "off"  # TIERSTORE_DIRECT: O_DIRECT misses: on | off | auto
    ts_checksums: bool = False  # TIERSTORE_VERIFY: check row checksums on read

    @property
    def half_life_s(self) -> float:
        """DECAY every DECAY_S seconds as a half-life (0.5 every 5 s -> 5 s)."""
        if not 0.0 < self.decay < 1.0:
            return 0.0
        return self.decay_s * math.log(0.5) / math.log(self.decay)

    @property
    def enabled(self) -> bool:
        """vLLM-Moet's ``enabled()``: is there an FP4 tier at all."""
        if not self.delta:
            return False
        if self.base_cache_gb > 0:
            return self.delta_gb_explicit and self.delta_gb > 0
        return self.delta_gb > 0 or self.delta_auto

    @property
    def step_budget(self) -> int | None:
        """The gate's per-step promotion budget; None = unlimited."""
        return self.gate_max_promote if self.gate_max_promote > 0 else None

    @property
    def layer_rows(self) -> int:
        """Slot-table rows when get_tier is given no n_layers: cutoff + 1 (MTP drafter)."""
        return (DEFAULT_CUTOFF if self.num_layers is None else self.num_layers) + 1

    def tier_policy(self) -> str:
        """The FP4 tier's policy: ``need`` by default over the base cache or an EXL3 base."""
        if (self.base_cache_gb > 0 or self.exl3_base) and not self.policy_explicit:
            return "need"
        return self.policy

    def initial_slots(self, slot_bytes: int) -> int:
        """n_slots at construction: 0 while auto is pending, else max(GiB // slot, 8)."""
        if self.delta_auto:
            return 0
        return max(int(self.delta_gb * GIB) // int(slot_bytes), 8)


# -- the table (tierstore.settings' one env-var parser) --------------------------------------
def _switch(value) -> bool:
    return str(value) == "1"  # vLLM-Moet compares with "1" exactly; anything else is off


def _float(value) -> float:
    return settings.number()(value)


def _int(value) -> int:
    return settings.integer()(value)


def _at_least(parse: Callable, lo):
    return lambda value: max(parse(value), lo)


_GIB_ANY = settings.number(None, settings.GIB_MAX)  # finite GiB, <= 0 allowed (a meaning)


def _gb(value) -> str:
    """DELTA_GB: auto spellings, or a finite number of GiB (kept as the stripped,
    lowercased text). nan / inf / 1e400 are refused: vLLM-Moet itself fails on them."""
    text = str(value).strip().lower()
    if text not in AUTO_VALUES:
        try:
            _GIB_ANY(text)
        except ValueError:
            raise ValueError(
                f"expected a finite number of GiB (at most {settings.GIB_MAX}), auto or -1"
            ) from None
    return text


def _no_cap_at_or_below_zero(value) -> float:
    """DELTA_MAX_GB: vLLM-Moet caps an auto pool only when it is > 0; <= 0 = no cap (0.0)."""
    return max(_GIB_ANY(value), 0.0)


#: DELTA_TICK_MS's ceiling. vLLM-Moet's manager sleeps up to the tick before each pass and
#: its wait_manager_idle gives up after 60 s: a longer tick stalls every step (1e300 kills
#: the manager thread). The face runs promotions once per step and reads it, not uses it.
TICK_MS_MAX = 60_000.0
#: Reader threads: the engine's cap (settings' TIERSTORE_THREADS); more are clamped to it,
#: as vLLM-Moet clamps fewer than 1 up to 1.
STORE_THREADS_MAX = 512


def _threads(value) -> int:
    return min(max(_int(value), 1), STORE_THREADS_MAX)


def _store_dir(value) -> str:
    """STORE_DIR, stripped; a path that exists must be a directory (vLLM-Moet's own
    makedirs fails on a file, a FIFO or /dev/null too): refused at boot, before anything
    is allocated or written."""
    text = str(value).strip()
    if text and os.path.lexists(text) and not os.path.isdir(text):
        try:
            mode = os.stat(text).st_mode
            what = "a regular file" if stat.S_ISREG(mode) else file_kind(mode)
        except OSError as exc:
            what = f"cannot be read: {exc.strerror}"
        raise ValueError(f"not a directory ({what}); name the directory the FP4 pack lives in")
    return text


def _ckpt_id(value) -> str:
    """CKPT_ID, stripped: at most what a sidecar's identity field may hold, so a pack is
    never written only to be refused when it is read back (sidecar.MAX_FIELD_BYTES)."""
    text = str(value).strip()
    size = json_field_bytes(text)
    if size > MAX_FIELD_BYTES:
        raise ValueError(f"expected at most {MAX_FIELD_BYTES} bytes (as JSON) of checkpoint id, found {size}")
    return text


def _count(value) -> int:
    return _int(value)


def _v(suffix: str, key: str, parse: Callable, default, doc: str) -> settings.Var:
    return settings.Var(PREFIX + suffix, key, parse, default, doc)


SPEC = settings.EnvSpec(
    PREFIX,
    (
        _v("DELTA", "delta", _switch, True, "FP4 tier on unless not '1'"),
        _v(
            "DELTA_GB",
            "delta_gb_raw",
            _gb,
            "2.0",
            "FP4 pool GiB; auto/-1 = after the KV cache; <= 0 = no tier",
        ),
        _v("DELTA_RESERVE_GB", "reserve_gb", settings.gib, 3.0, "GiB an auto pool leaves free"),
        _v("DELTA_MAX_GB", "max_gb", _no_cap_at_or_below_zero, 0.0, "cap of an auto pool, <= 0 = none"),
        _v("DELTA_POLICY", "policy", str, "freq", "need (no lazy promotion) | freq | lru"),
        _v("DELTA_PROMOTE", "promote_per_pass", settings.count, 8, "manager promotions per pass"),
        _v(
            "DELTA_TICK_MS",
            "tick_ms",
            settings.number(None, TICK_MS_MAX),
            5.0,
            "minimum gap between manager passes (read, not used)",
        ),
        _v("DELTA_DECAY", "decay", _float, 0.5, "freq/need factor per DECAY_S"),
        _v("DELTA_DECAY_S", "decay_s", _at_least(_float, 0.1), 5.0, "decay period (min 0.1 s)"),
        _v("DELTA_RANK", "rank", str, "step_w", "force_promote ranking: step_w = seen_w first"),
        _v("PROMO_HYST", "promo_hyst", _float, 0.0, "> 1: displacement bar into a full pool"),
        _v("DELTA_SPLIT", "split", _switch, False, "quintal slots"),
        _v("DELTA_TRACE", "trace", _count, 0, "> 0 also makes seen int32 counts"),
        _v(
            "DELTA_CAPTURE",
            "capture",
            lambda v: str(v).strip(),
            "",
            "routing capture path; non-empty also makes seen int32 counts",
        ),
        _v(
            "DELTA_CAPTURE_TICKS", "capture_ticks", _at_least(_int, 1), 20000, "steps a routing capture keeps"
        ),
        _v("BASE_CACHE_GB", "base_cache_gb", _float, 0.0, "> 0: vLLM-Moet's base-cache tier"),
        _v("FORCE_POOL", "force_pool", _switch, False, "serve under the fire floor (a warning)"),
        _v("GATE_FIRE_TIMING", "fire_timing", _switch, False, "fill LAST_FORCE_TIMING"),
        _v("GATE", "gate", _switch, False, "only '1' arms the gate"),
        _v("GATE_MAX_PROMOTE", "gate_max_promote", _int, 64, "per-step budget, <= 0 = unlimited"),
        _v("GATE_FP_MAX", "gate_fp_max", _at_least(_int, 1), 3, "promote -> replay rounds (>= 1)"),
        _v("GATE_REFORWARD", "gate_reforward", _switch, True, "replay after a promotion"),
        _v("GATE_CAPTURE", "gate_capture", _switch, False, "count need, promote nothing"),
        _v("STORE_DIR", "store_dir", _store_dir, "", "pack directory; empty = host rows"),
        _v("STORE_THREADS", "store_threads", _threads, 8, "reader threads (1..512, clamped)"),
        _v("CKPT_ID", "ckpt_id", _ckpt_id, "", "pack identity: checkpoint id"),
        _v(
            "ZERO_MODE",
            "zero_mode",
            settings.choice(*ZERO_MODES, what="zero mode"),
            "auto",
            "pack identity: auto | sign | alt",
        ),
        _v(
            "NUM_LAYERS",
            "num_layers",
            settings.integer(0, MAX_LAYERS - 1),
            None,
            "main-stack MoE layers (rows = +1, at most a pack's layer cap)",
        ),
        _v("PREFILL_T", "prefill_t", _int, 96, "largest decode-sized batch"),
        _v("EXL3_BASE", "exl3_base", _switch, False, "EXL3 base (FP4 policy defaults to need)"),
        _v("TIERSTORE", "tierstore", _switch, False, "the plugin installs tierstore's FP4 tier"),
        _v(
            "TIERSTORE_RAM_GB",
            "ts_ram_gb",
            settings.gib,
            0.0,
            "tierstore: pinned RAM arena over the FP4 pack (GiB)",
        ),
        _v(
            "TIERSTORE_DIRECT",
            "ts_direct",
            settings.choice("on", "off", "auto", what="direct mode", aliases={"1": "on", "0": "off"}),
            "off",
            "tierstore: O_DIRECT misses",
        ),
        _v("TIERSTORE_VERIFY", "ts_checksums", _switch, False, "tierstore: check row checksums"),
    ),
    family="VLLM_MOE_W2_*",
)
VARIABLES = tuple(SPEC.vars)
BASE_ONLY = tuple(
    PREFIX + s
    for s in (
        "BASE_RAM_GB",
        "TIER_DIRECT",
        "TIER_SCAN",
        "TIER_PREHEAT",
        "POOL_HEAT",
        "POOL_HEAT_DIR",
        "POOL_HEAT_EVERY_S",
        "POOL_HEAT_FILL",
        "MISS_TOL",
        "FP_MAX",
        "REPLAY_MODE",
        "KPI_EVERY",
    )
)


def from_env(environ: Mapping[str, str] | None = None) -> MoetEnv:
    """Parse every VLLM_MOE_W2_* variable the FP4 tier uses; unset ones take
    vLLM-Moet's defaults. One ConfigError lists every ``NAME=value: reason``. Other
    VLLM_MOE_W2_* names are vLLM-Moet's own (dozens): no unknown-name warning."""
    env = os.environ if environ is None else environ
    v = SPEC.parse(env, warn=False)
    gb = v.pop("delta_gb_raw")
    auto = gb in AUTO_VALUES
    trace, capture, tick_ms = v.pop("trace"), v["capture"], v.pop("tick_ms")
    return MoetEnv(
        **v,
        delta_gb_raw=gb,
        delta_auto=auto,
        delta_gb=0.0 if auto else float(gb),
        delta_gb_explicit=PREFIX + "DELTA_GB" in env,
        policy_explicit=PREFIX + "DELTA_POLICY" in env,
        count_seen=trace > 0 or bool(capture),
        tick_s=tick_ms / 1e3,
    )


config_from_env = from_env  # the earlier name, kept for callers


def force_pool(environ: Mapping[str, str] | None = None) -> bool:
    """FORCE_POOL is read when the floor is checked, not at import (vLLM-Moet's rule)."""
    env = os.environ if environ is None else environ
    return env.get(PREFIX + "FORCE_POOL", "0") == "1"
