"""Warm start: save a store's heat, read it back (or vLLM-Moet's), preheat a store.

A restarted server should begin where the last one stopped: the hot experts
already in the GPU pool and the RAM arena before the first request. The store
delegates here: ``store.save_poolmon(path)`` -> ``save_poolmon(store, path)``,
``store.preheat(src)`` / ``ExpertStore(..., warm_start=src)`` ->
``preheat(store, src, pool_fill=0.9)``.

Formats (full spec with examples: docs/WARMSTART.md; enforced in warm/formats.py)
---------------------------------------------------------------------------------
All three are one-line UTF-8 JSON, written atomically (temp file in the same
directory, fsync, rename, fsync of the directory), at most 64 MiB.

tierstore poolmon (``tierstore-poolmon-v1``; unknown keys are rejected)::

    {"version": "tierstore-poolmon-v1",
     "pack": {"tag", "n_layers", "n_experts", "slot_bytes",
              "stride", "ckpt_id", "key20"},          # last three may be null
     "tiers": {"pool":  {"capacity": slots, "owners": [[layer, expert, heat], ...]},
               "arena": {"capacity": rows,  "owners": [[layer, expert, heat], ...]}},
     "counters": {"pool":  {"hits", "misses", "promotions", "evictions"},
                  "arena": {"hits", "misses", "promotions", "evictions"}},
     "wall_time": unix seconds, "steps": store steps, "policy": "heat"}

  owners are hottest first; heat is the tier policy's ``scores()`` value
  (decayed access frequency for ``heat``; a merged file holds shares, see
  warm_tools). A pack matches when every identity field present in both agrees.

vLLM-Moet pool heat (``pool-heat.<tag>.rank<r>of<w>[.pp<p>of<q>].json``)::

    {"meta": {"version": "pool-heat-v1", "tag", "n_layers", "E", "slot_bytes"},
     "owners": [[layer, expert], ...]}                 # hottest first, no scores

vLLM-Moet arena heat (``<pack path>.heat.json``)::

    {"version": 1, "keys": [[layer, expert], ...]}      # most recent first

Formats without scores are given rank heat ``(N - i) / N``.

Reading is a hint, every file untrusted: size cap, parse, sniff, version, typed
strict decode, then meaning against the pack (identity/geometry must match;
pairs out of range, in unwritten layers, or repeated are dropped and counted).
Any problem: one ``WarmStartWarning`` naming the file and the reason, and a
cold start; never a crash and never a wrong expert.
"""

from __future__ import annotations

from tierstore.files.atomic import write_atomic, write_atomic_async
from tierstore.warm.formats import (
    ARENA_HEAT_VERSION,
    KINDS,
    MAX_WARM_FILE_BYTES,
    POOL_HEAT_VERSION,
    POOLMON_VERSION,
    ArenaHeat,
    PackIdentity,
    PoolHeat,
    Poolmon,
    WarmFile,
    WarmTier,
    arena_heat_path,
    encode,
    parse_warm_bytes,
    pool_heat_name,
    read_warm_file,
    to_arena_heat,
    to_pool_heat,
    to_poolmon,
)
from tierstore.warm.preheat import PreheatSummary, preheat
from tierstore.warm.snapshot import (
    PeriodicSnapshot,
    async_snapshot_loop,
    save_arena_heat,
    save_pool_heat,
    save_poolmon,
    save_poolmon_async,
    snapshot,
)
from tierstore.warm.tools import merge, summarize
from tierstore.warm.validate import WarmStartWarning, fit_to_pack, load_hint


def write_warm_file(wf: WarmFile, path, fmt: str, identity: PackIdentity | None = None) -> None:
    """Write ``wf`` as ``fmt`` ("poolmon", "pool-heat" or "arena-heat"), atomically."""
    if fmt == "poolmon":
        obj = to_poolmon(wf, identity)
    elif fmt == "pool-heat":
        obj = to_pool_heat(wf, identity)
    elif fmt == "arena-heat":
        obj = to_arena_heat(wf)
    else:
        from tierstore.errors import ConfigError

        raise ConfigError(f"format {fmt!r}: expected one of {', '.join(KINDS)}")
    write_atomic(path, encode(obj))


__all__ = [
    "POOLMON_VERSION",
    "POOL_HEAT_VERSION",
    "ARENA_HEAT_VERSION",
    "KINDS",
    "MAX_WARM_FILE_BYTES",
    "Poolmon",
    "PoolHeat",
    "ArenaHeat",
    "PackIdentity",
    "WarmFile",
    "WarmTier",
    "PreheatSummary",
    "PeriodicSnapshot",
    "WarmStartWarning",
    "read_warm_file",
    "parse_warm_bytes",
    "load_hint",
    "fit_to_pack",
    "write_warm_file",
    "to_poolmon",
    "to_pool_heat",
    "to_arena_heat",
    "encode",
    "write_atomic",
    "write_atomic_async",
    "pool_heat_name",
    "arena_heat_path",
    "snapshot",
    "save_poolmon",
    "save_pool_heat",
    "save_arena_heat",
    "save_poolmon_async",
    "async_snapshot_loop",
    "preheat",
    "merge",
    "summarize",
]
