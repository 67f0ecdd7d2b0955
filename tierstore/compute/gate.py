"""The uncertainty gate: decide from a decode step's logits whether it *fires*.

A fire promotes the step's routed experts to the FP4 pool and re-runs the step
(vLLM-Moet semantics, its moe_w2_gate.py; docs/INTERNALS.md "gate"):

* signal ``"top1"``: the top-1 softmax probability of each row; the step fires
  when the minimum over rows is ``<= tau`` (default 0.60);
* signal ``"margin"``: the top-1 minus top-2 logit gap of each row (nats); the
  step fires when the minimum over rows is ``<= tau`` (default 1.5).

Only decode steps fire (a prefill's logits are not a confidence signal worth a
re-run). A row whose confidence is NaN (broken logits) counts as uncertain: the
comparison is written as ``not (confidence > tau)`` so NaN fires.

Everything up to the final ``bool`` stays on the logits' device:
:meth:`UncertaintyGate.fire_mask` returns a 0-d device bool tensor (usable in
a CUDA graph or fused into later device work); :meth:`should_fire` is the one
call that syncs the host, because its caller needs a Python decision.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import msgspec
import torch

from tierstore import settings
from tierstore.errors import ConfigError

DEFAULT_TAU = {"top1": 0.60, "margin": 1.5}


class GateStats(msgspec.Struct, frozen=True):
    """Counters of one gate since construction (or ``reset_stats``).

    steps: decode steps decided; fires: steps whose first decision fired;
    rounds: re-runs done by fires (<= fires * max_rounds); promoted: experts newly
    made resident by fires; still_uncertain: fires whose last re-run still fired.
    """

    steps: int = 0
    fires: int = 0
    rounds: int = 0
    promoted: int = 0
    still_uncertain: int = 0

    @property
    def fire_rate(self) -> float:
        return self.fires / self.steps if self.steps else 0.0

    @property
    def rounds_per_fire(self) -> float:
        return self.rounds / self.fires if self.fires else 0.0

    @property
    def promoted_per_fire(self) -> float:
        return self.promoted / self.fires if self.fires else 0.0


class FireRecord(msgspec.Struct, frozen=True):
    """What :func:`run_with_gate` did for one step.

    confidence: the minimum row confidence after each run (len = rounds + 1),
    promoted: experts newly promoted in each round, seconds: wall time of the
    whole step including re-runs.
    """

    fired: bool
    rounds: int
    promoted: tuple[int, ...]
    confidence: tuple[float, ...]
    still_uncertain: bool
    seconds: float

    @property
    def total_promoted(self) -> int:
        return sum(self.promoted)


class UncertaintyGate:
    """Fire decision for decode steps from logits ``[rows, vocab]``.

    Thread safety: the counters are plain ints; use one gate per engine loop.
    """

    def __init__(self, signal: str = "top1", tau: float | None = None):
        if signal not in DEFAULT_TAU:
            raise ConfigError(f"gate signal {signal!r}: expected one of {sorted(DEFAULT_TAU)}")
        # top1 is a probability; a margin any finite number (settings' one validation)
        tau = (
            DEFAULT_TAU[signal]
            if tau is None
            else settings.argument(
                f"gate tau (signal {signal!r})",
                tau,
                settings.fraction if signal == "top1" else settings.number(),
            )
        )
        self.signal = signal
        self.tau = tau
        self._stats = GateStats()

    def __repr__(self) -> str:
        return f"UncertaintyGate(signal={self.signal!r}, tau={self.tau})"

    # -- device-side decision ------------------------------------------------
    def confidence(self, logits: torch.Tensor) -> torch.Tensor:
        """float32 [rows] on the logits' device: top-1 probability or top1-top2 margin.

        Computed in float32 whatever the logits' dtype (bf16 softmax of a 150k vocab
        loses the very digits the threshold looks at). A vocab of one has
        probability 1 and an infinite margin (nothing to be unsure between).
        """
        if logits.dim() == 1:
            logits = logits.unsqueeze(0)
        if logits.dim() != 2 or logits.shape[1] == 0:
            raise ConfigError(f"gate logits: expected shape [rows, vocab>0], found {tuple(logits.shape)}")
        lf = logits.float()
        if self.signal == "top1":
            # p_top1 = exp(max - logsumexp): no [rows, vocab] softmax materialised.
            return torch.exp(lf.amax(dim=1) - torch.logsumexp(lf, dim=1))
        if lf.shape[1] == 1:
            return torch.full((lf.shape[0],), math.inf, device=lf.device)
        top2 = lf.topk(2, dim=1).values
        return top2[:, 0] - top2[:, 1]

    def row_mask(self, logits: torch.Tensor) -> torch.Tensor:
        """Device bool [rows]: rows that are uncertain on their own (NaN counts as uncertain)."""
        return ~(self.confidence(logits) > self.tau)

    def fire_mask(self, logits: torch.Tensor) -> torch.Tensor:
        """Device bool 0-d tensor: does the step fire? No host sync; no counters.

        An empty batch (0 rows) never fires.
        """
        return self.row_mask(logits).any()

    # -- host decision -------------------------------------------------------
    def decide(self, logits: torch.Tensor, *, decode: bool = True) -> bool:
        """The fire decision as a Python bool (one host sync); counters untouched."""
        if not decode:
            return False
        return bool(self.fire_mask(logits).item())

    def should_fire(self, logits: torch.Tensor, *, decode: bool = True) -> bool:
        """Decide one step and count it (decode steps only: a prefill never fires
        and is not counted). One host sync."""
        if not decode:
            return False
        fired = self.decide(logits)
        self.note_step(fired)
        return fired

    # -- counters ------------------------------------------------------------
    def note_step(
        self, fired: bool, rounds: int = 0, promoted: int = 0, still_uncertain: bool = False
    ) -> None:
        """Count one decode step decided elsewhere (e.g. on the device by fire_mask)."""
        s = self._stats
        self._stats = GateStats(
            steps=s.steps + 1,
            fires=s.fires + bool(fired),
            rounds=s.rounds + int(rounds),
            promoted=s.promoted + int(promoted),
            still_uncertain=s.still_uncertain + bool(still_uncertain),
        )

    def stats(self) -> GateStats:
        return self._stats

    def reset_stats(self) -> None:
        self._stats = GateStats()


def promoted_count(fire_result: Any) -> int:
    """Experts a ``store.fire`` result newly made resident (0 if it says nothing)."""
    n = getattr(fire_result, "promoted", 0)
    if isinstance(n, (int, float)):
        return int(n)
    try:
        return len(n)
    except TypeError:
        return int(n)


def run_with_gate(
    step_fn: Callable[[], Any],
    gate: UncertaintyGate,
    store: Any,
    routed_fn: Callable[[], Any],
    *,
    max_rounds: int = 3,
    max_promote: int | None = None,
    logits_of: Callable[[Any], torch.Tensor] | None = None,
    decode: bool = True,
) -> tuple[Any, FireRecord]:
    """Run one decode step under the gate; re-run it after promotions while unsure.

    1. ``out = step_fn()``; the gate reads ``logits_of(out)`` (default: ``out``).
    2. While it fires and fewer than ``max_rounds`` re-runs were made: promote the
       step's routed experts, ``store.fire(routed_fn(), max_promote)`` (synchronous:
       resident and pinned on return), and re-run ``step_fn``. A round that
       promotes nothing new stops the loop: a re-run would give the same output.
    3. Every fire's pins are released at the end (also on error), so round 2's
       promotions never evict round 1's mid-step.

    ``routed_fn()`` returns the (layer, expert) pairs the *last* run routed
    (e.g. ``ServingTier.seen_pairs()``), as an int tensor/array [N, 2].
    Returns ``(final_out, FireRecord)``; the gate's counters are updated.
    """
    if max_rounds < 0:
        raise ConfigError(f"run_with_gate max_rounds {max_rounds}: expected >= 0")
    logits_of = logits_of or (lambda o: o)
    t0 = time.perf_counter()
    out = step_fn()
    if not decode:
        return out, FireRecord(False, 0, (), (), False, time.perf_counter() - t0)
    fires: list[Any] = []
    promoted: list[int] = []
    confidence: list[float] = []
    try:
        while True:
            conf = gate.confidence(logits_of(out))
            # one host read per run: the minimum row confidence (NaN -> fires)
            worst = float(conf.min().item()) if conf.numel() else math.inf
            confidence.append(worst)
            firing = not (worst > gate.tau)
            if not firing or len(fires) >= max_rounds:
                break
            result = store.fire(routed_fn(), max_promote=max_promote)
            fires.append(result)
            n_new = promoted_count(result)
            promoted.append(n_new)
            if n_new == 0:
                break  # nothing changed: the re-run would reproduce the same logits
            out = step_fn()
    finally:
        for result in reversed(fires):
            store.release(result)
    fired = not (confidence[0] > gate.tau)
    rounds = sum(1 for n in promoted if n > 0)
    still = fired and not (confidence[-1] > gate.tau)
    gate.note_step(fired, rounds, sum(promoted), still)
    return out, FireRecord(fired, rounds, tuple(promoted), tuple(confidence), still, time.perf_counter() - t0)
