"""Pool / arena sizing and the fire floor (tierstore.sizing), and their use by ExpertStore."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import given
from hypothesis import strategies as st

import tierstore as ts
from tierstore.errors import CapacityError, ConfigError
from tierstore.store import sizing
from tierstore.testing.packs import make_random_pack

GIB = 1 << 30
DS4_FP4 = 12_582_912  # 12 MiB standalone FP4 expert (COMPAT.md)


@pytest.mark.parametrize(
    "n_spec, max_seqs, want", [(0, 1, 438), (1, 1, 877), (2, 1, 1315), (0, 4, 1754), (0, 9, 1754)]
)
def test_fire_floor_ds4_matches_compat_numbers(n_spec, max_seqs, want):
    assert ts.fire_floor(43, 6, n_spec=n_spec, max_seqs=max_seqs) == want


def test_fire_floor_gate_fp_max_one_has_no_fp_margin():
    assert ts.fire_floor(43, 6, gate_fp_max=1) == 43 * 6
    assert ts.fire_floor(43, 6, max_seqs=0) == ts.fire_floor(43, 6, max_seqs=1)


@given(st.integers(1, 100), st.integers(1, 16), st.integers(0, 3), st.integers(0, 8), st.integers(0, 6))
def test_fire_floor_is_monotone_in_every_argument(L, k, spec, seqs, fp):
    base = ts.fire_floor(L, k, spec, seqs, fp)
    assert base >= L * k
    assert ts.fire_floor(L + 1, k, spec, seqs, fp) >= base
    assert ts.fire_floor(L, k + 1, spec, seqs, fp) >= base
    assert ts.fire_floor(L, k, spec + 1, seqs, fp) >= base
    assert ts.fire_floor(L, k, spec, seqs + 1, fp) >= base
    assert ts.fire_floor(L, k, spec, seqs, fp + 1) >= base


@pytest.mark.parametrize(
    "bad", [dict(n_layers=0, top_k=6), dict(n_layers=43, top_k=0), dict(n_layers=43, top_k=6, n_spec=-1)]
)
def test_fire_floor_bad_arguments_raise_config_error(bad):
    with pytest.raises(ConfigError, match="fire_floor"):
        ts.fire_floor(**bad)


def test_slots_for_gib_matches_reference_and_floor_of_eight():
    assert sizing.slots_for_gib(6, DS4_FP4) == 512  # "a 6 GiB pool = 512 slots"
    assert sizing.slots_for_gib(5.13, DS4_FP4) == 437
    assert sizing.slots_for_gib(0.01, DS4_FP4) == 8


def test_auto_pool_is_free_memory_minus_reserve_capped_by_keys_and_max_gb():
    n = sizing.resolve_pool_slots(
        slot_bytes=DS4_FP4, n_keys=11008, device="cpu", reserve_gb=3, available=20 * GIB
    )
    assert n == (17 * GIB) // DS4_FP4
    assert (
        sizing.resolve_pool_slots(
            slot_bytes=DS4_FP4, n_keys=100, device="cpu", vram_gb="auto", available=20 * GIB
        )
        == 100
    )
    assert (
        sizing.resolve_pool_slots(
            slot_bytes=DS4_FP4, n_keys=11008, device="cpu", max_gb=6, available=20 * GIB
        )
        == 512
    )


def test_auto_pool_with_no_room_names_free_memory_and_reserve():
    with pytest.raises(CapacityError, match=r"2\.00 GiB free minus a 3 GiB reserve"):
        sizing.resolve_pool_slots(
            slot_bytes=DS4_FP4, n_keys=11008, device="cpu", reserve_gb=3, available=2 * GIB
        )


def test_pool_larger_than_memory_is_refused_before_allocating():
    with pytest.raises(CapacityError, match=r"vram_gb=64\) needs 64\.00 GiB but cpu has 8\.00 GiB free"):
        sizing.resolve_pool_slots(
            slot_bytes=DS4_FP4, n_keys=11008, device="cpu", vram_gb=64, available=8 * GIB
        )
    with pytest.raises(ConfigError, match="not both"):
        sizing.resolve_pool_slots(slot_bytes=4096, n_keys=8, device="cpu", vram_slots=8, vram_gb=1)
    with pytest.raises(ConfigError, match="vram_gb must be"):
        sizing.resolve_pool_slots(slot_bytes=4096, n_keys=8, device="cpu", vram_gb="lots")


def test_arena_rows_auto_is_a_quarter_of_the_pack_within_memory():
    assert sizing.resolve_arena_rows(ram_gb="auto", stride=4096, n_keys=400, available=GIB * 8) == 100
    assert sizing.resolve_arena_rows(ram_gb=0, stride=4096, n_keys=400) == 0
    assert sizing.resolve_arena_rows(ram_gb=1.0, stride=4096, n_keys=400) == 400  # capped by keys
    with pytest.raises(CapacityError, match="arena of"):
        sizing.resolve_arena_rows(ram_gb=4.0, stride=GIB // 8, n_keys=400, available=GIB)


def test_check_floor_errors_or_warns_with_force():
    with pytest.raises(CapacityError, match="under the fire floor of 438 slots"):
        sizing.check_floor(437, 438, slot_bytes=DS4_FP4, force=False, what="DS4")
    with pytest.warns(RuntimeWarning, match="force=True"):
        sizing.check_floor(437, 438, slot_bytes=DS4_FP4, force=True, what="DS4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sizing.check_floor(438, 438, slot_bytes=DS4_FP4, force=False, what="DS4")


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("sizing"), 4, 8, 1000, seed=3)


def test_store_auto_pool_is_sized_before_the_floor_check(small_pack, monkeypatch):
    # The reference checked the floor before sizing "auto" and refused to start.
    monkeypatch.setattr(sizing, "device_available_bytes", lambda device: 3 * GIB + 40 * 1000)
    floor = ts.fire_floor(4, 2)
    with ts.ExpertStore(small_pack, vram_gb="auto", device="cpu", top_k=2) as store:
        assert store.n_slots == 32 >= floor  # capped by the 32 keys of the pack


def test_store_under_floor_refuses_then_warns_with_force(small_pack):
    with pytest.raises(CapacityError, match="under the fire floor of 13 slots"):
        ts.ExpertStore(small_pack, vram_slots=8, device="cpu", top_k=2)
    with pytest.warns(RuntimeWarning, match="fire floor"):
        ts.ExpertStore(small_pack, vram_slots=8, device="cpu", top_k=2, force=True).close()


def test_store_pool_larger_than_memory_raises_capacity_error(small_pack, monkeypatch):
    monkeypatch.setattr(sizing, "device_available_bytes", lambda device: 4000)
    with pytest.raises(CapacityError, match="needs .* GiB but cpu has"):
        ts.ExpertStore(small_pack, vram_slots=8, device="cpu")
