"""ExpertStore bookkeeping benchmarks (pytest-benchmark), CPU pool, DS4 geometry.

    python -m pytest bench/bench_store.py -o python_files='bench_*.py' --benchmark-enable \
        --benchmark-columns=min,median,mean,max,rounds

What one decode step of DeepSeek-V4-Flash costs the store on the CPU
(43 MoE layers x top-6, 256 experts, batch 1 and 256):

- ``record``: 43 ``store.record(layer, topk_ids)`` calls (numpy and torch ids);
- ``record + step``: the same plus ``step()`` (fold into heat + hit counters, decay,
  lazy-candidate choice; lazy I/O off so nothing else runs);
- ``record + step, prefetch``: the same on a store with ``prefetch={"top_k": 6}``: each
  record also runs the prefetcher's hook under the store lock (fold, on_read, propose
  with the pool's victims, pins) and hands its fetch to the worker;
- ``fire``: bookkeeping of a fire whose 258 routed keys are all resident, and a
  fire of 64 new keys whose rows are arena hits (tiny rows, so it is overhead);
- (the ``fold=numpy`` "before" rows of bench/results/store.md came from the numpy fold,
  removed since: the fold is native only; the raw floors below stay as the comparison);
- floors measured in the same run: 43 bare ``list.append`` calls and one
  ``np.bincount`` of a step's keys (the least any Python/numpy fold costs); the two
  policies' ``on_access`` for one step's unique keys (what ``step`` must spend in
  tierstore/policies whatever the fold costs); 43 raw ``RoutingFold.add`` + ``take``.

Results: bench/results/store.md.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import tierstore as ts
from tierstore.testing.packs import make_random_pack

L, E, K, SLOT = 43, 256, 6, 64


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("bench_store"), L, E, SLOT, seed=1)


@pytest.fixture(scope="module")
def store(pack):
    s = ts.ExpertStore(
        pack, vram_slots=1024, ram_gb=2048 * pack.stride / 2**30, device="cpu", lazy_per_step=0, threads=4
    )
    yield s
    s.close()


def routing(batch: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        np.stack([rng.choice(E, K, replace=False) for _ in range(batch)]).astype(np.int64) for _ in range(L)
    ]


@pytest.mark.parametrize("batch", [1, 256])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_record_one_ds4_step(benchmark, store, batch, kind):
    ids = routing(batch)
    if kind == "torch":
        ids = [torch.from_numpy(a) for a in ids]

    def step_records():
        for layer in range(L):
            store.record(layer, ids[layer])

    benchmark.group = f"record batch={batch}"
    benchmark(step_records)
    store.step()  # drain the queue so the next benchmark starts clean


@pytest.mark.parametrize("batch", [1, 256])
def test_record_and_step_one_ds4_step(benchmark, store, batch):
    ids = routing(batch, seed=1)

    def one_step():
        for layer in range(L):
            store.record(layer, ids[layer])
        store.step()

    benchmark.group = f"record+step batch={batch}"
    benchmark(one_step)


@pytest.mark.parametrize("batch", [1, 256])
def test_floor_policies_on_access(benchmark, store, batch):
    ids = routing(batch, seed=1)
    for layer in range(L):
        store.record(layer, ids[layer])
    with store.lock:
        keys, weights, _ = store._recorder.take(
            None, store._pool.resident_slot, store._arena.resident_slot, store._seen
        )
        keys, weights = keys.copy(), weights.copy()
    store.step()

    def policies():
        store.pool_policy.on_access(keys, weights=weights)
        store.arena_policy.on_access(keys, weights=weights)

    benchmark.group = f"record+step batch={batch}"
    benchmark(policies)


@pytest.mark.parametrize("batch", [1, 256])
def test_floor_native_fold(benchmark, batch):
    from tierstore import _C

    ids = routing(batch, seed=1)
    fold = _C.RoutingFold(L, E)
    fold.bind(np.zeros(L * E, bool), np.full(L * E, -1, np.int32), np.full(L * E, -1, np.int32))

    def add_take():
        for layer in range(L):
            fold.add(layer, ids[layer])
        fold.take()

    benchmark.group = f"record+step batch={batch}"
    benchmark(add_take)


@pytest.mark.parametrize("batch", [1, 256])
def test_floor_python_appends_and_bincount(benchmark, batch):
    ids = routing(batch, seed=2)
    keys = np.concatenate([a.reshape(-1) + l * E for l, a in enumerate(ids)])

    def floor():
        q = []
        for layer in range(L):
            q.append((layer, ids[layer]))
        np.bincount(keys, minlength=L * E)

    benchmark.group = f"record batch={batch}"
    benchmark(floor)


@pytest.mark.parametrize("batch", [1, 256])
def test_floor_python_appends(benchmark, batch):
    ids = routing(batch, seed=2)

    def floor():
        q = []
        for layer in range(L):
            q.append((layer, ids[layer]))

    benchmark.group = f"record batch={batch}"
    benchmark(floor)


def test_fire_all_resident_bookkeeping(benchmark, store):
    # An int array [258, 2], as the adapters pass it (a Python list of tuples would add
    # ~100 us of list -> array conversion here).
    routed = np.array([(l, e) for l, a in enumerate(routing(1, seed=3)) for e in a.reshape(-1)])
    store.promote(routed).wait(60)

    def fire_release():
        store.release(store.fire(routed))

    benchmark.group = "fire"
    benchmark(fire_release)


def test_fire_64_arena_hits(benchmark, store):
    rng = np.random.default_rng(4)
    dense = rng.choice(L * E, 64, replace=False)
    keys = np.stack([dense // E, dense % E], axis=1)
    store.load_arena(keys)

    def setup():
        store.evict(keys)
        return (), {}

    def fire_release():
        fr = store.fire(keys)
        assert fr.promoted == 64 and fr.sources["arena"] == 64
        store.release(fr)

    benchmark.group = "fire"
    benchmark.pedantic(fire_release, setup=setup, rounds=200, warmup_rounds=5)


@pytest.fixture(scope="module")
def prefetch_store(pack):
    s = ts.ExpertStore(
        pack,
        vram_slots=1101,
        ram_gb=2048 * pack.stride / 2**30,
        device="cpu",
        lazy_per_step=0,
        threads=4,
        prefetch={"top_k": K},
    )
    yield s
    s.close()


@pytest.mark.parametrize("batch", [1, 16])
def test_record_and_step_one_ds4_step_prefetch(benchmark, prefetch_store, batch):
    """A decode step of synthetic DS4 routing (learnable, unlike ``routing``'s), cycling
    through 64 ticks after 32 to learn from."""
    from tierstore.sim.synth import synthetic_trace

    tr = synthetic_trace(96, batch=batch, prefill_tokens=0, seed=2)
    ticks = [
        [tr.experts[(tr.ticks == t) & (tr.layers == layer)].astype(np.int64) for layer in range(L)]
        for t in range(96)
    ]
    state = {"t": 0}

    def one_step():
        for layer, ids in enumerate(ticks[32 + state["t"] % 64]):
            prefetch_store.record(layer, ids)
        prefetch_store.step()
        state["t"] += 1

    for step in ticks[:32]:
        for layer, ids in enumerate(step):
            prefetch_store.record(layer, ids)
        prefetch_store.step()
    benchmark.group = f"record+step prefetch batch={batch}"
    benchmark(one_step)
    assert prefetch_store.prefetch.counts()["issued"] > 0
