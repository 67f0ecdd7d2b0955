"""Hostile I/O faults on the read side (hostile/read_faults.py): more distinct injected
faults than the red team's 800, each checked for a one-line TierstoreError naming the
pack (and row), byte-exact published rows, no leaked pin, an idle worker and a store
that serves once the fault is gone. One store per verify mode runs all its cases."""

from __future__ import annotations

import errno
import itertools
import warnings

import numpy as np
import pytest
from store_helpers import assert_store_consistent

import tierstore as ts
from hostile.read_faults import ARENA_GB, POOL_SLOTS, SLOT, VERIFY, E, L, byte_of, read_cases, run_read_case
from tierstore.errors import TierIOError
from tierstore.io.engine import Engine
from tierstore.testing.packs import make_random_pack
from tierstore.warm import WarmStartWarning

RED_TEAM_IO_FAULTS = 800


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("io-faults"), L, E, SLOT, seed=15)


DIRECT = ("on", "off")  # O_DIRECT reads (aligned middle + buffered edges) and buffered pread


def open_store(pack, verify, direct="off", **kw):
    return ts.ExpertStore(
        pack,
        vram_slots=POOL_SLOTS,
        ram_gb=ARENA_GB,
        device="cpu",
        threads=2,
        verify=verify,
        direct=direct,
        **kw,
    )


def test_the_io_fault_class_is_larger_than_the_red_team_s():
    from hostile.write_faults import write_cases

    cases = read_cases()
    assert len({c.name for c in cases}) == len(cases), "fault names must be unique"
    reads = len(cases) * len(DIRECT) + len(WARM_CASES)  # tests/hostile/README.md
    assert reads == 1656 and len(write_cases()) == 375
    assert reads > RED_TEAM_IO_FAULTS and reads + len(write_cases()) > 2 * RED_TEAM_IO_FAULTS


@pytest.mark.parametrize("direct", DIRECT)
@pytest.mark.parametrize("verify", VERIFY)
def test_every_read_fault_fails_cleanly_or_is_absorbed(pack, verify, direct):
    cases = [c for c in read_cases() if c.verify == verify]
    rng = np.random.default_rng(len(cases))
    bad = []
    with open_store(pack, verify, direct) as store:
        if direct == "off":  # ("on" falls back to buffered reads where O_DIRECT is refused)
            assert not store.engine.direct_active
        for case in cases:
            problem = run_read_case(store, case, rng)
            if problem:
                bad.append(problem)
        stats = store.stats()
    assert not bad, f"{len(bad)} of {len(cases)} read faults went wrong:\n" + "\n".join(bad[:30])
    assert stats.failed_reads > 0


# -- warm start and preheat: a read fault stops the hint with a warning, never an error --
WARM_ERRNOS = (errno.EIO, errno.EINTR)
WARM_CASES = [
    (how, v, err, i, where)
    for how, v, err, i, where in itertools.product(
        ("preheat", "warm_start"), VERIFY, WARM_ERRNOS, range(4), ("first", "last")
    )
]
HOT = [(0, 1), (1, 5), (2, 9), (3, 14), (1, 2), (2, 3)]  # the poolmon's keys, hottest first


@pytest.fixture(scope="module")
def poolmon(pack, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("io-faults-warm") / "pool.poolmon.json")
    with open_store(pack, "off") as store:
        for _ in range(3):
            store.release(store.fire(HOT))
            store.step()
        store.save_poolmon(path)
    return path


def _warm_case(pack, poolmon, how, verify, err, i, where) -> str | None:
    key = HOT[i]
    eng = Engine(pack.path, threads=2)
    eng._inject_faults(fail_offset=pack.row_offset(*key) + byte_of(where), errno=err)
    name = f"{how}-{verify}-{errno.errorcode[err]}-{key}-{where}"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if how == "warm_start":
                store = open_store(pack, verify, engine=eng, warm_start=poolmon)
            else:
                store = open_store(pack, verify, engine=eng)
                summary = store.preheat(poolmon)
                assert summary.reason.startswith("stopped early"), summary.reason
        with store:
            msgs = [str(w.message) for w in caught if issubclass(w.category, WarmStartWarning)]
            assert len(msgs) == 1 and poolmon in msgs[0] and pack.path in msgs[0] and "\n" not in msgs[0], (
                f"warnings {msgs}"
            )
            assert f"layer {key[0]} expert {key[1]}" in msgs[0], msgs[0]
            assert store.wait_idle(10)
            assert store.stats().pool.pinned == 0 and store.stats().arena.pinned == 0
            assert_store_consistent(store)
            eng._inject_faults()
            store.release(store.fire(HOT[:4]))  # serves, the faulted key too
            assert store.wait_idle(10)
            assert_store_consistent(store)
    except (AssertionError, ts.TierstoreError) as exc:
        return f"{name}: {str(exc).splitlines()[0]}"
    finally:
        eng.close()
    return None


def test_a_read_fault_during_preheat_or_warm_start_is_one_warning_and_keeps_serving(pack, poolmon):
    bad = [p for p in (_warm_case(pack, poolmon, *c) for c in WARM_CASES) if p]
    assert not bad, f"{len(bad)} of {len(WARM_CASES)} warm-start faults:\n" + "\n".join(bad[:20])


def test_a_verified_fire_over_rotted_bytes_names_the_row_and_publishes_nothing(pack):
    """The smallest rot case, spelled out (the class runs 120 like it)."""
    from hostile.read_faults import Rot

    with open_store(pack, "always") as store:
        rot = Rot(pack, pack.row_offset(2, 7) + 100)
        try:
            with pytest.raises(TierIOError) as info:
                store.fire([(2, 6), (2, 7)])
        finally:
            rot.undo()
        assert info.value.errno == errno.EBADMSG and "layer 2 expert 7" in str(info.value)
        assert store.resident_keys("pool").tolist() == []
        assert_store_consistent(store)
        store.release(store.fire([(2, 6), (2, 7)]))
