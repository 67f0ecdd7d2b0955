"""Hit rate against pool size on a user's routing trace, and the pool the planner
recommends. The replays are the simulator's (``tierstore.sim.replay``: the store's
policies in the C++ replay loops, Belady's MIN beside them), the same ones
``tierstore bench hits`` prints; every result carries both views (bandwidth: every read
counted; latency: resident when the layer reads).

Recommendation: with ``best(s)`` the highest hit rate any policy reaches at ``s`` slots
(in the chosen view) and ``top`` the best of the largest pool that fits on the card, the
recommended pool is the smallest ``s`` with ``best(s) >= top - tolerance``: past it, more
pool buys less than ``tolerance`` of hit rate, and the memory is better spent on KV
cache. Found on a geometric grid, then refined by bisection between the two grid points
around it (``best`` grows with the pool for demand fill). A pool under the fire floor is
refused by the engines, so the recommendation is raised to the floor when it falls
under it (``raised_to_floor``). The policy is the one reaching ``best`` there. A trace
recorded on another model is mapped by share of experts: its
key space is scaled to the planned model's (``scale``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tierstore.errors import ConfigError

DEFAULT_POLICIES = ("lru", "heat", "hybrid", "auto", "freq")
CEILING = "belady"
VIEWS = ("latency", "bandwidth")


def geometric_grid(n_keys: int, max_slots: int, points: int = 12) -> list[int]:
    """About ``points`` pool sizes from n_keys / 128 to ``max_slots`` (<= n_keys), even on
    a log scale, the largest always included."""
    hi = max(1, min(int(max_slots), int(n_keys)))
    lo = max(1, min(hi, n_keys // 128))
    if hi == lo:
        return [hi]
    ratio = (hi / lo) ** (1 / max(points - 1, 1))
    grid = sorted({max(1, min(hi, int(round(lo * ratio**i)))) for i in range(points)} | {hi})
    return grid


@dataclass
class Curve:
    trace: str
    trace_keys: int
    model_keys: int
    view: str
    tolerance: float
    feasible: int  # largest trace pool that fits (trace slots)
    grid: list = field(default_factory=list)
    results: list = field(default_factory=list)  # sim Results (grid + refinement points)
    recommended: dict | None = None

    @property
    def scale(self) -> float:
        return self.model_keys / self.trace_keys

    def model_slots(self, slots: int) -> int:
        return int(round(slots * self.scale))

    def hit(self, r) -> float:
        return r.latency_hit_rate if self.view == "latency" else r.bandwidth_hit_rate

    def as_dict(self) -> dict:
        rows = [
            {
                "policy": r.policy,
                "slots": r.slots,
                "model_slots": self.model_slots(r.slots),
                "latency_hit_rate": r.latency_hit_rate,
                "bandwidth_hit_rate": r.bandwidth_hit_rate,
                "reads_per_tick": r.reads_per_tick,
                "on_grid": r.slots in self.grid,
            }
            for r in sorted(self.results, key=lambda r: (r.slots, r.policy))
        ]
        return {
            "trace": self.trace,
            "trace_keys": self.trace_keys,
            "model_keys": self.model_keys,
            "scale": self.scale,
            "view": self.view,
            "tolerance": self.tolerance,
            "feasible_slots": self.feasible,
            "grid": self.grid,
            "results": rows,
            "recommended": self.recommended,
        }


class _Replays:
    """Results by (policy, slots), replayed on demand, the trace prepared once."""

    def __init__(self, trace, policies, granularity: str, progress=None):
        from tierstore import sim

        self.prep = sim.Prepared(trace)
        self.policies = list(policies)
        self.granularity = granularity
        self.progress = progress
        self.by: dict[tuple[str, int], object] = {}

    def at(self, slots: int) -> list:
        from tierstore import sim

        if (self.policies[0], slots) not in self.by:
            for r in sim.replay(self.prep, self.policies + [CEILING], [slots], granularity=self.granularity):
                self.by[(r.policy, slots)] = r
            if self.progress is not None:
                self.progress(slots)
        return [self.by[(p, slots)] for p in self.policies + [CEILING]]


def hit_curve(
    trace,
    *,
    model_keys: int,
    feasible_model_slots: int,
    floor_model_slots: int = 0,
    policies=DEFAULT_POLICIES,
    view: str = "latency",
    tolerance: float = 0.01,
    points: int = 12,
    granularity: str = "layer",
    progress=None,
) -> Curve:
    """Replay ``trace`` over a grid of pools up to what fits, and recommend one (module
    doc). ``model_keys``: the planned model's (layers x experts); ``feasible_model_slots``:
    the largest pool the card holds for it."""
    if view not in VIEWS:
        raise ConfigError(f"view {view!r}: expected one of {', '.join(VIEWS)}")
    if not (0 <= tolerance < 1) or not math.isfinite(tolerance):
        raise ConfigError(f"tolerance must be in [0, 1), found {tolerance!r}")
    from tierstore import sim

    sim.check_policy_names(list(policies))
    bad = [p for p in policies if p in ("belady", "belady_skip", "unbounded")]
    if bad:
        raise ConfigError(
            f"policies: {', '.join(bad)} is a ceiling, not a policy to recommend (MIN is always shown)"
        )
    if trace.n_rows == 0:
        raise ConfigError(f"{trace.name}: no routed rows to replay")
    curve = Curve(
        trace=trace.name,
        trace_keys=trace.n_keys,
        model_keys=int(model_keys),
        view=view,
        tolerance=float(tolerance),
        feasible=0,
    )
    curve.feasible = min(trace.n_keys, int(math.floor(feasible_model_slots / curve.scale)))
    replays = _Replays(trace, policies, granularity, progress)
    top_size = curve.feasible if curve.feasible >= 1 else trace.n_keys
    curve.grid = geometric_grid(trace.n_keys, top_size, points)
    for s in curve.grid:
        replays.at(s)
    if curve.feasible >= 1:
        floor = min(int(math.ceil(floor_model_slots / curve.scale)), curve.feasible)
        curve.recommended = _recommend(curve, replays, floor)
    curve.results = list(replays.by.values())
    return curve


def _best(curve: Curve, results) -> tuple[float, str]:
    ranked = [r for r in results if r.policy != CEILING]
    best = max(ranked, key=lambda r: (curve.hit(r), -ranked.index(r)))
    return curve.hit(best), best.policy


def _recommend(curve: Curve, replays: _Replays, floor: int = 0) -> dict:
    grid = curve.grid
    top, _ = _best(curve, replays.at(grid[-1]))
    target = top - curve.tolerance
    i = next(j for j, s in enumerate(grid) if _best(curve, replays.at(s))[0] >= target)
    lo, hi = (grid[i - 1], grid[i]) if i else (0, grid[0])
    while hi - lo > 1:  # the smallest pool in (lo, hi] reaching the target
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _best(curve, replays.at(mid))[0] >= target else (mid, hi)
    knee, raised = hi, hi < floor
    hi = max(hi, floor)
    hit, policy = _best(curve, replays.at(hi))
    mn = next(r for r in replays.at(hi) if r.policy == CEILING)
    return {
        "slots": hi,
        "model_slots": curve.model_slots(hi),
        "policy": policy,
        "hit_rate": hit,
        "min_hit_rate": curve.hit(mn),
        "target": target,
        "top_hit_rate": top,
        "top_slots": grid[-1],
        "knee_slots": knee,
        "raised_to_floor": raised,
    }
