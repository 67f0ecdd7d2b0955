"""VLLM_MOE_W2_* parsing with vLLM-Moet's meanings (its moe_w2_delta / moe_w2_gate / moe_w2_store)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore.adapters.moet_config import BASE_ONLY, VARIABLES, from_env
from tierstore.errors import ConfigError

P = "VLLM_MOE_W2_"
SLOT = 12 << 20  # DS4's standalone FP4 slot


def test_defaults_are_vllm_moets():
    e = from_env({})
    assert e.delta and e.delta_gb_raw == "2.0" and e.delta_gb == 2.0 and not e.delta_auto
    assert e.enabled and e.initial_slots(SLOT) == 170  # 2 GiB / 12 MiB
    assert (e.reserve_gb, e.max_gb, e.promote_per_pass, e.tick_s) == (3.0, 0.0, 8, 0.005)
    assert (e.policy, e.decay, e.decay_s, e.rank, e.promo_hyst) == ("freq", 0.5, 5.0, "step_w", 0.0)
    assert e.gate is False  # unset = off
    assert (e.gate_max_promote, e.step_budget, e.gate_fp_max) == (64, 64, 3)
    assert e.gate_reforward and not e.gate_capture and not e.force_pool
    assert (e.store_dir, e.store_threads, e.ckpt_id, e.zero_mode) == ("", 8, "", "auto")
    assert e.layer_rows == 44 and e.prefill_t == 96 and not e.count_seen
    assert e.half_life_s == pytest.approx(5.0)
    assert not e.tierstore and e.ts_direct == "off" and e.ts_ram_gb == 0.0


@pytest.mark.parametrize("raw", ["auto", "AUTO", " -1 ", "-1.0"])
def test_delta_gb_auto_spellings(raw):
    e = from_env({P + "DELTA_GB": raw})
    assert e.delta_auto and e.enabled and e.initial_slots(SLOT) == 0


@pytest.mark.parametrize("raw", ["0", "0.0", "-2", "-0.5"])
def test_delta_gb_not_positive_means_no_fp4_tier(raw):
    assert not from_env({P + "DELTA_GB": raw}).enabled


def test_explicit_sizes_have_an_8_slot_minimum():
    assert from_env({P + "DELTA_GB": "0.01"}).initial_slots(SLOT) == 8
    assert from_env({P + "DELTA_GB": "6"}).initial_slots(SLOT) == 512


def test_delta_other_than_1_turns_the_tier_off():
    assert not from_env({P + "DELTA": "0"}).enabled
    assert not from_env({P + "DELTA": "true"}).enabled  # only "1" counts


def test_over_the_base_cache_delta_gb_must_be_explicit_and_positive():
    assert not from_env({P + "BASE_CACHE_GB": "20"}).enabled
    assert not from_env({P + "BASE_CACHE_GB": "20", P + "DELTA_GB": "auto"}).enabled
    e = from_env({P + "BASE_CACHE_GB": "20", P + "DELTA_GB": "4"})
    assert e.enabled and e.tier_policy() == "need"
    assert from_env({P + "BASE_CACHE_GB": "20", P + "DELTA_POLICY": "freq"}).tier_policy() == "freq"


@pytest.mark.parametrize("raw, armed", [("1", True), ("0", False), ("true", False), ("yes", False)])
def test_gate_only_1_arms(raw, armed):
    assert from_env({P + "GATE": raw}).gate is armed


@pytest.mark.parametrize("raw, budget", [("64", 64), ("1", 1), ("0", None), ("-5", None)])
def test_gate_max_promote_not_positive_is_unlimited(raw, budget):
    assert from_env({P + "GATE_MAX_PROMOTE": raw}).step_budget == budget


def test_fp_max_and_decay_s_are_clamped():
    assert from_env({P + "GATE_FP_MAX": "0"}).gate_fp_max == 1
    assert from_env({P + "DELTA_DECAY_S": "0.01"}).decay_s == 0.1


def test_trace_or_capture_switch_seen_to_counts():
    assert from_env({P + "DELTA_TRACE": "1"}).count_seen
    assert from_env({P + "DELTA_CAPTURE": "/tmp/x.npy"}).count_seen
    assert not from_env({P + "DELTA_TRACE": "0"}).count_seen


def test_base_tier_variables_do_not_touch_the_fp4_tier():
    base = {v: "1" for v in BASE_ONLY} | {P + "BASE_RAM_GB": "48", P + "TIER_DIRECT": "1"}
    assert from_env(base) == from_env({})
    assert not set(BASE_ONLY) & set(VARIABLES)


def test_num_layers_gives_the_slot_table_rows():
    assert from_env({P + "NUM_LAYERS": "78"}).layer_rows == 79


def test_every_bad_value_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        from_env(
            {
                P + "DELTA_GB": "six",
                P + "GATE_FP_MAX": "x",
                P + "ZERO_MODE": "typo",
                P + "DELTA_RESERVE_GB": "lots",
            }
        )
    msg = str(info.value)
    for needle in ("DELTA_GB=six", "GATE_FP_MAX=x", "ZERO_MODE=typo", "DELTA_RESERVE_GB=lots"):
        assert needle in msg


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=-8, max_value=64, allow_nan=False))
def test_any_float_delta_gb_parses_and_sizes_as_vllm_moet(gb):
    e = from_env({P + "DELTA_GB": repr(gb)})
    assert e.enabled == (gb > 0 or repr(gb) in ("-1.0",))
    if gb > 0:
        assert e.initial_slots(SLOT) == max(int(gb * 2**30) // SLOT, 8)
