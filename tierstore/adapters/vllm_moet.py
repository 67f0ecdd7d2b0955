"""vLLM-Moet's ``moe_w2_delta`` module surface, served by tierstore, and the zero-patch plugin.

What vLLM-Moet's glue, gate, runners and worker call on the module (docs/VLLM_MOET.md):

* ``_TIER``: the FP4 tier (a :class:`TierstoreDeltaTier`) or None = no FP4 tier;
* ``get_tier(n_layers=None, n_experts=256, dev=None, w13_bytes=None, w2_bytes=None)``:
  the first call creates the tier and starts its manager, later calls return it and
  ignore their arguments; None when ``enabled()`` is false;
* ``enabled()``, ``mark_seen(seen_row, ids)`` (in-graph), ``check_pool_floor(top_k,
  n_spec, max_num_seqs)`` (ValueError below the fire floor; deferred to
  ``finalize_auto`` while an auto pool is unsized), ``shutdown()``;
* the gate's side: ``step_promote_budget()``, ``fire_fp_max()``,
  ``force_promote_step(layers=None, max_promote="default")``.

``register()`` is the ``vllm.general_plugins`` entry point (pyproject): with
``VLLM_MOE_W2_TIERSTORE=1`` it installs ``get_tier``, ``shutdown`` and
``check_pool_floor`` into vLLM-Moet's ``moe_w2_delta`` module, so every caller
(they all go through the module's attributes) gets tierstore's FP4 tier; without
the variable it does nothing. vLLM-Moet's base-cache tier (``_BASE_TIER``,
VLLM_MOE_W2_BASE_CACHE_GB > 0) stays vLLM-Moet's.
"""

from __future__ import annotations

import logging
import os
import warnings

import torch

from tierstore.adapters.moet_config import MoetEnv, force_pool, from_env
from tierstore.adapters.moet_tier import SLOT_BYTES, W2_BYTES, W13_BYTES, TierstoreDeltaTier
from tierstore.adapters.moet_tier import mark_seen_row as mark_seen
from tierstore.errors import CapacityError, ConfigError

log = logging.getLogger("tierstore.adapters.moet")

MOET_MODULE = "vllm.model_executor.layers.quantization.utils.moe_w2_delta"
_TIER: TierstoreDeltaTier | None = None
_BASE_TIER = None  # vLLM-Moet's own; never created here
_ENV: MoetEnv | None = None  # read once, at the first call that needs it (vLLM-Moet: at import)
_TARGET = None  # vLLM-Moet's moe_w2_delta once register() installed us
_ORIGINAL: dict = {}

__all__ = [
    "TierstoreDeltaTier",
    "get_tier",
    "enabled",
    "mark_seen",
    "check_pool_floor",
    "shutdown",
    "step_promote_budget",
    "fire_fp_max",
    "force_promote_step",
    "register",
    "reset_env",
    "W13_BYTES",
    "W2_BYTES",
    "SLOT_BYTES",
]


def env() -> MoetEnv:
    global _ENV
    if _ENV is None:
        _ENV = from_env()
    return _ENV


def reset_env(environ=None) -> None:
    """Re-read the environment (tests; vLLM-Moet reads it once per process)."""
    global _ENV
    _ENV = None if environ is None else from_env(environ)


def _base_tier():
    return _TARGET._BASE_TIER if _TARGET is not None else _BASE_TIER


def _publish(tier) -> None:
    global _TIER
    _TIER = tier
    if _TARGET is not None:
        _TARGET._TIER = tier  # vLLM-Moet's callers read moe_w2_delta._TIER directly


def enabled() -> bool:
    """Is there an FP4 tier: DELTA == "1" and DELTA_GB > 0 or auto (over the base cache:
    DELTA_GB set explicitly and > 0)."""
    return env().enabled


def _default_rows() -> int:
    e = env()
    if e.num_layers is not None:
        return e.layer_rows
    try:  # vLLM-Moet's rule: the model's main-stack layer count, + 1 row for the MTP drafter
        from vllm.config import get_current_vllm_config

        hf = get_current_vllm_config().model_config.hf_config
        return int(hf.get_text_config().num_hidden_layers) + 1
    except Exception:  # noqa: BLE001 - no vLLM config: DS4-Flash's 43 + 1
        return e.layer_rows


def get_tier(n_layers=None, n_experts=256, dev=None, w13_bytes=None, w2_bytes=None):
    """The FP4 tier singleton (first call wins, manager started), or None when off."""
    if not enabled():
        return None
    if _TIER is None:
        e = env()
        base = e.base_cache_gb > 0
        if base:
            warnings.warn(
                "VLLM_MOE_W2_BASE_CACHE_GB > 0: the base-cache tier stays vLLM-Moet's; "
                "tierstore serves the FP4 tier only",
                RuntimeWarning,
                stacklevel=2,
            )
        if dev is None:
            dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        tag = ("fp4q" if e.split else "fp4") if base else "delta"
        tier = TierstoreDeltaTier(
            _default_rows() if n_layers is None else int(n_layers),
            int(n_experts),
            dev,
            w13_bytes=W13_BYTES if w13_bytes is None else int(w13_bytes),
            w2_bytes=W2_BYTES if w2_bytes is None else int(w2_bytes),
            policy=e.tier_policy(),
            tag=tag,
            host_pinned=not base,
            env=e,
        )
        btier = _base_tier()
        if base and e.split and btier is not None:
            btier._coupled_fp4 = tier  # base evictions spare FP4-mapped experts
        tier.start()
        _publish(tier)
    return _TIER


def _floor_check(tier, top_k: int, n_spec: int, max_num_seqs: int) -> None:
    """vLLM-Moet's floor: the layers the FP4 pack holds (not the table's rows) x top-k x
    (1 + n_spec) x min(seqs, 4) x the growth of GATE_FP_MAX rounds (tierstore.fire_floor)."""
    from tierstore.store.sizing import fire_floor

    e = env()
    growth = 1.0 + 0.35 * max(e.gate_fp_max - 1, 0)
    floor = fire_floor(max(len(tier._store), 1), top_k, n_spec, max_num_seqs, e.gate_fp_max)
    if tier.n_slots >= floor:
        return
    msg = (
        f"moet tier [{tier._tag}]: pool of {tier.n_slots} slots is below the fire floor of "
        f"{floor} ({len(tier._store)} MoE layers x top-{top_k} x (1+{n_spec} spec) x "
        f"{max_num_seqs} seqs x {growth:.2f}) = {floor * tier.slot_bytes / 2**30:.1f} GiB"
    )
    if not force_pool():
        raise CapacityError(
            msg + "; raise VLLM_MOE_W2_DELTA_GB, disable the gate or set VLLM_MOE_W2_FORCE_POOL=1"
        )
    log.warning("%s; serving on because VLLM_MOE_W2_FORCE_POOL=1", msg)


def check_pool_floor(top_k: int, n_spec: int, max_num_seqs: int) -> None:
    """Boot guard (end of load_model): ValueError (CapacityError) when the gate is armed
    and the FP4 pool is below the fire floor, unless VLLM_MOE_W2_FORCE_POOL=1; also
    for a gate without an FP4 tier and for PREFILL_T < max_num_seqs * (1 + n_spec).
    An auto pool is not sized yet: its floor is checked by finalize_auto."""
    e, tier = env(), _TIER
    if _TARGET is not None and "check_pool_floor" in _ORIGINAL and _base_tier() is not None:
        saved, _TARGET._TIER = _TARGET._TIER, None  # vLLM-Moet checks its own base tier
        try:
            _ORIGINAL["check_pool_floor"](top_k, n_spec, max_num_seqs)
        except ValueError as exc:
            if "no FP4 delta tier" not in str(exc):
                raise
        finally:
            _TARGET._TIER = saved
    if tier is not None and e.gate and len(tier._store) > 0:
        if tier._auto_pending:
            tier._deferred_floor = lambda: _floor_check(tier, top_k, n_spec, max_num_seqs)
        else:
            _floor_check(tier, top_k, n_spec, max_num_seqs)
    if e.gate and tier is None:
        raise ConfigError(
            "VLLM_MOE_W2_GATE=1 but there is no FP4 tier (VLLM_MOE_W2_DELTA_GB "
            "<= 0 or DELTA != 1): the gate cannot recover precision"
        )
    if e.prefill_t < max(max_num_seqs, 1) * (1 + n_spec):
        raise ConfigError(
            f"VLLM_MOE_W2_PREFILL_T={e.prefill_t} is below the largest decode step "
            f"(max_num_seqs x (1 + n_spec) = {max(max_num_seqs, 1) * (1 + n_spec)})"
        )


def shutdown() -> None:
    """Close vLLM-Moet's base tier (if any), then the FP4 tier; a global is cleared only
    when its close succeeded; any failure raises RuntimeError."""
    errors = []
    if _TARGET is not None and "shutdown_base" in _ORIGINAL:
        try:
            _ORIGINAL["shutdown_base"]()
        except Exception as exc:  # noqa: BLE001 - collected, raised below
            errors.append(exc)
    tier = _TIER
    if tier is not None:
        try:
            tier.close()
            _publish(None)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    if errors:
        raise RuntimeError("moe_w2 residency shutdown failed: " + "; ".join(map(str, errors)))


# -- the gate's side (moe_w2_gate) --------------------------------------------------------
def step_promote_budget() -> int | None:
    """GATE_MAX_PROMOTE as a per-step budget; None = unlimited (<= 0)."""
    return env().step_budget


def fire_fp_max() -> int:
    return env().gate_fp_max


def force_promote_step(layers=None, max_promote="default") -> int:
    """One promote round of a fire: 0 without a tier; GATE_CAPTURE counts need only;
    an explicit cap <= 0 promotes nothing; else ``tier.force_promote`` (pin=True)."""
    tier = _TIER
    if tier is None:
        return 0
    if env().gate_capture:
        tier.mark_need_only(layers=layers)
        return 0
    cap = step_promote_budget() if max_promote == "default" else max_promote
    if cap is not None and cap <= 0:
        return 0
    return tier.force_promote(layers=layers, max_promote=cap)


# -- the plugin -----------------------------------------------------------------------------
def register() -> None:
    """``vllm.general_plugins`` entry point: with VLLM_MOE_W2_TIERSTORE=1 install the
    tierstore FP4 tier into vLLM-Moet's moe_w2_delta; otherwise do nothing."""
    # Only our own switch is read first: with the plugin off no other variable is parsed,
    # so nothing vLLM-Moet itself tolerates can fail here.
    if os.environ.get("VLLM_MOE_W2_TIERSTORE", "0").strip() != "1" or _TARGET is not None:
        return
    try:
        reset_env(os.environ)  # every value checked now: one line naming each bad one
    except ConfigError as exc:
        raise ConfigError(f"VLLM_MOE_W2_TIERSTORE=1: {exc}") from None
    import importlib

    try:
        target = importlib.import_module(MOET_MODULE)
    except ImportError as exc:
        log.warning(
            "VLLM_MOE_W2_TIERSTORE=1 but vLLM-Moet's moe_w2_delta is not importable (%s): nothing installed",
            exc,
        )
        return
    install(target)


def install(target) -> None:
    """Point ``target`` (a moe_w2_delta module) at tierstore's FP4 tier."""
    global _TARGET
    for name in ("get_tier", "shutdown", "check_pool_floor"):
        _ORIGINAL[name] = getattr(target, name)
    original_shutdown = target.shutdown

    def shutdown_base():
        saved, target._TIER = target._TIER, None  # vLLM-Moet closes only its base tier
        try:
            original_shutdown()
        finally:
            target._TIER = saved

    _ORIGINAL["shutdown_base"] = shutdown_base
    _TARGET = target
    target.get_tier = get_tier
    target.shutdown = shutdown
    target.check_pool_floor = check_pool_floor
    log.info("tierstore: FP4 tier installed into %s", target.__name__)


def uninstall() -> None:
    """Undo ``install`` (tests)."""
    global _TARGET
    if _TARGET is not None:
        for name in ("get_tier", "shutdown", "check_pool_floor"):
            setattr(_TARGET, name, _ORIGINAL.pop(name))
        _ORIGINAL.pop("shutdown_base", None)
        _TARGET = None
