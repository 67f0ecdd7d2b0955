"""tierstore.engine on the CPU: byte-exact reads (buffered and O_DIRECT), arena rows,
host copies, the O_DIRECT probe, stats, alloc_host, argument checks."""

from __future__ import annotations

import errno
import logging
import os

import numpy as np
import pytest
from engine_helpers import PAGE, pack_into, random_rows, write_random_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierstore.errors import ClosedError, ConfigError, TierIOError
from tierstore.io.engine import Engine

FILE_BYTES = 24 << 20


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("engine") / "rows.bin"
    return path, write_random_file(path, FILE_BYTES, seed=1)


@pytest.fixture(scope="module", params=["off", "on"])
def engine(request, data_file):
    # Small chunks so a row of a few hundred KiB is still split across threads.
    with Engine(data_file[0], threads=4, direct=request.param, chunk_bytes=64 << 10) as eng:
        eng.requested_direct = request.param
        yield eng


def test_direct_mode_on_a_disk_filesystem_matches_the_request(engine, data_file):
    # tmp_path lives on this machine's disk filesystem (ext4), which accepts O_DIRECT.
    assert engine.direct_active == (engine.requested_direct == "on")
    with Engine(data_file[0], threads=1, direct="auto") as auto:
        assert auto.direct_active and auto._native.fallback_reason == ""
    with Engine(data_file[0], threads=1, direct="off") as off:
        assert not off.direct_active


def test_random_rows_into_host_dst_are_byte_exact(engine, data_file):
    _, data = data_file
    rng = np.random.default_rng(7)
    offsets, lengths = random_rows(rng, FILE_BYTES, 40, max_len=700_000)
    buf = engine.alloc_host(40 * 720_000)
    pos = pack_into(buf.numel(), lengths, rng)
    assert engine.submit(offsets, lengths, None, buf.data_ptr() + pos).wait()
    out = buf.numpy()
    for o, n, p in zip(offsets, lengths, pos):
        assert np.array_equal(out[p : p + n], data[o : o + n]), f"row at {o:#x} len {n}"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 12),
    mode=st.sampled_from(["dst", "src", "src+dst", "arena"]),
)
def test_property_every_row_kind_lands_byte_exact(engine, data_file, seed, n, mode):
    """Reads into dst, into src only, into src then copied to dst, and arena rows (-1)."""
    _, data = data_file
    rng = np.random.default_rng(seed)
    offsets, lengths = random_rows(rng, FILE_BYTES, n, max_len=300_000)
    src = engine.alloc_host(n * 310_000)
    dst = engine.alloc_host(n * 310_000)
    pos = pack_into(src.numel(), lengths, rng)
    src_ptrs = src.data_ptr() + pos
    dst_ptrs = dst.data_ptr() + pos
    if mode == "arena":
        for o, ln, p in zip(offsets, lengths, pos):
            src.numpy()[p : p + ln] = data[o : o + ln]
        c = engine.submit(np.full(n, -1), lengths, src_ptrs, dst_ptrs)
    elif mode == "dst":
        c = engine.submit(offsets, lengths, None, dst_ptrs)
    elif mode == "src":
        c = engine.submit(offsets, lengths, src_ptrs, None)
    else:
        c = engine.submit(offsets, lengths, src_ptrs, dst_ptrs)
    assert c.wait() and c.done() and c.failed_rows.size == 0
    check = src.numpy() if mode == "src" else dst.numpy()
    for o, ln, p in zip(offsets, lengths, pos):
        assert np.array_equal(check[p : p + ln], data[o : o + ln])


def test_row_larger_than_stage_is_split_and_counted(data_file):
    with Engine(data_file[0], threads=2, direct="off", stage_bytes=1 << 20, stage_count=2) as eng:
        assert eng.submit([0, 4096], [5 << 20, 3 << 20]).wait()  # read-only: staged scratch
        s = eng.stats()
        assert s["pagecache"]["bytes"] + s["disk"]["bytes"] == 8 << 20
        assert s["pagecache"]["rows"] + s["disk"]["rows"] == 8  # 5 + 3 segments of 1 MiB


def test_stats_classify_arena_pagecache_and_odirect_rows(data_file):
    path, data = data_file
    with Engine(path, threads=2, direct="off") as eng:
        buf = eng.alloc_host(2 << 20)
        eng.submit([0], [1 << 20], None, [buf.data_ptr()]).wait()  # now in the page cache
        eng.submit([0], [1 << 20], None, [buf.data_ptr()]).wait()
        eng.submit([-1], [1 << 20], [buf.data_ptr()], [buf.data_ptr() + (1 << 20)]).wait()
        s = eng.stats()
        assert s["pagecache"]["rows"] >= 1 and s["arena"]["rows"] == 1
        assert s["arena"]["bytes"] == 1 << 20 and s["host_copy_bytes"] == 1 << 20
        assert s["batches"] == 3 and s["failed_rows"] == 0
        assert sum(s["arena"]["latency_hist_us_log2"]) == 1 and s["arena"]["p50_ms"] > 0
    with Engine(path, threads=2, direct="on", probe_cache=False) as eng:
        buf = eng.alloc_host(1 << 20)
        eng.submit([0], [1 << 20], None, [buf.data_ptr()]).wait()
        assert eng.stats()["disk"]["rows"] == 1  # O_DIRECT bypasses the cache: always disk
    with Engine(path, threads=2, direct="on") as eng:  # probe_cache: cached rows stay cached
        buf = eng.alloc_host(1 << 20)
        with open(path, "rb") as f:
            # Evict the whole (clean, fsync'ed) file: a partial range can sit inside a
            # large folio and survive. Then bring [0, 1 MiB) back into the page cache.
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            f.read(1 << 20)
        eng.submit([0], [1 << 20], None, [buf.data_ptr()]).wait()
        eng.submit([8 << 20], [1 << 20], None, [buf.data_ptr()]).wait()
        s = eng.stats()
        assert s["pagecache"]["rows"] == 1 and s["disk"]["rows"] == 1
        assert np.array_equal(buf.numpy(), data[8 << 20 : 9 << 20])


def test_direct_on_refused_by_filesystem_names_path_and_errno():
    # procfs refuses O_DIRECT at open (EINVAL) on every kernel; tmpfs accepts it since 6.6.
    with pytest.raises(TierIOError) as info:
        Engine("/proc/self/cmdline", direct="on")
    assert info.value.errno == errno.EINVAL and info.value.path == "/proc/self/cmdline"
    assert "O_DIRECT refused" in str(info.value) and "EINVAL" in str(info.value)


def test_direct_auto_falls_back_to_buffered_and_logs_once(caplog):
    caplog.set_level(logging.WARNING, logger="tierstore.engine")
    for _ in range(2):
        with Engine("/proc/self/cmdline", direct="auto", threads=1) as eng:
            assert not eng.direct_active
            buf = eng.alloc_host(PAGE)
            assert eng.submit([0], [1], None, [buf.data_ptr()]).wait()
            assert buf[0].item() != 0
    warnings = [r for r in caplog.records if "O_DIRECT refused" in r.getMessage()]
    assert len(warnings) <= 1  # once per path per process (maybe logged by an earlier test)


def test_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(TierIOError) as info:
        Engine(tmp_path / "absent.pack")
    assert info.value.errno == errno.ENOENT and "absent.pack" in str(info.value)


def test_alloc_host_is_page_aligned_writable_and_outlives_the_engine(data_file):
    eng = Engine(data_file[0], threads=1)
    small, big = eng.alloc_host(100), eng.alloc_host(3 << 20)
    eng.close()
    assert small.data_ptr() % PAGE == 0 and big.data_ptr() % (2 << 20) == 0
    assert small.numel() == 100 and str(big.dtype) == "torch.uint8"
    big.fill_(7)
    assert int(big.sum()) == 7 * (3 << 20)


def test_bad_arguments_are_rejected_together_or_per_row(data_file):
    with pytest.raises(ConfigError) as info:
        Engine(data_file[0], threads=0, direct="maybe", chunk_bytes=1000)
    text = str(info.value)
    assert "threads=0" in text and "direct='maybe'" in text and "chunk_bytes=1000" in text
    with Engine(data_file[0], threads=1) as eng:
        with pytest.raises(ConfigError, match="row 1"):
            eng.submit([0, -1], [10, 10], [0, 0], None)  # arena row without a src
        with pytest.raises(ConfigError, match="shape"):
            eng.submit([0, 1], [10, 10, 10])
        with pytest.raises(ConfigError, match="dst_device"):
            eng.submit([0], [10], dst_device=True)
        done = eng.submit(np.zeros(0, np.int64), np.zeros(0, np.int64))
        assert done.done() and done.wait(timeout=0)
    with pytest.raises(ClosedError):
        eng.submit([0], [10])
