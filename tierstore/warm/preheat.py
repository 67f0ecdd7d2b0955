"""Preheat: make a fresh store look like the run that wrote the warm file.

Order: the RAM arena first (its rows then feed the pool copies at H2D speed
instead of disk speed), then up to ``pool_fill`` of the GPU pool, hottest
first, in batches through the store (``load_arena`` / ``promote``), two pool
batches in flight so reads of one overlap the copies of the other. Runs before
the caller captures CUDA graphs; it is not a hot path, but it never holds the
forward lock across I/O (the store's own calls do the locking).
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import warnings
from collections.abc import Callable

import msgspec
import numpy as np

from tierstore import settings
from tierstore.warm.formats import WarmFile, WarmTier
from tierstore.warm.validate import WarmStartWarning, describe_skipped, load_hint

BATCH_ROWS = 64  # one fire's worth (VLLM_MOE_W2_GATE_MAX_PROMOTE)


class PreheatSummary(msgspec.Struct):
    """What a preheat did. ``cold`` is True when the file was not used at all."""

    source: str
    kind: str = ""
    cold: bool = True
    reason: str = ""
    pool_rows: int = 0
    arena_rows: int = 0
    pool_bytes: int = 0
    arena_bytes: int = 0
    seconds: float = 0.0
    pool_gbps: float = 0.0
    skipped: dict[str, int] = {}


ProgressArg = bool | Callable[[int, int], None] | None


class _Progress:
    """rich bar on a terminal, a caller's callback, or nothing."""

    def __init__(self, progress: ProgressArg, total: int):
        self.callback, self.bar, self.task, self.done = None, None, None, 0
        self.total = total
        if callable(progress) and not isinstance(progress, bool):
            self.callback = progress
        elif progress or (progress is None and sys.stderr.isatty()):
            from rich.progress import Progress

            self.bar = Progress(transient=True)
            self.task = self.bar.add_task("tierstore preheat", total=total)
            self.bar.start()

    def advance(self, n: int) -> None:
        self.done += n
        if self.callback is not None:
            self.callback(self.done, self.total)
        if self.bar is not None:
            self.bar.update(self.task, advance=n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _batches(keys: np.ndarray, n: int = BATCH_ROWS):
    for i in range(0, len(keys), n):
        yield keys[i : i + n]


def _resident_count(store, tier: str, keys: np.ndarray) -> int:
    if not len(keys):
        return 0
    res = np.asarray(store.resident_keys(tier), dtype=np.int64).reshape(-1, 2)
    E = store.pack.n_experts
    return int(np.isin(keys[:, 0] * E + keys[:, 1], res[:, 0] * E + res[:, 1]).sum())


def _arena_capacity(store) -> int:
    policy = getattr(store, "arena_policy", None)
    return int(getattr(policy, "capacity", 0) or 0) if policy is not None else 0


def _arena_plan(pool_keys, pool_heat, arena: WarmTier, n_experts: int):
    """Pool rows first, then the recorded arena rows not among them."""
    keys = np.concatenate([pool_keys, arena.keys])
    heat = np.concatenate([pool_heat, arena.heat])
    _, first = np.unique(keys[:, 0] * n_experts + keys[:, 1], return_index=True)
    first.sort()
    return keys[first], heat[first]


def seed_weights(heat: np.ndarray) -> np.ndarray:
    """Access weights that seed a fresh policy from a file's heat: the file's
    order, scaled so the hottest row counts as one access.

    Why scaled: without a seed a preheated row has no history and is the first
    victim of the first misses (the warm start is undone within a few steps);
    with the raw heat of a long run, rows that were hot an hour ago outlive
    the new workload's (stale heat). One access at most keeps the order for the
    first evictions and lets real accesses win at once (bench/results/warm.md).
    """
    heat = np.asarray(heat, dtype=np.float64)
    top = float(heat.max()) if heat.size else 0.0
    return heat / top if top > 0 else np.zeros_like(heat)


def _seed_heat(store, policy_name: str, keys: np.ndarray, heat: np.ndarray) -> None:
    """Seed the tier policy with ``seed_weights(heat)`` for the rows just loaded."""
    policy = getattr(store, policy_name, None)
    if policy is None or not len(keys):
        return
    lock = getattr(store, "lock", None)
    with lock if lock is not None else contextlib.nullcontext():
        policy.on_access(keys[:, 0] * store.pack.n_experts + keys[:, 1], weights=seed_weights(heat))


def preheat(
    store, src, pool_fill: float = 0.9, progress: ProgressArg = None, seed_heat: bool = True
) -> PreheatSummary:
    """Fill ``store``'s arena and up to ``pool_fill`` of its pool from ``src``
    (a poolmon, pool-heat-v1 or arena heat path, or a WarmFile), hottest first.

    A missing, corrupt, mismatched or otherwise unusable file gives one
    WarmStartWarning naming it and a cold start (``summary.cold``); a read
    error part-way stops the preheat with a warning, keeping what is resident.
    With ``seed_heat`` the tier policies get the file's heat for the rows
    loaded (see ``_seed_heat``). Raises ConfigError only for a bad ``pool_fill``.
    """
    pool_fill = settings.argument("pool_fill", pool_fill, settings.fraction)
    path = src.path if isinstance(src, WarmFile) else os.fspath(src)
    summary = PreheatSummary(source=path)
    t0 = time.perf_counter()
    wf = load_hint(src, store.pack, stacklevel=3)
    if wf is None:
        summary.reason = "warm-start file unusable (see warning)"
        return summary
    summary.kind, summary.cold, summary.skipped = wf.kind, False, dict(wf.skipped)

    # 1. choose rows: the pool's share of its owners; the arena gets those first
    #    (a pool read lands in an arena row anyway, so listing them first keeps
    #    the pool promotions from evicting preheated arena rows), then the
    #    recorded arena owners, up to the arena's capacity.
    n_pool = min(len(wf.pool), int(math.floor(float(pool_fill) * int(store.n_slots) + 1e-9)))
    pool_keys, pool_heat = wf.pool.keys[:n_pool], wf.pool.heat[:n_pool]
    if len(wf.pool) > n_pool:
        summary.skipped["pool: beyond pool_fill"] = len(wf.pool) - n_pool
    arena_cap = _arena_capacity(store)
    arena_keys, arena_heat = _arena_plan(pool_keys, pool_heat, wf.arena, store.pack.n_experts)
    if arena_cap and len(arena_keys) > arena_cap:
        summary.skipped["arena: beyond arena capacity"] = len(arena_keys) - arena_cap
    arena_keys, arena_heat = arena_keys[:arena_cap], arena_heat[:arena_cap]

    bar = _Progress(progress, len(arena_keys) + len(pool_keys))
    slot_bytes = int(store.pack.slot_bytes)
    t_pool = t0
    try:
        # 2. arena rows (host memory only).
        for batch in _batches(arena_keys):
            store.load_arena(batch)
            bar.advance(len(batch))
        # 3. pool rows, two tickets in flight.
        t_pool = time.perf_counter()
        pending = None
        for batch in _batches(pool_keys):
            ticket = store.promote(batch)
            if pending is not None:
                pending[0].wait()
                bar.advance(pending[1])
            pending = (ticket, len(batch))
        if pending is not None:
            pending[0].wait()
            bar.advance(pending[1])
        if seed_heat:
            _seed_heat(store, "arena_policy", arena_keys, arena_heat)
            _seed_heat(store, "pool_policy", pool_keys, pool_heat)
    except Exception as exc:  # noqa: BLE001 - a warm start is a hint, keep serving
        summary.reason = f"stopped early: {exc}"
        warnings.warn(
            f"{path}: preheat stopped early: {exc}; keeping what is resident", WarmStartWarning, stacklevel=2
        )
    finally:
        bar.close()
    t1 = time.perf_counter()
    summary.seconds = t1 - t0
    summary.arena_rows = _resident_count(store, "arena", arena_keys) if arena_cap else 0
    summary.pool_rows = _resident_count(store, "pool", pool_keys)
    summary.arena_bytes = summary.arena_rows * slot_bytes
    summary.pool_bytes = summary.pool_rows * slot_bytes
    if t1 > t_pool and summary.pool_rows:
        summary.pool_gbps = summary.pool_bytes / (t1 - t_pool) / 1e9
    if summary.skipped and not summary.reason:
        summary.reason = "skipped " + describe_skipped(summary.skipped)
    return summary
