"""UncertaintyGate decisions on hand-built logits, and properties of the rule."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from adapter_helpers import one_torch_thread  # noqa: F401
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from tierstore.compute.gate import DEFAULT_TAU, GateStats, UncertaintyGate
from tierstore.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_defaults_match_vllm_moet():
    assert UncertaintyGate().tau == 0.60 and UncertaintyGate().signal == "top1"
    assert UncertaintyGate("margin").tau == 1.5


def test_top1_exact_threshold_fires_at_equality():
    even = torch.zeros(1, 2)  # two equal logits: p_top1 = 0.5 exactly
    assert UncertaintyGate("top1", tau=0.5).decide(even)
    assert not UncertaintyGate("top1", tau=0.4999).decide(even)


def test_top1_three_way_tie_has_probability_one_third():
    tie = torch.tensor([[2.0, 2.0, 2.0, -50.0]])
    conf = UncertaintyGate().confidence(tie)
    assert conf.item() == pytest.approx(1 / 3, abs=1e-6)


def test_margin_exact_threshold_fires_at_equality():
    logits = torch.tensor([[3.0, 1.5, 0.0]])  # margin 1.5 exactly in binary floating point
    assert UncertaintyGate("margin", tau=1.5).decide(logits)
    assert not UncertaintyGate("margin", tau=1.4990234375).decide(logits)


def test_margin_tie_of_top_two_is_zero_and_fires():
    logits = torch.tensor([[5.0, 5.0, 1.0]])
    g = UncertaintyGate("margin", tau=0.0)
    assert g.confidence(logits).item() == 0.0 and g.decide(logits)


def test_one_uncertain_row_among_confident_rows_fires():
    confident = torch.tensor([20.0, 0.0, 0.0, 0.0])
    unsure = torch.tensor([1.0, 1.0, 0.5, 0.0])
    g = UncertaintyGate()
    assert not g.decide(torch.stack([confident, confident, confident]))
    assert g.decide(torch.stack([confident, unsure, confident]))
    assert g.row_mask(torch.stack([confident, unsure, confident])).tolist() == [False, True, False]


def test_nan_row_counts_as_uncertain_and_empty_batch_never_fires():
    g = UncertaintyGate()
    nan = torch.tensor([[20.0, 0.0], [math.nan, 0.0]])
    assert g.decide(nan)
    assert not g.decide(torch.zeros(0, 8))
    assert not UncertaintyGate("margin").decide(torch.zeros(0, 8))


def test_vocab_of_one_is_certain():
    assert not UncertaintyGate().decide(torch.zeros(3, 1))
    assert not UncertaintyGate("margin", tau=1e9).decide(torch.zeros(3, 1))


def test_bf16_logits_are_decided_in_float32():
    # bf16 cannot hold 0.6 of a 2-way softmax exactly, float32 logsumexp can
    logits = torch.tensor([[math.log(1.5), 0.0]]).to(torch.bfloat16)
    conf = UncertaintyGate().confidence(logits)
    assert conf.dtype == torch.float32
    ref = 1 / (1 + math.exp(-float(logits[0, 0])))
    assert conf.item() == pytest.approx(ref, rel=1e-6)


def test_fire_mask_is_a_device_bool_scalar_with_no_counting():
    g = UncertaintyGate()
    m = g.fire_mask(torch.zeros(4, 10))
    assert m.dtype == torch.bool and m.dim() == 0 and m.device == torch.device("cpu")
    assert bool(m) and g.stats().steps == 0


def test_prefill_never_fires_and_is_not_counted():
    g = UncertaintyGate()
    assert not g.should_fire(torch.zeros(2, 4), decode=False)
    assert g.stats() == GateStats()


def test_should_fire_counts_steps_and_fires():
    g = UncertaintyGate()
    for logits in (torch.zeros(1, 4), torch.tensor([[30.0, 0, 0, 0]]), torch.zeros(1, 4)):
        g.should_fire(logits)
    s = g.stats()
    assert (s.steps, s.fires) == (3, 2) and s.fire_rate == pytest.approx(2 / 3)
    g.reset_stats()
    assert g.stats().fire_rate == 0.0


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(signal="entropy"), "gate signal 'entropy'"),
        (dict(signal="top1", tau=1.5), "gate tau (signal 'top1') must be a fraction in [0, 1], found 1.5"),
        (
            dict(signal="margin", tau=float("nan")),
            "gate tau (signal 'margin') must be a finite number, found nan",
        ),
        (dict(signal="margin", tau=float("inf")), "must be a finite number, found inf"),
        (dict(signal="top1", tau="0.5"), "must be a fraction in [0, 1], found '0.5'"),
        (dict(signal="top1", tau=True), "found True"),
    ],
)
def test_bad_settings_raise_config_error_naming_the_value(kwargs, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        UncertaintyGate(**kwargs)


def test_bad_logits_shape_is_a_config_error():
    with pytest.raises(ConfigError, match=r"expected shape \[rows, vocab>0\], found \(2, 3, 4\)"):
        UncertaintyGate().confidence(torch.zeros(2, 3, 4))


# -- properties ---------------------------------------------------------------
finite = st.floats(-30, 30, allow_nan=False, width=32)
logit_batches = st.integers(1, 6).flatmap(
    lambda rows: st.integers(2, 12).flatmap(lambda vocab: arrays(np.float32, (rows, vocab), elements=finite))
)


def reference_confidence(logits: np.ndarray, signal: str) -> np.ndarray:
    x = logits.astype(np.float64)
    if signal == "top1":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e.max(axis=1) / e.sum(axis=1)
    s = np.sort(x, axis=1)
    return s[:, -1] - s[:, -2]


@settings(max_examples=40, deadline=None)
@given(logit_batches, st.sampled_from(["top1", "margin"]))
def test_confidence_matches_float64_reference(logits, signal):
    conf = UncertaintyGate(signal).confidence(torch.from_numpy(logits)).numpy()
    np.testing.assert_allclose(conf, reference_confidence(logits, signal), rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(logit_batches, st.sampled_from(["top1", "margin"]), st.floats(0, 1), st.floats(0, 1))
def test_firing_is_monotone_in_tau(logits, signal, a, b):
    scale = 1.0 if signal == "top1" else 10.0
    lo, hi = sorted((a * scale, b * scale))
    t = torch.from_numpy(logits)
    if UncertaintyGate(signal, tau=lo).decide(t):
        assert UncertaintyGate(signal, tau=hi).decide(t)


@st.composite
def two_batches_same_vocab(draw):
    vocab = draw(st.integers(2, 12))
    return tuple(
        draw(arrays(np.float32, (draw(st.integers(1, 4)), vocab), elements=finite)) for _ in range(2)
    )


@settings(max_examples=40, deadline=None)
@given(two_batches_same_vocab(), st.sampled_from(["top1", "margin"]))
def test_decision_is_the_or_over_rows_and_ignores_row_order(batches, signal):
    a, b = batches
    g = UncertaintyGate(signal)
    both = torch.from_numpy(np.concatenate([a, b]))
    assert g.decide(both) == (g.decide(torch.from_numpy(a)) or g.decide(torch.from_numpy(b)))
    assert g.decide(both.flip(0)) == g.decide(both)


@settings(max_examples=40, deadline=None)
@given(logit_batches, st.sampled_from(["top1", "margin"]), st.integers(-8, 8))
def test_decision_matches_reference_and_is_shift_invariant(logits, signal, shift):
    g = UncertaintyGate(signal)
    ref = reference_confidence(logits, signal)
    assume(np.all(np.abs(ref - g.tau) > 1e-4))  # away from the knife edge of float rounding
    expected = bool((ref <= g.tau).any())
    assert g.decide(torch.from_numpy(logits)) == expected
    assert g.decide(torch.from_numpy(logits) + shift) == expected


def test_default_tau_table_covers_both_signals():
    assert set(DEFAULT_TAU) == {"top1", "margin"}
