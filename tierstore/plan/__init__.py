"""``tierstore plan``: size a MoE model's expert pool for one card, from its geometry
(a Hugging Face config.json, a pack, or flags) and the serving shape (context, sequences,
speculative tokens, dtypes); with a routing trace, the hit-rate curve and the pool and
policy to use. docs/PLAN.md walks through DeepSeek-V4-Flash on 96 GB and 32 GB cards.

    geometry.py  the model: from_hf_config, from_pack, Geometry
    budget.py    the memory model: plan_memory -> Budget (the store's sizing.auto_slots
                 and sizing.fire_floor, one implementation)
    engines.py   the exact vLLM-Moet variables and upstream vLLM settings
    curve.py     hit rate vs pool on a trace (tierstore.sim), the recommendation
"""

from __future__ import annotations

from tierstore.plan.budget import Budget, Inputs, plan_memory
from tierstore.plan.curve import Curve, hit_curve
from tierstore.plan.engines import moet_settings, vllm_settings
from tierstore.plan.geometry import Geometry, from_hf_config, from_pack


def warm_file_from_trace(trace, slots: int, identity, half_life: float | None = None):
    """A warm-start WarmFile whose pool tier holds the ``slots`` hottest keys of
    ``trace`` (decayed token counts at its end, the store's heat half-life by default),
    hottest first, with the trace's model layer ids. ``identity``: the PackIdentity it
    is for (layers and experts must cover the trace's)."""
    import numpy as np

    from tierstore import settings
    from tierstore.errors import ConfigError
    from tierstore.warm.formats import WarmFile, WarmTier

    half_life = float(half_life or settings.HEAT_HALF_LIFE_STEPS)
    if trace.n_experts > identity.n_experts or int(trace.layer_ids.max()) >= identity.n_layers:
        raise ConfigError(
            f"{trace.name}: layers up to {int(trace.layer_ids.max())} x "
            f"{trace.n_experts} experts do not fit the pack's "
            f"{identity.n_layers} x {identity.n_experts}"
        )
    age = float(trace.ticks[-1]) - trace.ticks.astype(np.float64)
    heat = np.bincount(trace.keys, weights=0.5 ** (age / half_life), minlength=trace.n_keys)
    order = np.argsort(-heat, kind="stable")
    order = order[heat[order] > 0][: max(int(slots), 0)]
    layers = trace.layer_ids[order // trace.n_experts]
    keys = np.stack([layers, order % trace.n_experts], axis=1).astype(np.int64)
    pool = WarmTier(keys, heat[order].astype(np.float64), capacity=int(slots))
    return WarmFile(
        path="",
        kind="poolmon",
        identity=identity,
        pool=pool,
        arena=WarmTier.empty(),
        steps=int(trace.n_ticks),
        policy="trace-heat",
    )


__all__ = [
    "Geometry",
    "from_hf_config",
    "from_pack",
    "Inputs",
    "Budget",
    "plan_memory",
    "Curve",
    "hit_curve",
    "moet_settings",
    "vllm_settings",
    "warm_file_from_trace",
]
