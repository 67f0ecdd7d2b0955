"""Concurrency stress: fires (plain and pipelined), record/step, promote tickets,
ensure_resident, a warm preheat and close() all at once on one store, round after round,
on real pack files. After each round: every published pool slot and resident arena row
holds exactly its pack row, every ticket finished, no pin is left, and a closed store
holds no fd of its pack. A hang is a failure with every thread's stack (Crew.join,
faulthandler), never a stuck suite.

Bounded for CI (~30 s per device on two cores); STRESS_SECONDS=600 soaks."""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import warnings

import numpy as np
import pytest
from stress_helpers import (
    Crew,
    check_published_bytes,
    leaked_pack_fds,
    stress_seconds,
    try_rewrite,
    wait_ticket,
)

import tierstore as ts
from tierstore.testing.packs import make_random_pack, random_layer_rows

L, E, SLOT, SEED = 4, 32, 2000, 23
N_SLOTS, ARENA_ROWS = 24, 40
ROUND_S = 0.6  # one round's busy time
CI_SECONDS = 14.0  # per device; STRESS_SECONDS overrides
TOTAL = {"fires": 0}  # fires across every round and device (printed)


@pytest.fixture(scope="module")
def stress_pack(tmp_path_factory):
    d = tmp_path_factory.mktemp("stress")
    pack = make_random_pack(d, L, E, SLOT, seed=SEED)
    pack.close()  # the stores open it by path (and must close it)
    rows = np.stack([random_layer_rows(SEED, l, E, SLOT) for l in range(L)]).reshape(L * E, SLOT)
    return pack.path, rows, d


def _warm_file(pack_path, d, device):
    """A poolmon of a store that ran a few fires: what the preheat thread loads."""
    path = os.path.join(d, f"warm-{device.replace(':', '')}.json")
    if not os.path.exists(path):
        with ts.ExpertStore(pack_path, vram_slots=N_SLOTS, device=device, lazy_per_step=0) as s:
            rng = np.random.default_rng(5)
            for _ in range(6):
                s.release(s.fire([(int(k // E), int(k % E)) for k in rng.choice(L * E, 6, replace=False)]))
            s.save_poolmon(path)
    return path


def _keys(rng, n):
    return [(int(k // E), int(k % E)) for k in rng.choice(L * E, n, replace=False)]


def _run_round(pack_path, rows, warm, device, seed, close_midway, counts):
    store = ts.ExpertStore(
        pack_path,
        vram_slots=N_SLOTS,
        ram_gb=ARENA_ROWS * 2048 / 2**30,
        device=device,
        threads=2,
        lazy_per_step=3,
    )
    crew, tickets = Crew(), []
    closed = (ts.ClosedError,)

    def forward(tid):
        rng = np.random.default_rng([seed, tid])
        hot = rng.choice(L * E, 16, replace=False)
        table = store.tier("pool")
        try:
            while not crew.stop.is_set():
                for layer in range(L):
                    store.record(layer, rng.choice(hot, (2, 2)) % E)
                pipelined = rng.random() < 0.25
                fr = store.fire(
                    _keys(rng, int(rng.integers(1, 5))),
                    max_promote=int(rng.integers(0, 4)),
                    pipelined=pipelined,
                )
                counts["fires"] += 1
                if pipelined:
                    for layer in range(L):
                        fr.wait_layer(layer)
                view = table.device_table()
                pool = store.pool.cpu().numpy() if store.pool.is_cuda else store.pool.numpy()
                for k in fr.keys.tolist():  # pinned: resident and its bytes stay put
                    slot = int(view[k])
                    assert slot >= 0, f"pinned key {k} is not published"
                    assert np.array_equal(pool[slot, :SLOT], rows[k]), f"key {k}: wrong bytes"
                store.release(fr)
                if tid == 0:
                    store.step()
        except closed:
            return

    def promoter():
        rng = np.random.default_rng([seed, 10])
        try:
            while not crew.stop.is_set():
                tk = store.promote(_keys(rng, int(rng.integers(1, 6))))
                tickets.append(tk)
                if rng.random() < 0.5:
                    wait_ticket(tk, closed_ok=closed)
                    counts["promotes"] += 1
        except closed:
            return

    def prefill():
        rng = np.random.default_rng([seed, 11])
        try:
            while not crew.stop.is_set():
                store.ensure_resident(int(rng.integers(L)), rng.integers(0, E, size=5))
                counts["prefills"] += 1
                time.sleep(0.002)
        except closed:
            return

    def preheater():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "stopped early" once close() wins
            while not crew.stop.is_set():
                try:
                    store.preheat(warm, progress=False)
                except closed:
                    return
                counts["preheats"] += 1

    def stats_reader():
        try:
            while not crew.stop.is_set():
                st = store.stats()
                assert st.pool.resident <= N_SLOTS
                time.sleep(0.003)
        except closed:
            return

    def rewriter():  # PackWriter vs the live store: refused (reader lock), never torn
        rng = np.random.default_rng([seed, 12])
        while not crew.stop.is_set() and not store.closed:
            layer = int(rng.integers(L))
            if try_rewrite(pack_path, layer, rows[layer * E : (layer + 1) * E]):
                assert store.closed, "a PackWriter rewrote the pack under a live store"
                return
            counts["rewrites_refused"] += 1
            time.sleep(0.01)

    for tid in range(3):
        crew.spawn(forward, tid, name=f"forward{tid}")
    for fn in (promoter, prefill, preheater, stats_reader, rewriter):
        crew.spawn(fn)
    rng = np.random.default_rng([seed, 99])
    if close_midway:
        time.sleep(ROUND_S * float(rng.uniform(0.2, 1.0)))
        closer = threading.Thread(target=store.close, name="closer", daemon=True)
        closer.start()
        crew.threads.append(closer)
    else:
        time.sleep(ROUND_S)
    crew.stop.set()
    crew.join(30)
    for tk in tickets:  # every ticket finishes, promoted or refused
        wait_ticket(tk, closed_ok=closed)
    counts["checked"] += check_published_bytes(store, rows)
    if not store.closed:
        assert store.wait_idle(30), "the worker never went idle"
        store.step()  # releases the last prefill's pins
        assert store.stats().pool.pinned == 0, "pool pins leaked"
        assert store.stats().arena.pinned == 0, "arena pins leaked"
        store.check_invariants()
        counts["checked"] += check_published_bytes(store, rows)
    store.close()
    assert store.wait_idle(30)
    assert not store.worker_alive
    assert not leaked_pack_fds(pack_path), leaked_pack_fds(pack_path)


def _stress(stress_pack, device, budget):
    pack_path, rows, d = stress_pack
    warm = _warm_file(pack_path, d, device)
    counts = dict.fromkeys(
        ("fires", "promotes", "prefills", "preheats", "checked", "rewrites_refused", "rounds"), 0
    )
    faulthandler.dump_traceback_later(budget + 120, exit=False)  # last resort: stacks on stderr
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < budget:
            r = counts["rounds"]
            _run_round(pack_path, rows, warm, device, seed=r, close_midway=r % 2 == 1, counts=counts)
            counts["rounds"] += 1
    finally:
        faulthandler.cancel_dump_traceback_later()
    TOTAL["fires"] += counts["fires"]
    print(f"\nstress {device}: {counts} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    assert counts["rounds"] >= 2 and counts["fires"] > 0 and counts["checked"] > 0
    assert counts["rewrites_refused"] > 0
    return counts


def test_concurrent_fires_promotes_preheat_and_close_on_a_cpu_store(stress_pack):
    _stress(stress_pack, "cpu", stress_seconds(CI_SECONDS))


@pytest.mark.gpu
def test_concurrent_fires_promotes_preheat_and_close_on_a_gpu_store(stress_pack):
    _stress(stress_pack, "cuda", stress_seconds(CI_SECONDS))
