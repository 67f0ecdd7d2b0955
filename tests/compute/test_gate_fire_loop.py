"""run_with_gate against a real ExpertStore: rounds, caps, pins, counters."""

from __future__ import annotations

import pytest
import torch
from adapter_helpers import TinyDecoder, make_tier, model_and_dir, one_torch_thread  # noqa: F401

from tierstore.compute.gate import UncertaintyGate, run_with_gate
from tierstore.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def setup():
    model, d = model_and_dir()
    tier = make_tier(d, slots=24)
    decoder = TinyDecoder(model, top_k=2)
    yield model, tier, decoder
    tier.shutdown()


def stepper(tier, decoder, x, calls):
    def step():
        calls.append(int((tier.store.slot_table >= 0).sum()))
        return decoder.forward(tier, x)

    return step


def pins(tier) -> int:
    """Resident keys still pinned: the ones evict() refuses (called at a test's end)."""
    resident = tier.store.resident_keys()
    return len(resident) - tier.store.evict(resident) if len(resident) else 0


def test_confident_step_runs_once_and_touches_nothing(setup):
    model, tier, decoder = setup
    calls = []
    gate = UncertaintyGate(tau=0.0)
    out, rec = run_with_gate(
        stepper(tier, decoder, model.tokens(2), calls), gate, tier.store, tier.seen_pairs
    )
    assert len(calls) == 1 and not rec.fired and rec.rounds == 0 and rec.promoted == ()
    assert tier.store.stats().fires == 0 and gate.stats().steps == 1


def test_uncertain_step_promotes_reruns_and_releases_every_pin(setup):
    model, tier, decoder = setup
    calls = []
    gate = UncertaintyGate(tau=1.0)  # always unsure: runs until nothing is new
    out, rec = run_with_gate(
        stepper(tier, decoder, model.tokens(2), calls), gate, tier.store, tier.seen_pairs, max_rounds=5
    )
    assert rec.fired and rec.rounds >= 1 and rec.total_promoted > 0
    assert len(calls) == rec.rounds + 1  # one re-run per productive round
    assert calls == sorted(calls) and calls[-1] > calls[0]  # residency only grew between runs
    assert len(rec.confidence) == rec.rounds + 1 and rec.still_uncertain
    assert pins(tier) == 0
    s = gate.stats()
    assert (s.steps, s.fires, s.rounds, s.promoted) == (1, 1, rec.rounds, rec.total_promoted)


@pytest.mark.parametrize("max_rounds", [0, 1, 2])
def test_rounds_never_exceed_max_rounds(setup, max_rounds):
    model, tier, decoder = setup
    calls = []
    _out, rec = run_with_gate(
        stepper(tier, decoder, model.tokens(4, seed=2), calls),
        UncertaintyGate(tau=1.0),
        tier.store,
        tier.seen_pairs,
        max_rounds=max_rounds,
    )
    assert rec.rounds <= max_rounds and len(calls) == rec.rounds + 1 and rec.fired


def test_max_promote_caps_each_round(setup):
    model, tier, decoder = setup
    _out, rec = run_with_gate(
        stepper(tier, decoder, model.tokens(4, seed=3), []),
        UncertaintyGate(tau=1.0),
        tier.store,
        tier.seen_pairs,
        max_rounds=3,
        max_promote=2,
    )
    assert rec.promoted and max(rec.promoted) <= 2


def test_pins_are_released_when_the_rerun_raises(setup):
    model, tier, decoder = setup
    runs = []

    def step():
        runs.append(1)
        if len(runs) == 2:
            raise RuntimeError("re-run failed")
        return decoder.forward(tier, model.tokens(2))

    with pytest.raises(RuntimeError, match="re-run failed"):
        run_with_gate(step, UncertaintyGate(tau=1.0), tier.store, tier.seen_pairs)
    assert pins(tier) == 0 and tier.store.stats().fires == 1
    tier.store.check_invariants()


def test_prefill_is_never_gated(setup):
    model, tier, decoder = setup
    gate = UncertaintyGate(tau=1.0)
    _out, rec = run_with_gate(
        lambda: decoder.forward(tier, model.tokens(2)), gate, tier.store, tier.seen_pairs, decode=False
    )
    assert not rec.fired and gate.stats().steps == 0


def test_logits_of_selects_the_logits_from_a_richer_step_output(setup):
    model, tier, decoder = setup
    out, rec = run_with_gate(
        lambda: {"logits": torch.zeros(1, 4), "extra": 1},
        UncertaintyGate(),
        tier.store,
        tier.seen_pairs,
        logits_of=lambda o: o["logits"],
        max_rounds=0,
    )
    assert out["extra"] == 1 and rec.fired and rec.confidence == (0.25,)


def test_negative_max_rounds_is_a_config_error(setup):
    _model, tier, _decoder = setup
    with pytest.raises(ConfigError, match="max_rounds -1"):
        run_with_gate(
            lambda: torch.zeros(1, 2), UncertaintyGate(), tier.store, tier.seen_pairs, max_rounds=-1
        )
