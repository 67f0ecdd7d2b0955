"""Checksums on load: Engine.submit(checksums=xxh3_64 per row) verifies each row
natively as it lands. An intact row passes, a row corrupted in place fails alone with
EBADMSG at its offset, for every way a row can land (host dst, caller src, staging ring)."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import xxhash
from engine_helpers import PAGE, flip_byte, write_random_file
from hypothesis import given, settings
from hypothesis import strategies as st

from tierstore.errors import ConfigError, TierIOError
from tierstore.io.engine import Engine, xxh3_64

ROW = 64 * PAGE


@given(data=st.binary(min_size=0, max_size=5000))
@settings(max_examples=200, deadline=None)
def test_native_hash_equals_python_xxhash(data):
    assert xxh3_64(data) == xxhash.xxh3_64_intdigest(data)


def test_native_hash_of_large_unaligned_buffers():
    raw = np.random.default_rng(0).integers(0, 256, 3 * ROW + 11, dtype=np.uint8)
    for lo, hi in ((0, len(raw)), (1, 3 * ROW), (4093, 4093 + 240 + 1)):
        assert xxh3_64(raw[lo:hi]) == xxhash.xxh3_64_intdigest(raw[lo:hi].tobytes())


def _sums(data, offsets, length):
    return np.array(
        [xxhash.xxh3_64_intdigest(data[o : o + length].tobytes()) for o in offsets], dtype=np.uint64
    )


@pytest.fixture
def pack(tmp_path):
    path = tmp_path / "rows.bin"
    return path, write_random_file(path, 8 * ROW, seed=11)


@pytest.mark.parametrize("land", ["host_dst", "src", "staged"])
@pytest.mark.parametrize("direct", ["off", "auto"])
def test_corrupted_row_fails_alone_with_ebadmsg_and_intact_rows_pass(pack, land, direct):
    path, data = pack
    offsets = np.arange(8) * ROW
    sums = _sums(data, offsets, ROW)
    with Engine(path, threads=3, direct=direct, chunk_bytes=16 * PAGE, stage_bytes=ROW, stage_count=2) as eng:
        buf = eng.alloc_host(8 * ROW)
        ptrs = buf.data_ptr() + offsets
        src, dst = {"host_dst": (None, ptrs), "src": (ptrs, None), "staged": (None, None)}[land]
        assert eng.submit(offsets, ROW, src, dst, checksums=sums).wait()
        if land != "staged":
            assert np.array_equal(buf.numpy(), data)
        assert eng.stats()["verified_rows"] == 8 and eng.stats()["checksum_failures"] == 0

        flip_byte(path, 5 * ROW + 777)  # in place, after the sums were taken
        c = eng.submit(offsets, ROW, src, dst, checksums=sums)
        with pytest.raises(TierIOError) as info:
            c.wait()
        exc = info.value
        assert exc.errno == errno.EBADMSG and exc.row == 5 and c.failed_rows.tolist() == [5]
        assert exc.offset == 5 * ROW and str(path) in str(exc)
        assert "xxh3_64 mismatch" in str(exc) and f"{int(sums[5]):#018x}" in str(exc)
        assert eng.stats()["checksum_failures"] == 1
        # Without checksums the same corrupted bytes are read "successfully".
        assert eng.submit(offsets, ROW, src, dst).wait()


def test_split_rows_are_verified_whole(pack):
    """A row larger than one stage is hashed segment by segment; its digest is the whole
    row's (tests/io/test_verify_stream.py covers sizes, landings and corruption spots)."""
    path, data = pack
    with Engine(path, threads=2, direct="off", stage_bytes=ROW // 4) as eng:
        sums = _sums(data, [0, ROW], 2 * ROW)
        assert eng.submit([0], 2 * ROW, checksums=sums[:1]).wait()
        assert eng.stats()["verified_rows"] == 1 and eng.stats()["verified_bytes"] == 2 * ROW
        with pytest.raises(TierIOError, match="xxh3_64 mismatch"):
            eng.submit([0], 2 * ROW, checksums=sums[1:]).wait()


def test_arena_rows_are_not_hashed_and_bad_checksum_arguments_are_refused(pack):
    path, data = pack
    with Engine(path, threads=2, direct="off") as eng:
        src, dst = eng.alloc_host(ROW), eng.alloc_host(ROW)
        src.fill_(3)
        assert eng.submit([-1], ROW, src.data_ptr(), dst.data_ptr(), checksums=[0]).wait()
        assert eng.stats()["verified_rows"] == 0 and bool((dst == 3).all())
        with pytest.raises(ConfigError, match="checksums has shape"):
            eng.submit([0, ROW], ROW, checksums=[1, 2, 3])
        with pytest.raises(ConfigError, match="checksum='md5'"):
            eng.submit([0], ROW, checksums=[1], checksum="md5")
