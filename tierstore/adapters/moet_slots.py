"""Slot ownership of the FP4 tier's pool: owners, the free list, victims, the host mirror.

Host-only bookkeeping (no device call), used under the tier's lock. Victim
choice follows vLLM-Moet's rules (its ``_take_slots_batch``): free slots first,
then the least valuable owner by the policy's key (``need``, ``freq``, or the
last-seen tick for ``lru``), never a step- or layer-pinned slot; pass 1 also
spares owners in the current seen window and owners seen less than ``min_cold``
ticks ago; an emergency take (the runner's synchronous fire) relaxes first the
coldness, then the seen window. ``protect_hot`` keeps the hottest half of the
pool (prefill's flood damper).

Unlike vLLM-Moet, a take is a reservation: ``take`` returns the victims it
chose and changes nothing until ``commit`` (map the new owners) or ``cancel``
(give every slot back, victims keep their rows) — so a failed read loses no slot.
"""
from __future__ import annotations

import numpy as np
import torch


class SlotOwners:
    def __init__(self, n_slots: int, n_layers: int, n_experts: int, policy: str):
        self.n_layers, self.E, self.policy = int(n_layers), int(n_experts), policy
        # slot -> dense key (layer * E + expert), -1 = free; a torch view so vLLM-Moet's
        # base tier may index the mirror with torch indices (split-FP4 coupling)
        self.mirror = torch.full((self.n_layers, self.E), -1, dtype=torch.int32)
        self._mirror_flat = self.mirror.view(-1).numpy()
        self.freq = np.zeros(self.n_layers * self.E, np.float64)
        self.need = np.zeros(self.n_layers * self.E, np.float64)
        self.tick = 0
        self.step_pins: set[int] = set()
        self.layer_pins: set[int] = set()
        self.reset(n_slots)

    def reset(self, n_slots: int) -> None:
        self.n_slots = int(n_slots)
        self.owner = np.full(self.n_slots, -1, np.int64)
        self.owner_tick = np.zeros(self.n_slots, np.int64)
        self.free = list(range(self.n_slots - 1, -1, -1))   # pop() hands out slot 0 first
        self._mirror_flat[:] = -1

    # -- lookups -----------------------------------------------------------------------
    def slot_of(self, keys: np.ndarray) -> np.ndarray:
        return self._mirror_flat[keys].astype(np.int64)

    def mapped_keys(self) -> np.ndarray:
        return np.flatnonzero(self._mirror_flat >= 0)

    def key(self) -> np.ndarray:
        """Per-slot eviction value (lower goes first) under the policy."""
        k = np.clip(self.owner, 0, None)
        if self.policy == "need":
            return self.need[k].copy()
        if self.policy == "freq":
            return self.freq[k].copy()
        return self.owner_tick.astype(np.float64)

    def touch(self, slots: np.ndarray) -> None:
        self.owner_tick[slots] = self.tick

    # -- reservations ----------------------------------------------------------------------
    def take(self, k: int, window: np.ndarray, *, emergency: bool = False, min_cold: int = 2,
             protect_hot: bool = False) -> tuple[list[int], list[int]]:
        """Reserve up to ``k`` slots; returns (slots, victim keys, -1 where a slot was free).
        ``window`` is a bool [n_layers * E] of keys seen in the current window."""
        m = min(max(int(k), 0), len(self.free))   # free slots first, in pop() order
        slots = self.free[len(self.free) - m:][::-1]
        del self.free[len(self.free) - m:]
        victims = [-1] * m
        need = k - len(slots)
        if need <= 0 or self.n_slots == 0:
            return slots, victims
        key = self.key()
        hard = self.owner < 0
        pins = list(self.step_pins | self.layer_pins)
        if pins:
            hard[pins] = True
        if protect_hot:
            valid = np.flatnonzero(self.owner >= 0)
            n_hot = min(self.n_slots // 2, len(valid))
            if n_hot:
                hard[valid[np.argsort(-key[valid], kind="stable")[:n_hot]]] = True
        soft = hard | window[np.clip(self.owner, 0, None)]
        passes = [soft | ((self.tick - self.owner_tick) < min_cold)]
        if emergency:
            passes += [soft, hard]
        taken = np.zeros(self.n_slots, bool)
        for blocked in passes:
            need = k - len(slots)
            if need <= 0:
                break
            cand = np.flatnonzero(~(blocked | taken))
            if not len(cand):
                continue
            chosen = cand[np.argsort(key[cand], kind="stable")[:need]]
            taken[chosen] = True
            slots.extend(chosen.tolist())
            victims.extend(self.owner[chosen].tolist())
        return slots, victims

    def cancel(self, slots, victims) -> None:
        """Give back a reservation: free slots return to the free list, victims keep theirs."""
        slots, victims = np.asarray(slots, np.int64), np.asarray(victims, np.int64)
        self.free.extend(slots[victims < 0].tolist())

    def commit(self, keys, slots, victims) -> None:
        """Map ``keys[i]`` to ``slots[i]``, unmapping each victim. Victims are mapped keys
        and the new keys unmapped ones, so the two sets are disjoint and the writes below
        (all victims, then all keys) equal a row-by-row pass, without a loop per row."""
        keys = np.asarray(keys, np.int64)
        slots, victims = np.asarray(slots, np.int64), np.asarray(victims, np.int64)
        self._mirror_flat[victims[victims >= 0]] = -1
        self.owner[slots] = keys
        self.owner_tick[slots] = self.tick
        self._mirror_flat[keys] = slots

    def quarantine(self, slots, victims) -> None:
        """A copy failed mid-way: the slots' bytes are unknown, so nobody maps them."""
        slots, victims = np.asarray(slots, np.int64), np.asarray(victims, np.int64)
        self._mirror_flat[victims[victims >= 0]] = -1
        self.owner[slots] = -1
        listed = set(self.free)
        self.free.extend(s for s in dict.fromkeys(slots.tolist()) if s not in listed)

    def decay(self, factor: float) -> None:
        self.freq *= factor
        self.need *= factor
