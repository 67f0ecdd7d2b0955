"""Hypothesis stateful test of the slot state machine through the public store calls:
record / fire / release / promote / evict / load_arena / step, with injected read
faults. After every rule: bookkeeping agrees (pool, arena, policies, device slot
table), every published row is byte-exact, and the pins equal the model's count
of fires not yet released (so nothing a fire holds can be evicted)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from store_helpers import assert_store_consistent

import tierstore as ts
from tierstore.errors import TierIOError
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 2, 8, 300
keys_st = st.lists(st.tuples(st.integers(0, L - 1), st.integers(0, E - 1)), min_size=1, max_size=6)


class StoreMachine(RuleBasedStateMachine):
    pack = None
    device = "cpu"

    def __init__(self):
        super().__init__()
        self.store = ts.ExpertStore(
            self.pack, vram_slots=4, ram_gb=3 * 4096 / 2**30, device=self.device, threads=2, lazy_per_step=2
        )
        self.open_fires: list = []

    def teardown(self):
        self.store.close()

    @rule(layer=st.integers(0, L - 1), ids=st.lists(st.integers(-1, E - 1), min_size=1, max_size=8))
    def record(self, layer, ids):
        self.store.record(layer, np.asarray(ids, np.int64).reshape(-1, 1))

    @rule(keys=keys_st, cap=st.integers(0, 6))
    def fire(self, keys, cap):
        fr = self.store.fire(keys, max_promote=cap)
        dense = {l * E + e for l, e in keys}
        assert set(fr.keys.tolist()) <= dense
        assert fr.promoted <= cap and fr.waited == 0  # one thread: nothing else loads
        assert fr.promoted + fr.already_resident == len(fr.keys)
        assert np.all(self.store.tier("pool").resident_slot(fr.keys) >= 0), (
            "a pinned key of a fire is not resident"
        )
        self.open_fires.append(fr)

    @precondition(lambda self: self.open_fires)
    @rule(i=st.integers(0, 10))
    def release(self, i):
        self.store.release(self.open_fires.pop(i % len(self.open_fires)))

    @rule(keys=keys_st)
    def promote(self, keys):
        self.store.promote(keys).wait(10)

    @rule(keys=keys_st)
    def evict(self, keys):
        pinned = {int(k) for fr in self.open_fires for k in fr.keys}
        self.store.evict(keys)
        for l, e in keys:
            if l * E + e in pinned:
                assert self.store.tier("pool").resident_slot(l * E + e) >= 0, "evict crossed a pin"

    @rule(keys=keys_st)
    def load_arena(self, keys):
        self.store.load_arena(keys)

    @rule()
    def step(self):
        self.store.step()
        assert self.store.wait_idle(10)

    @rule(keys=keys_st, victim=st.integers(0, 5))
    def fire_with_a_failing_read(self, keys, victim):
        l, e = keys[victim % len(keys)]
        self.store.engine._inject_faults(fail_offset=self.pack.row_offset(l, e))
        try:
            fr = self.store.fire(keys)
            self.open_fires.append(fr)  # the failing row was resident or an arena hit
        except TierIOError as exc:
            assert f"layer {l} expert {e}" in str(exc)
        finally:
            self.store.engine._inject_faults()

    @invariant()
    def consistent(self):
        assert self.store.wait_idle(10)  # CUDA: arena source rows are unpinned by the worker
        assert_store_consistent(self.store)
        want = np.zeros(L * E, np.int32)
        for fr in self.open_fires:
            want[fr.keys] += 1
        assert np.array_equal(self.store.tier("pool").pins(), want), "pins differ from open fires"
        assert self.store.stats().arena.pinned == 0, "an arena row is still pinned as a source"


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("stateful"), L, E, SLOT, seed=21)


def test_slot_state_machine_under_random_calls_and_faults(small_pack, device):
    StoreMachine.pack, StoreMachine.device = small_pack, device
    run_state_machine_as_test(
        StoreMachine,
        settings=hsettings(
            max_examples=30,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
