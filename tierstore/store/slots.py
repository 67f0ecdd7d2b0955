"""The slot state machine shared by the VRAM pool and the RAM arena.

Every slot (a pool slot or an arena row) is in one state::

    FREE --take--> LOADING --commit--> RESIDENT --evict/take--> EVICTING --> FREE
                      |                                             |
                      +--rollback--> FREE          (reused) begin_load --> LOADING

``EVICTING`` means "no longer visible to readers, but a reader that looked it up
before may still be using the old bytes"; the owner of the tier decides when
that is over (for the pool: after the unpublish event on the consumer stream).
An EVICTING slot taken for a new key already names that key as its owner.

Keys are dense ids ``layer * n_experts + expert``. Pins count per key; a pinned
key is never chosen as a victim. The tier's policy sees exactly the RESIDENT set
(on_admit at commit, on_evict when a key leaves RESIDENT), so the victims it
returns are always RESIDENT keys.

Thread safety: none. The store serialises every call under its lock; nothing
here does I/O or waits.
"""

from __future__ import annotations

import numpy as np

from tierstore.policies.fill import plan_fill

FREE, LOADING, RESIDENT, EVICTING = 0, 1, 2, 3
STATE_NAMES = ("FREE", "LOADING", "RESIDENT", "EVICTING")
_EMPTY = np.empty(0, dtype=np.int64)


class Taken:
    """What ``take`` handed out: ``keys[i]`` goes into ``slots[i]``; ``victims`` are
    the RESIDENT keys that left to make room (their slots are in ``reused``)."""

    __slots__ = ("keys", "slots", "victims", "reused", "applied")

    def __init__(self, keys, slots, victims, reused):
        self.keys, self.slots, self.victims, self.reused = keys, slots, victims, reused
        self.applied = False

    def __len__(self) -> int:
        return len(self.keys)


class SlotStates:
    """Per-slot state, owner and per-key pins of one tier of ``n_slots`` slots."""

    def __init__(self, n_slots: int, n_keys: int, policy, tier: str):
        self.tier = tier
        self.n_slots = int(n_slots)
        self.n_keys = int(n_keys)
        self.policy = policy
        self.state = np.full(self.n_slots, FREE, dtype=np.int8)
        self.owner = np.full(self.n_slots, -1, dtype=np.int64)
        self.slot_of = np.full(self.n_keys, -1, dtype=np.int64)  # any non-FREE state
        self.resident_slot = np.full(self.n_keys, -1, dtype=np.int32)  # RESIDENT only
        self.key_pins = np.zeros(self.n_keys, dtype=np.int32)
        self.admissions = 0
        self.evictions = 0

    # -- queries ---------------------------------------------------------------
    @property
    def n_free(self) -> int:
        return int(np.count_nonzero(self.state == FREE))

    @property
    def n_resident(self) -> int:
        return int(np.count_nonzero(self.state == RESIDENT))

    def hot_mask(self, share: float) -> np.ndarray | None:
        """Boolean [n_keys]: the hottest RESIDENT keys, up to ``share`` of the tier's
        capacity (scan protection: "keep the hottest half of the pool")."""
        if share <= 0:
            return None
        res = self.owner[self.state == RESIDENT]
        k = min(int(self.n_slots * share), len(res))
        mask = np.zeros(self.n_keys, dtype=bool)
        if k >= len(res):
            mask[res] = True
        elif k > 0:
            heat = self.policy.scores()[res]
            mask[res[np.argpartition(-heat, k - 1)[:k]]] = True
        return mask

    def resident_keys(self) -> np.ndarray:
        """Dense ids of the RESIDENT keys, hottest first (by the tier's policy)."""
        res = self.owner[self.state == RESIDENT]
        if len(res) <= 1:
            return res.copy()
        heat = self.policy.scores()[res]
        return res[np.lexsort((res, -heat))]

    # -- pins --------------------------------------------------------------------
    def pin(self, keys: np.ndarray) -> None:
        """``keys`` must be unique (one pin each)."""
        self.key_pins[keys] += 1

    def unpin(self, keys: np.ndarray) -> None:
        if len(keys) and np.any(self.key_pins[keys] <= 0):
            bad = keys[self.key_pins[keys] <= 0][0]
            raise AssertionError(f"{self.tier}: unpin of key {int(bad)} that is not pinned")
        self.key_pins[keys] -= 1

    # -- transitions ---------------------------------------------------------------
    def take(self, keys: np.ndarray, *, allow_evict: bool, protect: np.ndarray | None = None) -> Taken:
        """Reserve slots for ``keys`` (unique, hottest first, none already in this tier):
        FREE slots first, then (``allow_evict``) victims from the policy that are
        neither pinned nor in ``protect``. Keys beyond what fits get nothing.
        Victims go RESIDENT -> EVICTING, FREE slots -> LOADING."""
        taken = self.choose(keys, allow_evict=allow_evict, protect=protect)
        self.apply(taken)
        return taken

    def choose(self, keys: np.ndarray, *, allow_evict: bool, protect: np.ndarray | None = None) -> Taken:
        """``take``'s decision, changing nothing (``apply`` makes it so)."""
        n = len(keys)
        if n == 0 or self.n_slots == 0:
            return Taken(keys[:0], _EMPTY, _EMPTY, _EMPTY)
        free = np.flatnonzero(self.state == FREE)[:n]
        victims, reused = _EMPTY, _EMPTY
        if len(free) < n and allow_evict:
            blocked = self.key_pins > 0
            if protect is not None:
                blocked |= protect
            # The one fill decision (no admission here: a take is an order).
            victims = plan_fill(self.policy, keys, len(free), blocked).victims
            # Defensive: a policy may only name RESIDENT, unpinned keys.
            victims = victims[(self.resident_slot[victims] >= 0) & ~blocked[victims]]
            reused = self.resident_slot[victims].astype(np.int64)
        keys = keys[: len(free) + len(victims)]
        slots = np.concatenate([free, reused]) if len(reused) else free
        return Taken(keys, slots, victims, reused)

    def apply(self, taken: Taken) -> None:
        """Make a ``choose`` decision so. Safe to run again after a Ctrl-C cut it anywhere
        (a journal step, store/interrupts.py): only the last statement counts."""
        keys, slots, victims, reused = taken.keys, taken.slots, taken.victims, taken.reused
        n_free = len(slots) - len(reused)
        if len(victims):
            self.resident_slot[victims] = -1
            self.slot_of[victims] = -1
            self.policy.on_evict(victims)  # a resident mask: evicting twice is once
            self.state[reused] = EVICTING
            self.owner[reused] = keys[n_free:]
        self.state[slots[:n_free]] = LOADING
        self.owner[slots[:n_free]] = keys[:n_free]
        self.slot_of[keys] = slots
        if len(victims) and not taken.applied:
            taken.applied = _counted_evictions(self, len(victims))

    def begin_load(self, slots: np.ndarray) -> None:
        """EVICTING slots (taken for a new key) may now be overwritten (run again: no-op)."""
        assert np.all((self.state[slots] == EVICTING) | (self.state[slots] == LOADING)), (
            f"{self.tier}: begin_load of a non-EVICTING slot"
        )
        self.state[slots] = LOADING

    def commit(self, slots: np.ndarray) -> None:
        """LOADING -> RESIDENT (the bytes landed). Safe to run again after a Ctrl-C cut it
        anywhere (a journal step, store/interrupts.py): every statement but the last only
        sets state, and the last one counts."""
        state = self.state[slots]
        assert np.all((state == LOADING) | (state == RESIDENT)), (
            f"{self.tier}: commit of a slot that is not loading"
        )
        keys = self.owner[slots]
        self.state[slots] = RESIDENT
        self.resident_slot[keys] = slots
        self.policy.on_admit(keys)  # a resident mask: admitting twice is once
        self.admissions += int(np.count_nonzero(state == LOADING))

    def rollback(self, slots: np.ndarray) -> None:
        """LOADING/EVICTING -> FREE: a load that failed or was cancelled gives its slots
        back. Safe to run again after a Ctrl-C cut it (only sets state)."""
        assert np.all(
            (self.state[slots] == LOADING) | (self.state[slots] == EVICTING) | (self.state[slots] == FREE)
        ), f"{self.tier}: rollback of a slot that is not loading"
        owners = self.owner[slots]
        owners = owners[owners >= 0]
        self.slot_of[owners] = -1
        self.owner[slots] = -1
        self.state[slots] = FREE

    def evict(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """RESIDENT, unpinned ``keys`` -> EVICTING with no owner. Returns (keys, slots) evicted."""
        keys = keys[(self.resident_slot[keys] >= 0) & (self.key_pins[keys] == 0)]
        slots = self.resident_slot[keys].astype(np.int64)
        self._leave_resident(keys)
        self.state[slots] = EVICTING
        self.owner[slots] = -1
        return keys, slots

    def finish_evict(self, slots: np.ndarray) -> None:
        assert np.all((self.state[slots] == EVICTING) & (self.owner[slots] == -1)), (
            f"{self.tier}: finish_evict of a slot that is not being evicted"
        )
        self.state[slots] = FREE

    def _leave_resident(self, keys: np.ndarray) -> None:
        # evict() only (take's victims leave in apply)
        self.resident_slot[keys] = -1
        self.slot_of[keys] = -1
        self.policy.on_evict(keys)
        self.evictions += len(keys)

    # -- checking --------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Raise AssertionError when state, owners, key maps, pins and policy disagree."""
        st, own = self.state, self.owner
        assert np.all((st >= FREE) & (st <= EVICTING)), f"{self.tier}: unknown slot state"
        assert np.all(own[st == FREE] == -1), f"{self.tier}: a FREE slot has an owner"
        held = np.flatnonzero(own >= 0)
        assert len(np.unique(own[held])) == len(held), f"{self.tier}: a key owns two slots"
        assert np.array_equal(self.slot_of[own[held]], held), f"{self.tier}: slot_of disagrees with owner"
        assert int(np.count_nonzero(self.slot_of >= 0)) == len(held), (
            f"{self.tier}: slot_of names a slot the key does not own"
        )
        res_slots = np.flatnonzero(st == RESIDENT)
        assert np.all(own[res_slots] >= 0), f"{self.tier}: a RESIDENT slot has no owner"
        expect = np.full(self.n_keys, -1, dtype=np.int32)
        expect[own[res_slots]] = res_slots
        assert np.array_equal(expect, self.resident_slot), f"{self.tier}: resident map disagrees with states"
        assert np.all(self.key_pins >= 0), f"{self.tier}: negative pin count"
        pol = np.sort(np.asarray(self.policy.resident(), dtype=np.int64))
        assert np.array_equal(pol, np.sort(own[res_slots])), (
            f"{self.tier}: policy resident set differs from the RESIDENT slots"
        )


def _counted_evictions(tier, n): tier.evictions += n; return True  # noqa: E702 - one statement: interrupts.py  # fmt: skip
