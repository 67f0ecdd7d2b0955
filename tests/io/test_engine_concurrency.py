"""Many batches from several Python threads at once on one engine (GIL released in
submit/wait): every row of every batch lands byte-exact, stats add up."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from engine_helpers import pack_into, random_rows, write_random_file

from tierstore.io.engine import Engine

FILE_BYTES = 8 << 20


@pytest.mark.parametrize("direct", ["off", "on"])
def test_many_concurrent_batches_from_threads_are_all_byte_exact(tmp_path, direct):
    path = tmp_path / "rows.bin"
    data = write_random_file(path, FILE_BYTES, seed=11)
    n_threads, batches_each, rows_each = 6, 8, 10
    errors: list[str] = []
    with Engine(
        path, threads=4, direct=direct, chunk_bytes=32 << 10, stage_bytes=64 << 10, stage_count=3
    ) as eng:

        def client(k: int) -> None:
            rng = np.random.default_rng(100 + k)
            buf = eng.alloc_host(rows_each * 200_000)
            for b in range(batches_each):
                offsets, lengths = random_rows(rng, FILE_BYTES, rows_each, max_len=190_000)
                pos = pack_into(buf.numel(), lengths, rng)
                pending = [
                    eng.submit(offsets, lengths, None, buf.data_ptr() + pos),
                    eng.submit(offsets[:3], lengths[:3]),
                ]  # staged read-only rows too
                for c in pending:
                    c.wait()
                out = buf.numpy()
                for o, n, p in zip(offsets, lengths, pos):
                    if not np.array_equal(out[p : p + n], data[o : o + n]):
                        errors.append(f"client {k} batch {b}: row at {o:#x} len {n}")

        threads = [threading.Thread(target=client, args=(k,)) for k in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        s = eng.stats()
        assert s["batches"] == n_threads * batches_each * 2 and s["failed_rows"] == 0
        rows = s["pagecache"]["rows"] + s["disk"]["rows"]
        assert rows >= n_threads * batches_each * (rows_each + 3)


def test_close_racing_submits_leaves_no_batch_unfinished(tmp_path):
    """submit() from several threads while close() runs: every batch that was accepted
    finishes (success or ECANCELED) and later submits raise ClosedError; nothing hangs."""
    import errno
    import time

    from tierstore.errors import ClosedError, TierIOError

    path = tmp_path / "rows.bin"
    write_random_file(path, 2 << 20, seed=4)
    eng = Engine(path, threads=2, direct="off", chunk_bytes=4096)
    eng._inject_faults(delay_us=200)
    accepted, refused = [], []

    def client() -> None:
        for _ in range(50):
            try:
                accepted.append(eng.submit(np.arange(8) * 4096 * 8, 4096 * 8))
            except ClosedError:
                refused.append(1)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.02)
    eng.close()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    for c in accepted:
        try:
            assert c.wait(timeout=10)
        except TierIOError as exc:
            assert exc.errno == errno.ECANCELED
    assert all(c.done() for c in accepted) and len(accepted) + len(refused) == 200
