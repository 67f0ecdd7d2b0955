"""The Python faces over the native rules (tierstore/policies/native.py): what a face
adds to the core (the wall clock, key and weight checks, the resident count) behaves
as the policy contract says, and every policy the registry builds from those classes
runs on a core."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tierstore import policies
from tierstore.errors import ConfigError
from tierstore.policies.native import NativePolicy

pytest.importorskip("tierstore._C")


@pytest.mark.parametrize("name", ["lru", "heat", "hybrid", "phase"])
def test_registry_policies_are_native_faces(name):
    p = policies.make(name, 12, 4)
    assert isinstance(p, NativePolicy)
    p.on_access(np.array([3, 5, 5]), np.array([1.0, 2.0, 1.0]))
    p.on_admit(np.array([3, 5]))
    assert p.n_resident == 2 and set(p.resident().tolist()) == {3, 5}
    pinned = np.zeros(12, dtype=bool)
    pinned[3] = True
    assert p.victims(2, pinned).tolist() == [5]
    p.check_invariants()


def test_phase_on_the_wall_clock_starts_a_tick_at_each_decay():
    p = policies.make("phase", 10, 4, half_life_s=1.0)
    t0 = time.monotonic()  # wall-clock policies measure from their construction
    p.on_access(np.array([1]), now=t0 + 0.5)
    p.on_access(np.array([2]), now=t0 + 0.6)
    assert (p._group, p._per_tick) == (2, 2)
    p.decay(now=t0 + 1.5)
    assert p._group == 0
    assert p.heat_of([1])[0] < 1.0  # a wall-clock second passed: the heat decayed
    p.check_invariants()


@pytest.mark.parametrize("name", ["heat", "hybrid", "phase"])
def test_weights_must_match_keys(name):
    p = policies.make(name, 8, 2)
    with pytest.raises(ConfigError, match="2 weights for 3 keys"):
        p.on_access(np.array([1, 2, 3]), np.array([1.0, 2.0]))


@pytest.mark.parametrize("name", ["heat", "hybrid", "phase", "blend", "auto"])
@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), -1e-300])
def test_weights_must_be_finite_and_not_negative(name, bad):
    # A use adds heat: a negative or NaN weight would make a heat negative (and void the
    # admission floor the shadows prune by). Refused, naming the weight; nothing changes.
    p = policies.make(name, 8, 2)
    p.on_access(np.array([1, 2]), np.array([2.0, 0.0]))  # zero is a use of no weight
    before = p.scores().copy()
    with pytest.raises(ConfigError, match=r"on_access: weight .* is not a finite number >= 0"):
        p.on_access(np.array([1, 3]), np.array([1.0, bad]))
    assert np.array_equal(p.scores(), before)
    p.check_invariants()


@pytest.mark.parametrize("name", ["lru", "heat", "hybrid", "phase"])
def test_bad_keys_name_the_key(name):
    p = policies.make(name, 8, 2)
    for call in (
        lambda: p.on_access(np.array([1, 9])),
        lambda: p.rank([0, -1]),
        lambda: p.coldest_of(np.array([8]), 1),
    ):
        with pytest.raises(ConfigError, match=r"key (9|-1|8) out of range \[0, 8\)"):
            call()
    if name in ("hybrid", "phase"):
        with pytest.raises(ConfigError, match=r"key 8 out of range"):
            p.admit(np.array([1]), np.array([8]))


def test_admit_is_hybrid_rule_on_scalars_and_arrays():
    p = policies.make("hybrid", 8, 2)
    p.on_access(np.array([1, 1, 2]))
    assert p.admit(1, 2) is True and p.admit(2, 1) is False and p.admit(3, 4) is False
    assert p.admit(np.array([1, 2]), np.array([2, 1])).tolist() == [True, False]


def test_lru_takes_no_half_life():
    with pytest.raises(ConfigError, match=r"unknown parameter\(s\) half_life"):
        policies.make("lru", 8, 2, half_life=3.0)
