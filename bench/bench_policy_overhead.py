"""Per-decode-step policy bookkeeping for DeepSeek-V4-Flash (pytest-benchmark).

    python -m pytest bench/bench_policy_overhead.py -o python_files='bench_*.py' \
        --benchmark-enable --benchmark-columns=min,median,mean,rounds

One DS4 decode step = 43 MoE layers x top-6 x batch B routed (layer, expert)
keys out of 43 x 256. Measured per policy and batch 1/16/64/256:
- ``step``: one ``on_access`` with the whole step's keys + ``decay()`` (what a
  store that gathers a step's routing before telling the policy pays);
- ``per_layer``: 43 ``on_access`` calls of one layer each + ``decay()``;
- ``victims8``: ``victims(8, pinned)`` on a full 512-slot tier (a lazy pass);
- floor: one ``np.add.at`` of the step's keys into a float64 [11008] array,
  the single scatter any numpy bookkeeping of the step must pay;
- ``prefetch_step``: the prefetcher's work in one decode step of the synthetic
  DS4 trace (43 x ``on_read`` + ``propose`` with the tier's victims, the store's
  record() hook under its lock, + ``end_tick``), through the face
  (tierstore.policies.prefetch) and, as the layer below, the native core's calls alone.
Results: bench/results/hits.md ("Policy overhead"), bench/RESULTS.md.
"""

from __future__ import annotations

import numpy as np
import pytest

from tierstore import policies

L, E, K, SLOTS = 43, 256, 6, 512
N_KEYS = L * E
BATCHES = [1, 16, 64, 256]


def step_keys(batch: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    experts = np.argsort(rng.random((L, batch, E)), axis=2)[:, :, :K]
    return (np.arange(L)[:, None, None] * E + experts).reshape(-1).astype(np.int64)


def full_tier(name: str):
    p = policies.make(name, N_KEYS, SLOTS)
    p.on_admit(np.arange(SLOTS))
    p.on_access(step_keys(16, seed=1))
    return p


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("name", policies.available())
def test_step(benchmark, name, batch):
    p, keys = full_tier(name), step_keys(batch)

    def one_step():
        p.on_access(keys)
        p.decay()

    benchmark.group = f"step batch={batch}"
    benchmark(one_step)
    p.check_invariants()


@pytest.mark.parametrize("batch", [1, 256])
@pytest.mark.parametrize("name", policies.available())
def test_per_layer(benchmark, name, batch):
    p = full_tier(name)
    layers = np.split(step_keys(batch), L)

    def one_step():
        for keys in layers:
            p.on_access(keys)
        p.decay()

    benchmark.group = f"per_layer batch={batch}"
    benchmark(one_step)


@pytest.mark.parametrize("name", policies.available())
def test_victims8(benchmark, name):
    p = full_tier(name)
    pinned = np.zeros(N_KEYS, dtype=bool)
    pinned[step_keys(1)] = True
    benchmark.group = "victims(8)"
    v = benchmark(p.victims, 8, pinned)
    assert v.size == 8 and not pinned[v].any()


@pytest.mark.parametrize("batch", BATCHES)
def test_floor_one_scatter(benchmark, batch):
    acc, keys = np.zeros(N_KEYS), step_keys(batch)
    benchmark.group = f"step batch={batch}"
    benchmark(np.add.at, acc, keys, 1.0)


def _prefetch_steps(n_ticks: int = 96):
    """(layer, experts, keys) per read of the synthetic DS4 trace's decode ticks."""
    from tierstore.sim.counting import Prepared
    from tierstore.sim.synth import synthetic_trace

    prep = Prepared(synthetic_trace(n_ticks, seed=0, prefill_tokens=0))
    E, g = prep.trace.n_experts, prep.gstarts
    ticks: list[list] = [[]]
    for i in range(g.size - 1):
        keys = prep.dkeys[g[i] : g[i + 1]]
        layer = int(keys[0]) // E
        ticks[-1].append((layer, keys - layer * E, keys))
        if prep.g_tick_end[i]:
            ticks.append([])
    return prep.trace.n_layers, E, [t for t in ticks if t]


@pytest.mark.parametrize("level", ["face", "core"])
def test_prefetch_step(benchmark, level):
    """One decode step of the prefetcher over a full 1101-slot (10 %) tier: per layer
    on_read + propose (victims from the tier's policy), then end_tick."""
    from tierstore.policies.prefetch import Prefetcher

    n_layers, n_experts, ticks = _prefetch_steps()
    slots = n_layers * n_experts // 10
    pf = Prefetcher(n_layers, n_experts, slots, top_k=6)
    tier = policies.make("lru", n_layers * n_experts, slots)
    tier.on_admit(np.arange(slots) * 10)
    resident = np.zeros(n_layers * n_experts, dtype=bool)
    resident[np.arange(slots) * 10] = True

    def victims(n, blocked):
        return np.asarray(tier.victims(int(n), blocked), dtype=np.int64)

    state = {"t": 0}
    if level == "face":

        def one_step():
            for layer, experts, keys in ticks[state["t"] % len(ticks)]:
                pf.on_read(layer, experts, resident[keys], experts.size)
                pf.propose(layer, resident, victims)
            pf.end_tick()
            state["t"] += 1
    else:
        core = pf._core

        def one_step():
            for layer, experts, keys in ticks[state["t"] % len(ticks)]:
                core.on_read(layer, experts, resident[keys], experts.size)
                m, wraps = core.target(layer)
                core.propose(layer, core.predict(layer, m, wraps), resident, victims)
            core.end_tick()
            state["t"] += 1

    for _ in range(len(ticks) // 2):  # learned past the first ticks
        one_step()
    benchmark.group = "prefetch step (43 layers)"
    benchmark(one_step)
    assert pf.issued > 0 and pf.lru_reads > 0
