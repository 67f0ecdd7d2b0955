"""Metrics overhead at the store's public API (pytest-benchmark), CPU pool, DS4 geometry.

    python -m pytest bench/bench_metrics.py -o python_files='bench_*.py' --benchmark-enable \
        --benchmark-columns=min,median,mean,rounds --benchmark-sort=name

DeepSeek-V4-Flash shape: 43 MoE layers x 256 experts, top-6, batch 1 (258 routed keys a
step); rows of 64 bytes so that I/O does not hide bookkeeping. Three store modes:

- ``off``: ``TIERSTORE_METRICS=0`` (no per-layer counts; the fire histogram's one
  bucket add stays: it is always on);
- ``on``: the setting on (default) and the store registered (in-process collector);
- ``on+writer``: also the multiprocess writer thread copying the store's counters into
  a metrics directory every 50 ms (20x the default rate: the worst lock contention).

Measured per mode:

- ``fired step``: one decode step with a fire: 43 ``record`` + ``fire`` of the step's
  routed keys (all resident) + ``release`` + ``step``. The fire folds the step's routing
  (with metrics on: one bincount for the per-layer split) and observes its latency;
- ``fire 64 new``: a fire of 64 keys not in the pool, rows from the arena (one load
  batch: with metrics on, one bincount of rows read per layer); the keys are evicted
  again outside the timed part;
- ``collect``: one scrape of the registered store (families built from its counters;
  what the exporter or the writer thread pays per interval, off the forward path).

Results: bench/RESULTS.md ("Metrics").
"""

from __future__ import annotations

import numpy as np
import pytest

import tierstore as ts
from tierstore import metrics, settings
from tierstore.testing.packs import make_random_pack

L, E, K, SLOT = 43, 256, 6, 64
MODES = ["off", "on", "on+writer"]


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("bench_metrics"), L, E, SLOT, seed=2)


@pytest.fixture(scope="module", params=MODES)
def store(request, pack, tmp_path_factory):
    mode = request.param
    overrides = {"metrics": mode != "off"}
    if mode == "on+writer":
        overrides.update(metrics_dir=str(tmp_path_factory.mktemp("prom")), metrics_interval_s=0.05)
    with settings.override(**overrides):
        s = ts.ExpertStore(
            pack, vram_slots=1024, ram_gb=2048 * pack.stride / 2**30, device="cpu", lazy_per_step=0, threads=2
        )
        handle = metrics.register_store(s, {"bench": mode}) if mode != "off" else None
        s.mode = mode
        yield s
        if handle is not None:
            handle.close()
        s.close()


def routing(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.choice(E, K, replace=False).astype(np.int64)[None, :] for _ in range(L)]


def test_fired_step(benchmark, store):
    ids = routing(0)
    routed = np.array([(layer, int(e)) for layer in range(L) for e in ids[layer][0]])
    store.release(store.fire(routed))  # resident from here on

    def fired_step():
        for layer in range(L):
            store.record(layer, ids[layer])
        store.release(store.fire(routed))
        store.step()

    benchmark.group = "fired step (43 records + fire of 258 resident + release + step)"
    benchmark(fired_step)


def test_fire_64_new(benchmark, store):
    keys = np.array([(layer, 200 + j) for layer in range(8) for j in range(8)])
    store.load_arena(keys)

    def evict():
        store.evict(keys)

    def fire():
        store.release(store.fire(keys))

    benchmark.group = "fire of 64 new keys from the arena"
    benchmark.pedantic(fire, setup=evict, rounds=300, warmup_rounds=10)


def test_collect(benchmark, store):
    if store.mode == "off":
        pytest.skip("nothing registered")
    from prometheus_client import generate_latest

    registry = metrics.scrape_registry() if store.mode == "on" else None
    benchmark.group = "collect (families of one DS4 store)"
    if registry is not None:
        benchmark(generate_latest, registry)
    else:
        benchmark(metrics.write_now)
