"""VLLM_MOE_W2_* parsing: every variable, good and malformed values, one error for all."""
from __future__ import annotations

import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore.adapters.moet_config import POLICY_MAP, VARIABLES, MoetConfig, config_from_env
from tierstore.errors import ConfigError

P = "VLLM_MOE_W2_"

# variable suffix -> (good raw value, parsed field value), malformed raw value
CASES = {
    "STORE_DIR": (("/data/packs", "/data/packs"), None),
    "DELTA_GB": (("6", 6.0), "six"),
    "DELTA_RESERVE_GB": (("2.5", 2.5), "-1"),
    "DELTA_MAX_GB": (("24", 24.0), "inf"),
    "DELTA_PROMOTE": (("16", 16), "1.5"),
    "DELTA_POLICY": (("LRU", "lru"), "arc"),
    "DELTA_DECAY": (("0.25", 0.25), "0"),
    "DELTA_DECAY_S": (("2", 2.0), "0"),
    "GATE": (("0", False), "maybe"),
    "GATE_MAX_PROMOTE": (("32", 32), "0"),
    "FORCE_POOL": (("1", True), "2"),
    "BASE_RAM_GB": (("48", 48.0), "nan"),
    "TIER_DIRECT": (("1", "on"), "sometimes"),
    "TIER_PREHEAT": (("off", False), "-"),
    "TIER_SCAN": (("false", False), "yes please"),
    "STORE_THREADS": (("4", 4), "0"),
    "POOL_HEAT": (("0", False), "zero"),
    "POOL_HEAT_DIR": (("/var/heat", "/var/heat"), None),
    "POOL_HEAT_EVERY_S": (("30", 30.0), "-5"),
    "POOL_HEAT_FILL": (("0.5", 0.5), "1.01"),
}
FIELD = {suffix: suffix.lower() for suffix in CASES}


def test_every_documented_variable_is_read():
    assert set(VARIABLES) == {P + s for s in CASES}


def test_defaults_match_compat_md():
    c = config_from_env({})
    assert (c.delta_gb, c.delta_reserve_gb, c.delta_max_gb, c.delta_promote) == (None, 3.0, 0.0, 8)
    assert (c.delta_policy, c.delta_decay, c.delta_decay_s) == ("freq", 0.5, 5.0)
    assert (c.gate, c.gate_max_promote, c.force_pool, c.base_ram_gb) == (True, 64, False, None)
    assert (c.tier_preheat, c.tier_scan, c.store_threads) == (True, True, 8)
    assert (c.pool_heat, c.pool_heat_every_s, c.pool_heat_fill) == (True, 10.0, 0.9)
    assert c.tierstore_policy == "heat" and c.half_life_s == pytest.approx(5.0)


@pytest.mark.parametrize("suffix", sorted(CASES))
def test_good_value_is_parsed(suffix):
    (raw, value), _bad = CASES[suffix]
    assert getattr(config_from_env({P + suffix: raw}), FIELD[suffix]) == value


@pytest.mark.parametrize("suffix", sorted(s for s, (_g, bad) in CASES.items() if bad is not None))
def test_malformed_value_error_names_variable_and_value(suffix):
    bad = CASES[suffix][1]
    with pytest.raises(ConfigError) as err:
        config_from_env({P + suffix: bad})
    assert f"{P}{suffix}={bad!r}" in str(err.value)


def test_all_malformed_values_are_reported_in_one_error():
    env = {P + s: bad for s, (_g, bad) in CASES.items() if bad is not None}
    with pytest.raises(ConfigError) as err:
        config_from_env(env)
    text = str(err.value)
    assert all(f"{var}=" in text for var in env) and text.count(";") == len(env) - 1


@pytest.mark.parametrize("raw", ["auto", "AUTO", " auto "])
def test_gib_variables_accept_auto(raw):
    c = config_from_env({P + "DELTA_GB": raw, P + "BASE_RAM_GB": raw})
    assert c.delta_gb is None and c.base_ram_gb is None


def test_policy_names_map_onto_tierstore_policies():
    got = {name: config_from_env({P + "DELTA_POLICY": name}).tierstore_policy for name in POLICY_MAP}
    assert got == {"freq": "heat", "need": "hybrid", "lru": "lru"}


def test_decay_converts_to_a_half_life():
    c = config_from_env({P + "DELTA_DECAY": "0.25", P + "DELTA_DECAY_S": "10"})
    assert c.half_life_s == pytest.approx(5.0)  # 0.25 per 10 s = 0.5 per 5 s


def test_heat_dir_falls_back_to_the_store_dir():
    assert config_from_env({P + "STORE_DIR": "/s"}).heat_dir == "/s"
    assert config_from_env({P + "STORE_DIR": "/s", P + "POOL_HEAT_DIR": "/h"}).heat_dir == "/h"


def test_unknown_variable_warns_once_naming_it_and_other_env_is_ignored():
    with pytest.warns(RuntimeWarning, match="VLLM_MOE_W2_DELTA_GBS"):
        config_from_env({P + "DELTA_GBS": "6", "HOME": "/root"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config_from_env({"VLLM_OTHER": "x"})


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv(P + "GATE_MAX_PROMOTE", "12")
    assert config_from_env().gate_max_promote == 12


configs = st.builds(
    MoetConfig,
    store_dir=st.one_of(st.none(), st.sampled_from(["/a", "/b/c"])),
    delta_gb=st.one_of(st.none(), st.floats(0, 1e3)),
    delta_policy=st.sampled_from(sorted(POLICY_MAP)),
    delta_decay=st.floats(0.01, 1.0),
    gate=st.booleans(), force_pool=st.booleans(),
    gate_max_promote=st.integers(1, 4096), store_threads=st.integers(1, 1024),
    base_ram_gb=st.one_of(st.none(), st.floats(0, 1e4)),
    tier_direct=st.sampled_from(["on", "off", "auto"]),
    pool_heat_fill=st.floats(0, 1),
)


@settings(max_examples=50, deadline=None)
@given(configs)
def test_config_round_trips_through_the_environment(cfg):
    assert config_from_env(cfg.as_env()) == cfg
