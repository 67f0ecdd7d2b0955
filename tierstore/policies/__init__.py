"""Replacement policies, registered by name.

``make(name, n_keys, capacity, **params)`` builds one instance (one per tier:
instances share no state); ``available()`` lists the names. Parameters:

- ``lru``: none. ``auto`` (self-tuning: follows the best of nine shadowed fixed
  policies, see policies/auto.py): ``prefetching`` (bool, default False: a
  prefetcher runs beside it; ``make(..., prefetching=True)`` sets it).
- ``freq``, ``need``: vLLM-Moet's FP4-tier rules (policies/engine_rules.py), heat's
  parameters.
- ``heat``, ``hybrid``, ``phase`` (hybrid + within-tick next-use order, policies/phase.py),
  ``blend`` (phase over the mean of a short and a 32x longer rate, policies/blend.py):
  ``half_life`` (decode steps, default ``tierstore.settings.HEAT_HALF_LIFE_STEPS`` = 256,
  the store's and the simulator's) or ``half_life_s`` (seconds of wall clock).
"""

from __future__ import annotations

from tierstore.errors import ConfigError
from tierstore.policies.auto import AutoPolicy
from tierstore.policies.base import NO_KEY, Policy
from tierstore.policies.blend import BlendPolicy
from tierstore.policies.engine_rules import FreqPolicy, NeedPolicy
from tierstore.policies.heat import HeatPolicy
from tierstore.policies.hybrid import HybridPolicy
from tierstore.policies.lru import LRUPolicy
from tierstore.policies.phase import PhasePolicy

_REGISTRY: dict[str, type[Policy]] = {
    "lru": LRUPolicy,
    "heat": HeatPolicy,
    "hybrid": HybridPolicy,
    "auto": AutoPolicy,
    "phase": PhasePolicy,
    "blend": BlendPolicy,
    "freq": FreqPolicy,  # vLLM-Moet's rules (policies/engine_rules.py)
    "need": NeedPolicy,
}


def available() -> list[str]:
    """Names ``make`` accepts, in a stable order."""
    return list(_REGISTRY)


def has_half_life(name: str) -> bool:
    """Whether policy ``name`` takes ``half_life`` / ``half_life_s`` (the decayed-
    frequency family: heat and the policies built on it)."""
    cls = _REGISTRY.get(str(name).lower())
    return cls is not None and issubclass(cls, HeatPolicy)


def make(name: str, n_keys: int, capacity: int, *, prefetching: bool = False, **params) -> Policy:
    """A fresh policy ``name`` over ``n_keys`` dense keys holding ``capacity``.
    ``prefetching``: the tier runs the prefetcher (policies/prefetch.py) beside it; a
    policy that tunes itself for that (``takes_prefetching``: auto) is told, the others
    are the same policy either way. The simulator's ``<policy>+prefetch`` and the store's
    ``prefetch=`` both pass it, so the two build the same policy.

    Raises ConfigError for an unknown name or parameter."""
    cls = _REGISTRY.get(str(name).lower())
    if cls is None:
        raise ConfigError(f"unknown policy {name!r}; available: {', '.join(available())}")
    if getattr(cls, "takes_prefetching", False):
        params = {"prefetching": prefetching, **params}
    return cls(n_keys, capacity, **params)


__all__ = [
    "Policy",
    "NO_KEY",
    "LRUPolicy",
    "HeatPolicy",
    "HybridPolicy",
    "AutoPolicy",
    "PhasePolicy",
    "BlendPolicy",
    "FreqPolicy",
    "NeedPolicy",
    "make",
    "available",
    "has_half_life",
]
