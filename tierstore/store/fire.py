"""The body of ExpertStore.fire and the choice of step()'s lazy promotions.

A fire pins every routed key first (so nothing it needs can be evicted while it
works), then in rounds:

1. under the lock: split the pinned keys into resident / being loaded by another
   batch (the worker, another fire) / missing; in round 1 rank the missing ones
   by heat and cap them at ``max_promote`` (no admission control); reserve slots.
2. lock released: run its own batch (read, copy, publish on the caller's stream)
   and wait for the other batches it depends on; the caller's stream waits on
   their table-write events.
3. a key whose other batch failed is retried by the next round (at most
   ``fire_rounds``); whatever still is not resident is unpinned and reported.

A read error of its own batch unpins everything and raises (the batch rolled
itself back). Rounds are not steps: ``step_count`` only moves in ``step()``.
"""

from __future__ import annotations

import errno
import logging
import time
import weakref

import numpy as np

from tierstore.errors import ConfigError, TierIOError
from tierstore.policies.admission import ADMIT_ALL, HotterThanVictim
from tierstore.policies.fill import plan_lazy
from tierstore.store.interrupts import drop_pins, release_pins, take_pins
from tierstore.store.stats import FireResult

_EMPTY = np.empty(0, dtype=np.int64)
log = logging.getLogger("tierstore.store")


def quarantine(store, exc: BaseException) -> bool:
    """With the ``quarantine`` option (the engines' faces set it), a row that failed its
    checksum (EBADMSG: the bytes on disk are not what the pack lists) is quarantined: the
    fire or promotion that read it fails naming it, and no later fire or lazy promotion
    loads it again, so an engine serves that expert from its fallback (vLLM-Moet's and the
    tiered face's base row) instead of failing every later load. Counted in
    stats().quarantined, named once in the log. True when ``exc`` named such a row (now
    quarantined)."""
    if not (
        store.config.quarantine
        and isinstance(exc, TierIOError)
        and exc.errno == errno.EBADMSG
        and getattr(exc, "layer", None) is not None
    ):
        return False
    key = int(exc.layer) * store.pack.n_experts + int(exc.expert)
    with store.lock:
        if store._quarantined[key]:
            return True
        store._quarantined[key] = True
        store.counters.quarantined += 1
    log.warning(
        "%s: layer %d expert %d (offset %d) failed its checksum; quarantined: never "
        "loaded again, its engine serves the fallback (rewrite the pack to recover it)",
        store.pack.path,
        exc.layer,
        exc.expert,
        exc.offset,
    )
    return True


def _drop(keys: np.ndarray, gone: np.ndarray) -> np.ndarray:
    return keys[~np.isin(keys, gone)] if len(gone) else keys


def run_fire(
    store, result: FireResult, keys: np.ndarray, cap: int, stream, scan: bool, pipelined: bool = False
) -> FireResult:
    """``pipelined`` (True, or an int: least bytes per engine submission): one round;
    the own batch is submitted layer by layer (or in groups of consecutive layers) and
    fire returns once it is queued (result.wait_layer publishes; store/pipeline.py).
    ``result`` is already adopted (its ``holder`` records every pin as it is taken)."""
    pool, mover, lock = store._pool, store._mover, store.lock
    holder = result.holder
    keys = keys[~store._quarantined[keys]]
    with lock:
        store._fold_records()
        if getattr(pool.policy, "counts_fires", False) and not scan:
            pool.policy.on_access(keys)  # need: a key's heat is the fires that routed it
        take_pins(lock, pool, holder, keys)
        result.already_resident = int(np.count_nonzero(pool.resident_slot[keys] >= 0))
        result.sources["pool"] = result.already_resident
    if result.already_resident == len(keys):  # the common fire: nothing to load or wait for
        return _finish(store, result, stream)
    own = _EMPTY  # keys of a pipelined batch: pinned, still LOADING when fire returns
    batch = None
    try:
        for rnd in range(1 if pipelined else store.config.fire_rounds):
            with lock:
                pinned = holder.keys
                resident = pool.resident_slot[pinned] >= 0
                loading = ~resident & (pool.slot_of[pinned] >= 0)
                missing = pinned[~resident & ~loading]
                if rnd == 0:
                    ranked = pool.policy.rank(missing) if len(missing) else missing
                    new, over = ranked[:cap], ranked[cap:]
                    result.over_cap = len(over)
                else:
                    new, over = missing, _EMPTY
                batch = mover.plan(new, to_pool=True, stream=stream, scan=scan) if len(new) else None
                if batch is not None and pipelined:  # visible to other fires as pipelined
                    mover.layer_load(batch, store._defer_sources, 0 if pipelined is True else int(pipelined))
                    holder.load, holder.stream = weakref.ref(batch.layer_load), stream
                placed = batch.keys if batch is not None else _EMPTY
                unplaced = _drop(new, placed)
                result.no_slot += len(unplaced)
                ids = set(pool.batch_of_slot[pool.slot_of[pinned[loading]]].tolist()) if loading.any() else ()
                others = [mover.inflight[b] for b in ids if b in mover.inflight]
                drop_pins(lock, pool, holder, np.concatenate([over, unplaced]))
            if batch is not None and pipelined:
                # the result holds the load before it is submitted: a Ctrl-C landing after
                # the submit (before start_layers returned) leaves it to the result's
                # release to publish or settle, never in flight with its pins
                result.pending, result.pending_stream, own = batch.layer_load, stream, batch.keys
                mover.start_layers(batch)
            elif batch is not None:
                mover.run(batch, defer_sources=store._defer_sources)
            if batch is not None:
                result.promoted += len(placed)
                result.sources["arena"] += batch.n_arena_hits
                result.sources["read"] += len(placed) - batch.n_arena_hits
            batch = None
            for other in others:
                if other.layer_load is not None:  # pipelined: publish it ourselves
                    other.layer_load.settle(stream)
                else:
                    other.done.wait()
                if other.ok and other.publish_event is not None and stream is not None:
                    stream.wait_event(other.publish_event)
            result.rounds = rnd + 1
            if all(other.ok for other in others):
                break  # another round only for keys whose other batch failed
        with lock:  # another batch failed in every round: give those keys up
            pinned = holder.keys
            left = pinned[(pool.resident_slot[pinned] < 0) & ~np.isin(pinned, own)]
            result.no_slot += len(left)
            drop_pins(lock, pool, holder, left)
    except BaseException:
        _abandon(store, batch)
        raise
    return _finish(store, result, stream)


def _abandon(store, batch) -> None:
    """A fire cut short (a read error, a Ctrl-C) between planning its batch and running
    it: the batch gives its slots back (store/mover.py abandon_planned). The fire's pins
    go with its result (release or the orphan net)."""
    store._mover.abandon_planned(batch)


def counted_fire(store, keys, cap: int, stream, scan: bool, pipelined=False) -> FireResult:
    """run_fire inside the store's activity count, then the fire counters (not for scans).
    The result is adopted before anything is pinned: if a Ctrl-C (or any error) keeps it
    from the caller, its pins and batch come back at the next fire, step or stats call
    (store/interrupts.py), or at once when the fire itself raised."""
    t0 = time.perf_counter()
    result = FireResult(keys=_EMPTY, sources={"pool": 0, "arena": 0, "read": 0})
    result.owner = store._token
    store._orphans.adopt(result)
    store._journal.drain()  # what a Ctrl-C left half written
    store._orphans.drain(store.lock, store._pool)  # what results a Ctrl-C orphaned held
    try:
        with store._activity("fire"):
            run_fire(store, result, keys, cap, stream, scan, pipelined)
    except BaseException as exc:
        _unpin_result(store, result, quiet=True)  # the fire's own error is what is raised
        quarantine(store, exc)  # a rotten row: this fire says so, later ones leave it out
        raise
    result.latency_s = time.perf_counter() - t0
    if not scan:
        with store.lock:
            c = store.counters
            c.fires, c.fire_promoted, c.fire_over_cap = (
                c.fires + 1,
                c.fire_promoted + result.promoted,
                c.fire_over_cap + result.over_cap + result.no_slot,
            )
            c.observe_fire(result.latency_s)
    return result


def release_fire(store, fire_result: FireResult) -> None:
    """store.release: publish a pipelined fire's pending layers, then unpin (always)."""
    if not isinstance(fire_result, FireResult):
        raise ConfigError(
            f"{store.pack.path}: release: expected the FireResult of this "
            f"store's fire() or ensure_resident(), found "
            f"{type(fire_result).__name__}"
        )
    store._journal.drain()
    with store.lock:
        store._check_open("release")
        if fire_result.owner is not store._token:
            raise ConfigError(f"{store.pack.path}: release: this FireResult belongs to another store")
        if fire_result.released:
            raise ConfigError("release: this FireResult was already released")
    _unpin_result(store, fire_result)


def _unpin_result(store, fire_result: FireResult, quiet: bool = False) -> None:
    """Publish what a pipelined result still has in flight, then unpin. ``quiet``: the
    load's own failure (a batch its interrupted fire rolled back) is not raised."""
    try:
        fire_result.wait_all()
    except Exception:
        if not quiet:
            raise
    finally:
        release_pins(store.lock, store._pool, fire_result.holder)
        fire_result.released = True
        store._orphans.disown(fire_result)


def _finish(store, result: FireResult, stream) -> FireResult:
    if stream is not None and stream != store._stream:
        stream.wait_stream(store._stream)  # keys published earlier on the store's stream
    result.keys = result.holder.keys
    result.waited = len(result.keys) - result.already_resident - result.promoted
    return result


def lazy_candidates(store, seen: np.ndarray) -> tuple[np.ndarray, int]:
    """Keys step() should promote in the background: seen this step, not in the pool,
    in a written layer; hottest first, at most ``lazy_per_step``. When the pool is
    full a candidate must be hotter than the victim it would displace and pass the
    policy's admission filter. Returns (keys, rejected). Caller holds the lock."""
    pool = store._pool
    if not len(seen):
        return _EMPTY, 0
    cand = seen[(pool.slot_of[seen] < 0) & store._written[seen] & ~store._quarantined[seen]]
    if not len(cand):
        return _EMPTY, 0
    admission = (
        ADMIT_ALL
        if store.config.lazy_admission == "all"  # an engine's rule
        else HotterThanVictim(pool.policy)
    )
    fill = plan_lazy(pool.policy, cand, store.config.lazy_per_step, pool.n_free, pool.key_pins > 0, admission)
    return fill.keys, fill.rejected
