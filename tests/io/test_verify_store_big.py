"""Checksums on load for rows bigger than one stage buffer, through the store's
public API: rows of 17 MiB + 1234 B (two 16 MiB segments, the second ragged) are verified
under verify="always" / "off", a corrupted segment (first or last) fails the
fire with a TierIOError naming the file, layer, expert and offset, and nothing of that
fire is published; pipelined fires fail at the corrupted layer's wait. Runs on the CPU
pool (segments land in the pool slots) and, with a GPU, on the CUDA pool (segments go
through the pinned staging ring; the test marked gpu forces that path with no arena)."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest
from store_helpers import assert_store_consistent

import tierstore as ts
from tierstore.errors import TierIOError
from tierstore.testing.packs import make_random_pack

L, E = 2, 2
SLOT = (17 << 20) + 1234
STAGE = 16 << 20
KEYS = [(l, e) for l in range(L) for e in range(E)]
BAD = (1, 0)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("bigrows"), L, E, SLOT, seed=21)


class Corrupted:
    """Flip one byte of row BAD in place (size and mtime kept, so only the checksum can
    tell); leaving the block restores it."""

    def __init__(self, pack, where: int):
        self.path, self.at = pack.path, pack.row_offset(*BAD) + where

    def _flip(self):
        st = os.stat(self.path)
        fd = os.open(self.path, os.O_RDWR)
        try:
            old = os.pread(fd, 1, self.at)
            os.pwrite(fd, bytes([old[0] ^ 0xA5]), self.at)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        os.utime(self.path, ns=(st.st_atime_ns, st.st_mtime_ns))

    def __enter__(self):
        self._flip()
        return self

    def __exit__(self, *exc):
        self._flip()


def _store(pack, device, mode, ram_gb=0.0):
    return ts.ExpertStore(
        pack, vram_slots=len(KEYS), ram_gb=ram_gb, device=device, verify=mode, threads=3, lazy_per_step=0
    )


def _resident(store) -> np.ndarray:
    table = store.tier("pool").device_table()
    return np.array([table[l * E + e] >= 0 for l, e in KEYS])


def _assert_names_the_row(exc: TierIOError, pack) -> None:
    assert exc.errno == errno.EBADMSG
    assert (exc.layer, exc.expert) == BAD and exc.offset == pack.row_offset(*BAD)
    text = str(exc)
    assert pack.path in text and f"layer {BAD[0]} expert {BAD[1]}" in text
    assert "xxh3_64 mismatch" in text and f"{SLOT} B at " in text


@pytest.mark.parametrize("where", [7, STAGE + 3, SLOT - 1], ids=["first_seg", "last_seg_head", "last_byte"])
@pytest.mark.parametrize("mode", ["always", "off"])
def test_big_rows_are_verified_and_a_bad_one_publishes_nothing(pack, device, mode, where):
    with Corrupted(pack, where), _store(pack, device, mode) as store:
        if mode == "off":  # nothing hashed: the bad bytes are served (and are the file's)
            fr = store.fire(KEYS)
            assert fr.promoted == len(KEYS) and _resident(store).all()
            store.release(fr)
            assert store.engine.stats()["verified_rows"] == 0
            assert_store_consistent(store)
            return
        with pytest.raises(TierIOError) as info:
            store.fire(KEYS)
        _assert_names_the_row(info.value, pack)
        assert not _resident(store).any()  # nothing of the fire published
        assert store.stats().pool.pinned == 0
        assert_store_consistent(store)
    with _store(pack, device, mode) as store:  # intact file: every row passes
        fr = store.fire(KEYS)
        assert fr.promoted == len(KEYS)
        store.release(fr)
        assert store.engine.stats()["verified_rows"] == len(KEYS)
        assert store.engine.stats()["verified_bytes"] == len(KEYS) * SLOT
        assert_store_consistent(store)
        # Corrupted after this store has seen the rows: every read is hashed again
        # ("first" is a spelling of "always" now), so the re-read is refused.
        store.evict(KEYS)
        with Corrupted(pack, where):
            with pytest.raises(TierIOError) as info:
                store.fire(KEYS)
            _assert_names_the_row(info.value, pack)
            assert not _resident(store).any()
            assert_store_consistent(store)


def test_pipelined_fire_fails_at_the_corrupted_layer(pack, device):
    with _store(pack, device, "always") as store, Corrupted(pack, STAGE + 99):
        fr = store.fire(KEYS, pipelined=True)
        fr.wait_layer(0)  # layer 0 is intact and published
        assert _resident(store)[:E].all()
        with pytest.raises(TierIOError) as info:
            fr.wait_layer(1)
        _assert_names_the_row(info.value, pack)
        store.release(fr)
        store.wait_idle(10)
        assert not _resident(store)[E:].any()
        assert store.stats().pool.pinned == 0
        assert_store_consistent(store)


@pytest.mark.gpu
@pytest.mark.parametrize("ram_gb", [0.0, 2 * SLOT / 2**30], ids=["staged", "arena"])
def test_cuda_pool_verifies_big_rows_through_the_staging_ring(pack, ram_gb):
    """On the GPU pool without an arena row, a 17 MiB row goes through two 16 MiB pinned
    stages, H2D chunk by chunk, hashed on the stage before it is recycled."""
    with _store(pack, "cuda", "always", ram_gb) as store:
        store.release(store.fire(KEYS))
        assert store.engine.stats()["verified_rows"] == len(KEYS)
        assert_store_consistent(store)
        store.evict(KEYS)
        with Corrupted(pack, SLOT - 1):
            with pytest.raises(TierIOError) as info:
                store.fire(KEYS)
            _assert_names_the_row(info.value, pack)
            assert not _resident(store).any()
            assert_store_consistent(store)
