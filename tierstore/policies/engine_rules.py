"""vLLM-Moet's two FP4-tier rules as registered policies: ``freq`` and ``need``.

vLLM-Moet ranks the owners of its FP4 pool by one of two decayed counters (its
``DeltaTier``: ``DELTA_POLICY``, both decayed by ``DELTA_DECAY`` every ``DELTA_DECAY_S``
seconds) and evicts the lowest first:

* ``freq``: tokens routed to the expert, folded at every step end; the tier also
  promotes lazily between steps. That is heat (policies/heat.py) over the routing the
  store records; the class exists so the engine's name means the engine's rule here, in
  the store and in the simulator alike.
* ``need``: how many gate fires routed the expert (one per fire, whatever the token
  count); no lazy promotion (the store is opened with ``lazy_per_step=0``). The store
  feeds such a policy the keys of each fire (``counts_fires``) and not the recorded
  routing; in the simulator, where every replayed step is a demand fill, every access
  is such a fire, so ``on_access`` counts as heat does.

Ties go to the lower key id (vLLM-Moet: to the lower slot index; the two agree
within tie-breaking). Decay: by steps like heat, or ``half_life_s`` for vLLM-Moet's
wall-clock decay (``DELTA_DECAY ** (t / DECAY_S)`` is a half-life of
``DECAY_S * ln 0.5 / ln DELTA_DECAY`` seconds).
"""

from __future__ import annotations

from tierstore.policies.heat import HeatPolicy


class FreqPolicy(HeatPolicy):
    name = "freq"


class NeedPolicy(HeatPolicy):
    name = "need"
    counts_fires = True  # the store feeds it fires' keys, not recorded routing


__all__ = ["FreqPolicy", "NeedPolicy"]
