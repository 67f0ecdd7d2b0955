"""TierstoreBackend.rows_for: vLLM-Moet's store-backend call over tierstore's engine."""
from __future__ import annotations

import os

import numpy as np
import pytest

from adapter_helpers import one_torch_thread  # noqa: F401
from tierstore.adapters.moet_backend import TierstoreBackend, as_tensor_rows
from tierstore.errors import ConfigError, FormatError, TierIOError
from tierstore.store.expert_store import ExpertStore
from tierstore.testing.packs import make_random_pack

pytestmark = pytest.mark.usefixtures("one_torch_thread")
L, E, SLOT = 3, 6, 5000     # slot_bytes not a multiple of 4096: rows are strided


@pytest.fixture
def store(tmp_path):
    pack = make_random_pack(tmp_path, L, E, SLOT, seed=3, layers=[0, 2])
    s = ExpertStore(pack, vram_slots=8, ram_gb=4 * pack.stride / 2**30, device="cpu")
    yield s
    s.close()


def test_rows_are_the_pack_rows_in_the_order_asked_with_repeats(store):
    pairs = [(2, 5), (0, 1), (2, 5), (0, 0)]
    rows = TierstoreBackend(store).rows_for(pairs)
    assert len(rows) == 4 and all(r.dtype == np.uint8 and r.shape == (SLOT,) for r in rows)
    for (layer, expert), row in zip(pairs, rows):
        assert np.array_equal(row, store.pack.read_row(layer, expert))


def test_default_admits_rows_to_the_arena_and_serves_hits_from_it(store):
    backend = TierstoreBackend(store)
    backend.rows_for([(0, 1), (0, 2)])
    assert store.arena.n_resident == 2
    rows = backend.rows_for([(0, 1)])
    assert backend.hits >= 1
    assert np.array_equal(rows[0], store.pack.read_row(0, 1))


def test_scan_reads_misses_without_admitting_them(store):
    backend = TierstoreBackend(store)
    rows = backend.rows_for([(0, e) for e in range(E)], scan=True)
    assert store.arena.n_resident == 0 and backend.reads == E
    assert all(np.array_equal(r, store.pack.read_row(0, e)) for e, r in enumerate(rows))


def test_copy_gives_rows_that_outlive_arena_eviction(store):
    backend = TierstoreBackend(store)
    kept = backend.rows_for([(0, 0)], copy=True)[0]
    backend.rows_for([(2, e) for e in range(E)])            # churn the 4-row arena
    assert np.array_equal(kept, store.pack.read_row(0, 0))


def test_pack_reads_reuse_one_stage_unless_the_caller_owns_the_rows(store):
    backend = TierstoreBackend(store)
    first = backend.rows_for([(0, 1)], scan=True)[0]
    owned = backend.rows_for([(0, 2)], scan=True, copy=True)[0]
    second = backend.rows_for([(0, 3)], scan=True)[0]
    assert second.ctypes.data == first.ctypes.data           # same stage, no new pages
    assert owned.ctypes.data != first.ctypes.data
    assert np.array_equal(owned, store.pack.read_row(0, 2))
    assert np.array_equal(first, store.pack.read_row(0, 3))  # the documented lifetime
    assert first.ctypes.data % 4096 == 0                     # O_DIRECT lands in place


def test_empty_request_reads_nothing(store):
    assert TierstoreBackend(store).rows_for(np.zeros((0, 2), np.int64)) == []


@pytest.mark.parametrize("pair, error, needle", [
    ((1, 0), FormatError, "layer 1 is not written"),
    ((0, E), ConfigError, f"{E}"),
    ((L, 0), ConfigError, f"{L}"),
])
def test_bad_pairs_are_refused_before_any_read(store, pair, error, needle):
    backend = TierstoreBackend(store)
    with pytest.raises(error, match=needle):
        backend.rows_for([(0, 0), pair])
    assert backend.reads == 0 and store.arena.n_resident == 0


def test_a_read_past_a_truncated_file_is_a_tier_io_error_naming_the_pack(store):
    # fault injection: the pack loses its tail after it was validated and opened
    os.truncate(store.pack.path, store.pack.row_offset(2, 0))
    with pytest.raises(TierIOError, match=os.path.basename(store.pack.path)):
        TierstoreBackend(store).rows_for([(2, 3)], scan=True)


def test_tensor_view_shares_memory():
    rows = [np.arange(8, dtype=np.uint8)]
    t = as_tensor_rows(rows)[0]
    rows[0][0] = 99
    assert int(t[0]) == 99
