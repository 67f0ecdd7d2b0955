"""The lab: the trace simulator, and the map of every research piece of tierstore.

The simulator replays routing traces through the policy classes the live store uses,
with Belady's optimum and the unbounded cache beside them, so a hit-rate figure is the
store's own (``tierstore bench hits`` is its command; bench/hits_eval.py its evaluation).
Its modules:

- ``runner`` (``replay``, the models by name), ``counting`` (every read counted, both
  views), ``demand`` (the demand-fill and lazy loops in Python: the oracles the native
  replays are tested against), ``native_replay`` (the same loops in C++,
  csrc/store/src/replay.cpp and its siblings), ``belady`` (MIN, MIN that may skip),
  ``leadtime`` (the latency view's model of when a read lands);
- traces: ``traces`` (the capture format, read strictly) and ``synth`` (the seeded
  DeepSeek-V4-Flash-shaped router the benchmarks and the demo use);
- the prefetcher's replays: ``prefetching`` (``<policy>+prefetch``), ``predict`` (the
  ``predict`` / ``prefetch`` models) and ``prefetch_bound`` (a prefetcher told the true
  routes: a bound, never a policy; bench/prefetch_bound.py drives it).

Research pieces that live elsewhere, and why there:

- the self-tuning and research policies ``auto``, ``phase`` and ``blend``:
  tierstore/policies/ (auto.py, phase.py, blend.py), because the live store runs them by
  name (``policy="auto"``) through the same registry as lru and heat; their rules are
  C++ (csrc/store/include/tierstore/store/policy.hpp, auto_core.hpp);
- the learned prefetcher: its rules in C++ (csrc/store/src/prefetcher.cpp), its faces
  tierstore/policies/prefetch.py and tierstore/policies/corouting.py, the store's hook
  tierstore/store/prefetch.py (``ExpertStore(prefetch=...)``), the native replay
  csrc/store/src/prefetch_replay.cpp; one implementation, driven by the store and the
  simulator alike;
- bounds that use future knowledge: ``prefetch_bound`` here, and bench/hits_bounds.py.

Nothing here imports the store or needs a GPU: the native replays use tierstore._C's
policy rules, not its I/O engine.
"""

from tierstore.sim.belady import BeladyPolicy, BeladySkipPolicy
from tierstore.sim.counting import Prepared, Result
from tierstore.sim.demand import replay_demand_fill, replay_lazy
from tierstore.sim.runner import (
    SIM_MODELS,
    available_models,
    check_policy_names,
    expand_names,
    replay,
    replay_reference,
)

__all__ = [
    "replay",
    "Result",
    "Prepared",
    "BeladyPolicy",
    "BeladySkipPolicy",
    "SIM_MODELS",
    "available_models",
    "expand_names",
    "check_policy_names",
    "replay_demand_fill",
    "replay_lazy",
    "replay_reference",
]
