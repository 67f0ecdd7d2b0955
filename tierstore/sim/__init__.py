"""Trace simulator: replays routing traces through the policy classes the live store
uses, with Belady's optimum and the unbounded cache beside them; trace formats and the
synthetic generator (``tierstore.sim.traces``, ``tierstore.sim.synth``)."""
from tierstore.sim.counting import Prepared, Result
from tierstore.sim.runner import (SIM_MODELS, BeladyPolicy, check_policy_names, replay,
                                  replay_demand_fill, replay_reference)

__all__ = ["replay", "Result", "Prepared", "BeladyPolicy", "SIM_MODELS", "check_policy_names",
           "replay_demand_fill", "replay_reference"]
