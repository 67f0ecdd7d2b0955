"""Snapshots of a live store's heat, written off the hot path.

``snapshot(store)`` copies the resident keys and their policy scores while
holding the store's lock only for those two array copies; encoding and the
atomic write happen after it is released, so the forward path never waits on
JSON or the disk. ``PeriodicSnapshot`` does that from a daemon thread every N
seconds and/or N store steps; ``async_snapshot_loop`` / ``save_poolmon_async``
do it from an event loop through aiofiles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time

import numpy as np

from tierstore.errors import ConfigError
from tierstore.files.atomic import write_atomic, write_atomic_async
from tierstore.warm.formats import (
    PackIdentity,
    PoolmonCounters,
    TierCounters,
    WarmFile,
    WarmTier,
    encode,
    to_arena_heat,
    to_pool_heat,
    to_poolmon,
)

log = logging.getLogger("tierstore.warmstart")

_COUNTER_NAMES = ("hits", "misses", "promotions", "evictions")


class FailureLog:
    """How a periodic writer reports failures: ONE warning for the first failure of a run
    of failures (a full disk fails every 10 s for hours: one line, not thousands), the
    rest counted (``failures``, total); the first success after a run says so once, at
    info, with the run's length. Used by every periodic snapshot writer (the store's
    ``snapshot=`` option, PeriodicSnapshot, async_snapshot_loop)."""

    def __init__(self, logger: logging.Logger, what: str = "warm-start snapshot"):
        self.logger, self.what = logger, what
        self.failures = 0  # every failure so far
        self._run = 0  # failures since the last success

    def failed(self, path, exc: BaseException) -> None:
        self.failures += 1
        self._run += 1
        if self._run == 1:
            self.logger.warning(
                "%s: %s failed: %s (further failures are counted, not logged, until one succeeds)",
                os.fspath(path),
                self.what,
                exc,
            )

    def succeeded(self, path) -> None:
        if self._run:
            self.logger.info(
                "%s: %s written again after %d failed attempt(s)", os.fspath(path), self.what, self._run
            )
            self._run = 0


def _store_lock(store):
    # The store documents ``store.lock`` (an RLock the forward path also takes);
    # without one, the copies below are still each consistent on their own.
    lock = getattr(store, "lock", None)
    return lock if lock is not None else contextlib.nullcontext()


def _tier_counters(stats, tier: str) -> TierCounters:
    """Counters of one tier from StoreStats, accepting ``stats.pool.hits``,
    ``stats.pool_hits`` or dict forms, so the snapshot does not break when the
    stats struct grows."""
    if stats is None:
        return TierCounters()
    sub = stats.get(tier) if isinstance(stats, dict) else getattr(stats, tier, None)
    values = {}
    for name in _COUNTER_NAMES:
        v = None
        if sub is not None:
            v = sub.get(name) if isinstance(sub, dict) else getattr(sub, name, None)
        if v is None:
            flat = f"{tier}_{name}"
            v = stats.get(flat) if isinstance(stats, dict) else getattr(stats, flat, None)
        values[name] = int(v) if isinstance(v, (int, np.integer)) else 0
    return TierCounters(**values)


def _tier_snapshot(store, tier: str, policy, capacity: int) -> WarmTier:
    try:
        keys = np.asarray(store.resident_keys(tier), dtype=np.int64).reshape(-1, 2)
    except (KeyError, ValueError, AttributeError):
        return WarmTier.empty(capacity)
    if policy is not None and len(keys):
        scores = np.asarray(policy.scores(), dtype=np.float64)
        heat = scores[keys[:, 0] * store.pack.n_experts + keys[:, 1]]
    else:
        heat = np.zeros(len(keys), np.float64)
    heat = np.where(np.isfinite(heat) & (heat > 0), heat, 0.0)
    order = np.argsort(-heat, kind="stable")  # resident_keys is hottest first; keep ties
    return WarmTier(keys[order], heat[order], capacity)


def snapshot(store) -> WarmFile:
    """The store's current heat as a WarmFile (kind "poolmon"). Holds the
    store's lock only while copying resident keys and scores."""
    arena_policy = getattr(store, "arena_policy", None)
    arena_cap = int(getattr(arena_policy, "capacity", 0) or 0)
    with _store_lock(store):
        # stats() first: it folds routing recorded since the last step into the
        # policies, so the scores below include it.
        stats = store.stats()
        pool = _tier_snapshot(store, "pool", getattr(store, "pool_policy", None), int(store.n_slots))
        arena = (
            _tier_snapshot(store, "arena", arena_policy, arena_cap)
            if arena_policy is not None and arena_cap > 0
            else WarmTier.empty(arena_cap)
        )
        steps = int(getattr(store, "step_count", 0))
    counters = PoolmonCounters(pool=_tier_counters(stats, "pool"), arena=_tier_counters(stats, "arena"))
    policy = getattr(getattr(store, "pool_policy", None), "name", "")
    return WarmFile(
        path="<store>",
        kind="poolmon",
        identity=PackIdentity.of_pack(store.pack),
        pool=pool,
        arena=arena,
        counters=counters,
        wall_time=time.time(),
        steps=steps,
        policy=str(policy),
    )


def save_poolmon(store, path) -> WarmFile:
    """Write the store's heat as a tierstore poolmon, atomically. Returns the snapshot."""
    snap = snapshot(store)
    write_atomic(path, encode(to_poolmon(snap)))
    return snap


def save_pool_heat(store, path) -> WarmFile:
    """Write pool-heat-v1 (vLLM-Moet) from the store's pool, atomically."""
    snap = snapshot(store)
    write_atomic(path, encode(to_pool_heat(snap)))
    return snap


def save_arena_heat(store, path) -> WarmFile:
    """Write ``<pack>.heat.json`` (vLLM-Moet arena heat) from the store's arena
    (its pool when it has no arena), atomically."""
    snap = snapshot(store)
    write_atomic(path, encode(to_arena_heat(snap)))
    return snap


_ENCODERS = {"poolmon": to_poolmon, "pool-heat": to_pool_heat, "arena-heat": to_arena_heat}


async def save_poolmon_async(store, path, fmt: str = "poolmon") -> WarmFile:
    """``save_poolmon`` for an event loop: the brief snapshot runs inline, the atomic
    write (temp, fsync, os.replace) in aiofiles' executor, so it does not block the loop."""
    snap = snapshot(store)
    await write_atomic_async(path, encode(_ENCODERS[fmt](snap)))
    return snap


async def async_snapshot_loop(store, path, every_s: float = 10.0, fmt: str = "poolmon") -> None:
    """Snapshot every ``every_s`` seconds until cancelled; a failed write is retried at
    the next tick (a warm file is never worth a crash): the first failure of a run is
    logged, the rest counted (FailureLog)."""
    failures = FailureLog(log)
    while True:
        await asyncio.sleep(every_s)
        try:
            await save_poolmon_async(store, path, fmt)
        except Exception as exc:  # noqa: BLE001 - logged, the server goes on
            failures.failed(path, exc)
        else:
            failures.succeeded(path)


class PeriodicSnapshot:
    """Daemon thread writing a snapshot every ``every_s`` seconds and/or every
    ``every_steps`` store steps (whichever comes first; None disables one).

    Thread safety: start/stop/snapshot_now from any thread. Writes never run
    under the store's lock. A failed write is logged once per run of failures and
    counted (``failures``); the writer carries on. ``stop(final=True)`` writes one
    last snapshot.
    """

    def __init__(
        self,
        store,
        path,
        every_s: float | None = 10.0,
        every_steps: int | None = None,
        fmt: str = "poolmon",
        poll_s: float = 0.05,
    ):
        if every_s is None and every_steps is None:
            raise ConfigError(f"{os.fspath(path)}: PeriodicSnapshot needs every_s or every_steps")
        if fmt not in _ENCODERS:
            raise ConfigError(f"{os.fspath(path)}: fmt {fmt!r}, expected one of {sorted(_ENCODERS)}")
        self.store, self.path, self.fmt = store, os.fspath(path), fmt
        self.every_s, self.every_steps, self.poll_s = every_s, every_steps, poll_s
        self.writes = 0
        self._failures = FailureLog(log)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._write_lock = threading.Lock()

    @property
    def failures(self) -> int:
        """Failed writes so far (the first of each run of them was logged)."""
        return self._failures.failures

    def snapshot_now(self) -> bool:
        """Write one snapshot now; True when it was written."""
        with self._write_lock:
            try:
                write_atomic(self.path, encode(_ENCODERS[self.fmt](snapshot(self.store))))
            except Exception as exc:  # noqa: BLE001 - a hint file never kills the server
                self._failures.failed(self.path, exc)
                return False
            self._failures.succeeded(self.path)
            self.writes += 1
            return True

    def _run(self) -> None:
        last_t = time.monotonic()
        last_step = int(getattr(self.store, "step_count", 0))
        wait = self.poll_s if self.every_steps is not None else self.every_s
        if self.every_s is not None:
            wait = min(wait, self.every_s)
        while not self._stop.wait(wait):
            now, step = time.monotonic(), int(getattr(self.store, "step_count", 0))
            due_t = self.every_s is not None and now - last_t >= self.every_s
            due_s = self.every_steps is not None and step - last_step >= self.every_steps
            if due_t or due_s:
                self.snapshot_now()
                last_t, last_step = now, step

    def start(self) -> PeriodicSnapshot:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tierstore-snapshot", daemon=True)
            self._thread.start()
        return self

    def stop(self, final: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if final:
            self.snapshot_now()

    def __enter__(self) -> PeriodicSnapshot:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
