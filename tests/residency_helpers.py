"""The device-side residency rule of csrc/store/include/tierstore/store/residency.hpp,
written again in plain Python as the tests' oracle (one slot at a time, dicts and
lists; nothing shared with the native code), and the stores the residency tests use."""

from __future__ import annotations

import numpy as np

LOCKED = 0xFFFFFFFF


class ClockOracle:
    """CLOCK over ``n_slots`` slots of a model of ``n_layers`` x ``n_experts`` keys."""

    def __init__(self, n_layers: int, n_experts: int, n_slots: int, arena_keys=None):
        self.E, self.n = n_experts, n_slots
        self.table = {}  # key -> slot
        self.owner = [-1] * n_slots
        self.stamp = [0] * n_slots
        self.ref = [0] * n_slots
        self.hand, self.epoch = 0, 0
        self.arena = None if arena_keys is None else set(int(k) for k in arena_keys)
        self.c = dict(decides=0, routed=0, hits=0, misses=0, placed=0, no_arena=0, no_slot=0, evicted=0)
        self.victims: list[int] = []  # keys evicted by the last decide

    def decide(self, layer: int, ids) -> list[tuple[int, int]]:
        """One decide; returns the plan [(key, slot or -1)] in miss order."""
        self.epoch += 1
        if self.epoch % (1 << 32) == LOCKED:
            self.epoch += 1
        ep = self.epoch % (1 << 32)
        seen, misses = set(), []
        self.victims = []
        for e in (int(i) for i in np.asarray(ids).reshape(-1)):
            if not 0 <= e < self.E:
                continue
            self.c["routed"] += 1
            if e in seen:
                continue
            seen.add(e)
            key = layer * self.E + e
            if key in self.table:
                s = self.table[key]
                self.stamp[s], self.ref[s] = ep, 1
                self.c["hits"] += 1
            else:
                misses.append(key)
        plan = []
        for key in misses:
            if self.arena is not None and key not in self.arena:
                self.c["no_arena"] += 1
                plan.append((key, -1))
                continue
            slot = self._sweep(ep)
            if slot < 0:
                self.c["no_slot"] += 1
                plan.append((key, -1))
                continue
            old = self.owner[slot]
            if old >= 0:
                del self.table[old]
                self.victims.append(old)
                self.c["evicted"] += 1
            self.owner[slot], self.stamp[slot], self.ref[slot] = key, ep, 1
            self.table[key] = slot
            self.c["placed"] += 1
            plan.append((key, slot))
        self.c["misses"] += len(misses)
        self.c["decides"] += 1
        return plan

    def _sweep(self, ep: int) -> int:
        if self.n == 0:
            return -1
        for k in range(2 * self.n + 32):
            s = (self.hand + k) % self.n
            if self.stamp[s] in (ep, LOCKED):
                continue
            if self.ref[s]:
                self.ref[s] = 0
                continue
            self.hand = (s + 1) % self.n
            return s
        return -1

    def lock(self, keys) -> None:
        for key in keys:
            self.stamp[self.table[int(key)]] = LOCKED

    def table_array(self, n_keys: int) -> np.ndarray:
        out = np.full(n_keys, -1, dtype=np.int64)
        for key, slot in self.table.items():
            out[key] = slot
        return out


def residency_store(
    tmp_path, n_layers=3, n_experts=8, slot_bytes=256, slots=5, arena_keys=None, device="cpu", seed=1
):
    """A store over a random pack with ``slots`` pool slots and an arena holding
    ``arena_keys`` ((layer, expert) pairs; default every key)."""
    import tierstore as ts
    from tierstore.testing.packs import make_random_pack

    pack = make_random_pack(tmp_path, n_layers, n_experts, slot_bytes, seed=seed)
    keys = (
        [(l, e) for l in range(n_layers) for e in range(n_experts)]
        if arena_keys is None
        else list(arena_keys)
    )
    store = ts.ExpertStore(
        pack,
        vram_slots=slots,
        ram_gb=max(1, len(keys)) * pack.stride / 2**30,
        device=device,
        lazy_per_step=0,
        threads=2,
    )
    if keys:
        store.load_arena(keys)
    return pack, store
