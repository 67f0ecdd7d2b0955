"""Trace simulator: replays routing traces through the policy classes the live store
uses, with Belady's optimum and the unbounded cache beside them; trace formats and the
synthetic generator (``tierstore.sim.traces``, ``tierstore.sim.synth``)."""
from tierstore.sim.belady import BeladyPolicy, BeladySkipPolicy
from tierstore.sim.counting import Prepared, Result
from tierstore.sim.demand import replay_demand_fill, replay_lazy
from tierstore.sim.runner import (SIM_MODELS, available_models, check_policy_names,
                                  expand_names, replay, replay_reference)

__all__ = ["replay", "Result", "Prepared", "BeladyPolicy", "BeladySkipPolicy", "SIM_MODELS",
           "available_models", "expand_names", "check_policy_names", "replay_demand_fill",
           "replay_lazy", "replay_reference"]
