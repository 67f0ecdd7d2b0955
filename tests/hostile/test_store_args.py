"""Policy knobs given to ExpertStore: a knob the chosen policy cannot use, or a value
that is not a positive finite number, is a ConfigError naming it, never silently
dropped or turned into the default (as ``policy="lru", half_life=5`` once was)."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tierstore as ts
from tierstore.testing.packs import make_random_pack


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    p = make_random_pack(tmp_path_factory.mktemp("args"), 2, 4, 4096, seed=3)
    yield p
    p.close()


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(policy="lru", half_life=5), r"half_life=5 given, but the pool policy 'lru' has no half-life"),
    (dict(policy="auto", half_life_s=2.0), r"half_life_s=2.0 given, but the pool policy 'auto'"),
    (dict(policy="LRU", half_life=1), r"pool policy 'lru' has no half-life"),
    (dict(policy={"pool": "lru"}, half_life=4), r"pool policy 'lru' has no half-life"),
    (dict(policy={"name": "lru", "half_life": 3}), r"unknown parameter\(s\) half_life"),
    (dict(policy={"name": "heat", "bogus": 1}), r"unknown parameter\(s\) bogus"),
    (dict(policy="heat", half_life=0), r"half_life must be a finite number > 0, found 0"),
    (dict(policy="heat", half_life=-2), r"half_life must be a finite number > 0"),
    (dict(policy="heat", half_life=math.nan), r"half_life must be a finite number > 0"),
    (dict(policy="heat", half_life=math.inf), r"half_life must be a finite number > 0"),
    (dict(policy="heat", half_life="x"), r"half_life must be a finite number > 0, found 'x'"),
    (dict(policy="heat", half_life=True), r"found True"),
    (dict(policy="hybrid", half_life_s=0.0), r"half_life_s must be a finite number > 0"),
    (dict(policy="heat", half_life=5, half_life_s=3), r"not both"),
    (dict(policy={"name": "heat", "half_life": -3}), r"half-life must be a positive number"),
    (dict(policy={"name": "heat", "half_life": 4}, half_life=4), r"half_life given both"),
    (dict(policy={"pool": "heat", "arena": {"name": "heat", "half_life_s": math.nan}}),
     r"half-life must be a positive number"),
    (dict(policy=5), r"pool policy must be a name"),
    (dict(policy={"name": 5}), r"pool policy must be a name"),
    (dict(policy="mru"), r"pool policy 'mru' unknown"),
    (dict(policy="phase", half_life=0), r"half_life must be a finite number > 0, found 0"),
])
def test_a_policy_knob_that_cannot_apply_is_a_config_error(pack, kwargs, pattern):
    with pytest.raises(ts.ConfigError, match=pattern) as ei:
        ts.ExpertStore(pack, vram_slots=4, device="cpu", **kwargs).close()
    assert "\n" not in str(ei.value)


@pytest.mark.parametrize("kwargs, name, half_life", [
    (dict(policy="heat", half_life=7), "heat", 7.0),
    (dict(policy="heat", half_life=np.int64(9)), "heat", 9.0),
    (dict(policy="hybrid", half_life_s=2.5), "hybrid", 2.5),
    (dict(policy="HEAT", half_life=3), "heat", 3.0),
    (dict(policy="phase", half_life=11), "phase", 11.0),
    (dict(policy="phase", half_life_s=1.5), "phase", 1.5),
])
def test_a_half_life_the_policy_uses_is_honoured(pack, kwargs, name, half_life):
    with ts.ExpertStore(pack, vram_slots=4, device="cpu", **kwargs) as store:
        assert store.pool_policy.name == name and store.pool_policy.half_life == half_life
