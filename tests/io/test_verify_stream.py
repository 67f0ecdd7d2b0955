"""Streaming verification: a checksummed row of any size is hashed segment by
segment (stage_bytes each) as it lands, in file order, and fails as a whole when its
digest differs. Rows of 17 MiB, 40 MiB and a size that is no multiple of 4096, at an
aligned and an unaligned offset, through every way a row lands (host dst, caller src,
staging ring), buffered and O_DIRECT, with the corruption in the first, a middle or the
last segment, or on a segment boundary."""

from __future__ import annotations

import errno

import numpy as np
import pytest
import xxhash
from engine_helpers import PAGE, flip_byte, write_random_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierstore.errors import TierIOError
from tierstore.io.engine import Engine

MIB = 1 << 20
STAGE = 16 * MIB
# (offset, length): 17 MiB (2 segments), 40 MiB (3), 17 MiB + 1234 B (2, ragged tail),
# and 5 MiB + 3 B at an unaligned offset (1 segment).
ROWS = [(0, 17 * MIB), (17 * MIB, 40 * MIB), (57 * MIB, 17 * MIB + 1234), (75 * MIB + 777, 5 * MIB + 3)]
FILE_BYTES = 81 * MIB
BIG = (0, 1, 2)  # the rows of more than one segment


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream") / "rows.bin"
    data = write_random_file(path, FILE_BYTES, seed=15)
    sums = np.array([xxhash.xxh3_64_intdigest(data[o : o + n].tobytes()) for o, n in ROWS], dtype=np.uint64)
    return path, data, sums


def _where(length: int, position: str) -> int:
    return {
        "first": 5,
        "middle": STAGE + 4099,
        "boundary": STAGE,
        "before_boundary": STAGE - 1,
        "last": length - 1,
    }[position]


def _submit(eng, land, buf, checksums):
    offsets = np.array([o for o, _ in ROWS], np.int64)
    lengths = np.array([n for _, n in ROWS], np.int64)
    starts = np.cumsum([0] + [(n + PAGE - 1) // PAGE * PAGE for _, n in ROWS[:-1]])
    ptrs = (buf.data_ptr() + starts).astype(np.uint64)
    src, dst = {"host_dst": (None, ptrs), "src": (ptrs, None), "staged": (None, None)}[land]
    return eng.submit(offsets, lengths, src, dst, checksums=checksums), starts


def _landed(buf, starts, i) -> np.ndarray:
    return buf.numpy()[starts[i] : starts[i] + ROWS[i][1]]


@pytest.mark.parametrize("direct", ["off", "auto"])
@pytest.mark.parametrize("land", ["host_dst", "src", "staged"])
@pytest.mark.parametrize("position", ["first", "middle", "boundary", "before_boundary", "last"])
def test_big_rows_verify_whole_and_a_corrupted_segment_fails_only_its_row(big_file, land, direct, position):
    path, data, sums = big_file
    # probe_cache=False: with O_DIRECT the aligned middle of every chunk really is read
    # O_DIRECT (the file is in the page cache, which the probe would otherwise serve).
    with Engine(path, threads=3, direct=direct, stage_bytes=STAGE, stage_count=3, probe_cache=False) as eng:
        buf = eng.alloc_host(sum((n + PAGE - 1) // PAGE * PAGE for _, n in ROWS))
        if position == "first":  # intact: every row passes, bytes exact (one run is enough)
            c, starts = _submit(eng, land, buf, sums)
            assert c.wait()
            if land != "staged":
                for i, (o, n) in enumerate(ROWS):
                    assert np.array_equal(_landed(buf, starts, i), data[o : o + n])
            assert eng.stats()["verified_rows"] == 4
            assert eng.stats()["verified_bytes"] == sum(n for _, n in ROWS)
        corrupt = [ROWS[i][0] + _where(ROWS[i][1], position) for i in BIG]
        for at in corrupt:
            flip_byte(path, at)
        try:
            c, starts = _submit(eng, land, buf, sums)
            with pytest.raises(TierIOError) as info:
                c.wait()
            exc = info.value
            assert c.failed_rows.tolist() == list(BIG)
            assert exc.errno == errno.EBADMSG and exc.row in BIG
            assert exc.offset == ROWS[exc.row][0] and str(path) in str(exc)
            assert "xxh3_64 mismatch" in str(exc) and f"{int(sums[exc.row]):#018x}" in str(exc)
            assert f"row {exc.row} ({ROWS[exc.row][1]} B at " in str(exc)
            if land != "staged":  # the intact row beside them landed and passed
                o, n = ROWS[3]
                assert np.array_equal(_landed(buf, starts, 3), data[o : o + n])
            assert eng.stats()["checksum_failures"] == 3
            # Unverified, the same bytes are read "successfully": only the hash can tell.
            assert _submit(eng, land, buf, None)[0].wait()
        finally:
            for at in corrupt:
                flip_byte(path, at)


def test_a_read_error_in_a_middle_segment_fails_the_row_without_hanging(big_file):
    path, data, sums = big_file
    with Engine(path, threads=3, direct="off", stage_bytes=STAGE, stage_count=2) as eng:
        buf = eng.alloc_host(64 * MIB)
        eng._inject_faults(fail_offset=ROWS[1][0] + STAGE + 5 * PAGE)
        for land in ("host_dst", "staged"):
            dst = None if land == "staged" else [buf.data_ptr()]
            c = eng.submit([ROWS[1][0]], [ROWS[1][1]], None, dst, checksums=sums[1:2])
            with pytest.raises(TierIOError) as info:
                c.wait(timeout=60)
            assert info.value.errno == errno.EIO and c.failed_rows.tolist() == [0]
        assert eng.stats()["checksum_failures"] == 0  # never hashed to the end


def test_close_with_segments_in_flight_completes_every_batch(big_file):
    path, data, sums = big_file
    eng = Engine(path, threads=2, direct="off", stage_bytes=MIB, stage_count=2)
    eng._inject_faults(delay_us=2000)
    c = eng.submit([o for o, _ in ROWS], [n for _, n in ROWS], checksums=sums)
    eng.close()
    assert c.done()
    with pytest.raises(TierIOError) as info:
        c.wait(timeout=0)
    assert info.value.errno == errno.ECANCELED


# -- property: any row size, stage size and chunk size hash to the sidecar's value ------

FILE_PAGES = 48


@pytest.fixture(scope="module")
def small_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("stream_small") / "rows.bin"
    return path, write_random_file(path, FILE_PAGES * PAGE, seed=16)


@given(
    offset=st.integers(0, 20 * PAGE),
    length=st.integers(1, 24 * PAGE + 77),
    stage_pages=st.integers(1, 6),
    chunk_pages=st.integers(1, 4),
    threads=st.integers(1, 4),
    stage_count=st.integers(1, 3),
    land=st.sampled_from(["host_dst", "src", "staged"]),
    corrupt=st.one_of(st.none(), st.floats(0, 1, exclude_max=True)),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_segmentation_verifies_like_one_hash(
    small_file, offset, length, stage_pages, chunk_pages, threads, stage_count, land, corrupt
):
    path, data = small_file
    want = np.array([xxhash.xxh3_64_intdigest(data[offset : offset + length].tobytes())], dtype=np.uint64)
    at = None if corrupt is None else offset + int(corrupt * length)
    with Engine(
        path,
        threads=threads,
        direct="off",
        stage_bytes=stage_pages * PAGE,
        stage_count=stage_count,
        chunk_bytes=chunk_pages * PAGE,
    ) as eng:
        buf = eng.alloc_host(length + PAGE)
        ptr = [buf.data_ptr() + 13]
        src, dst = {"host_dst": (None, ptr), "src": (ptr, None), "staged": (None, None)}[land]
        if at is not None:
            flip_byte(path, at)
        try:
            c = eng.submit([offset], [length], src, dst, checksums=want)
            if at is None:
                assert c.wait(timeout=60)
                if land != "staged":
                    assert np.array_equal(buf.numpy()[13 : 13 + length], data[offset : offset + length])
            else:
                with pytest.raises(TierIOError) as info:
                    c.wait(timeout=60)
                assert info.value.errno == errno.EBADMSG and info.value.offset == offset
        finally:
            if at is not None:
                flip_byte(path, at)
        assert eng.stats()["verified_rows"] == 1
