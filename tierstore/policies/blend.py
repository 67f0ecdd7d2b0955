"""Blend: phase (hybrid + within-tick next-use order) whose per-key use rate is the
mean of a short- and a long-term decayed rate.

One half-life has to choose between following a burst (a topic the conversation
is on: short) and remembering what keeps coming back (a popular expert, or a topic
that recurs: long). Blend keeps both, ``lam = (lam_h + lam_H) / 2`` with ``H =
LONG_RATIO * h``, and orders keys by phase's expected next-use distance
``off / L + 1 / lam`` (policies/phase.py). A key in the current burst ranks by its
short rate (the long one adds at most half), a key that keeps coming back stays
above one seen once in a burst long ago. Admission is hybrid's on the short heat
(a candidate displaces its victim only when strictly hotter).

Why the mean of rates: it is the use rate of a key that behaves like its recent
past half of the time and like its long past the other half, the smallest change
to phase that has both memories, with no weight to tune.

The rules run natively (kind 4 of csrc/store/include/tierstore/store/policy.hpp, behind
policies/native.py): the long heat is a second raw array on the same clock, with its
own renormalisation. On the wall clock both heats share one start time.

Where it stands: on FLAME and on the synthetic DS4 trace the best fixed policy in
hindsight is a blend (64 steps on FLAME, 2-4 on DS4; a phase on some held-out synthetic
settings), which is why five of auto's nine experts are blends (``bench/hits_eval.py``,
bench/RESULTS.md).
"""

from __future__ import annotations

from tierstore.policies.phase import PhasePolicy

LONG_RATIO = 32.0  # the long half-life, in short ones


class BlendPolicy(PhasePolicy):
    name = "blend"
    kind = 4
    blends = True

    def _core_half_life2(self) -> float:
        return LONG_RATIO * self.half_life

    @property
    def long_half_life(self) -> float:
        return LONG_RATIO * self.half_life

    def check_invariants(self) -> None:
        super().check_invariants()
        assert float(self._raw2.min(initial=0.0)) >= 0.0, "negative long heat"
