"""Online co-routing counts: which experts a layer will route, predicted from the
routing already seen (the prefetcher's model, ``tierstore.policies.prefetch``).

Per (layer, distance ``d``), decayed counts (half-life ``half_life`` ticks, lazy
global gain as in heat.py, so a tick costs O(1) and not O(counts)):
- cross-layer: ``C[l, f, e]`` = how often expert f at layer l and expert e at
  layer l + d were routed in the same tick. Given layer l's experts F,
  P(e at l + d) = sum_f C[l, f, e] / sum_f N[l, f]: a pooled mixture over F
  (sums to the routed count per token over e), shrunk toward layer l + d's
  marginal frequency with the weight of ``prior_weight`` observations, so a pair
  seen twice does not look certain.
- next-token: ``T[l, g, e]`` = expert g at layer l one tick earlier and e at
  layer l now; the same pooled, shrunk estimate.
- the two mix with weights learned online, Bayesian model averaging with
  forgetting: each one's weight is exp of its decayed log-likelihood of what was
  then actually routed, so a predictor that is consistently worse gets no say
  (a fixed mix let a near-chance next-token predictor dilute a good cross-layer
  one on FLAME).
- a read group of T tokens (a prefill, a batch) is one observation of weight
  1/T: its pairs did not all share a token, so it says little about what one
  token routes next. ``present`` turns the per-token estimate into the chance
  that any of the next group's T tokens routes the expert, 1 - (1 - q)^T; a
  layer with no observations yet is uniform (q = k / E).
Everything is learned from the past only: ``learn`` is told what was routed,
``predict`` answers from the counts so far.

Implemented once, natively (csrc/store/include/tierstore/store/prefetcher.hpp,
``tierstore._C.CoRouting``): the prefetcher's core owns one, and the simulator's
``predict`` model (``tierstore.sim.predict``) builds its own through this module.
Arrays are summed as numpy sums them; exp / log / pow are libm's.
"""

from __future__ import annotations

from tierstore.memory import check_fits_memory
from tierstore.policies.native import native_module


def check_tables_fit(n_layers: int, n_experts: int, what: str) -> None:
    """CapacityError unless the tables (cross-layer and next-token, n_layers x n_experts^2
    float64 each, zero-filled at once) fit this machine: checked before allocating."""
    L, E = int(n_layers), int(n_experts)
    check_fits_memory(16 * L * E * (E + 4), f"{what}: the co-routing tables of {L} layers x {E} experts")


def __getattr__(name: str):
    """``CoRouting`` is the native class (TierstoreError when the extension is not built)."""
    if name == "CoRouting":
        return native_module().CoRouting
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
