"""Warm-start file formats: tierstore poolmon, vLLM-Moet pool-heat-v1 and arena heat.

The spec is in ``tierstore.warm``'s docstring and docs/WARMSTART.md; this
module enforces it. Every file is read as untrusted, in this order: size cap,
JSON parse, sniff which format, version, typed strict decode (msgspec), then
per-file meaning (non-negative pairs, finite heat). Matching against a pack
(identity, geometry, range, duplicates) is ``tierstore.warm.validate``'s job.

Every format is read into one in-memory shape, ``WarmFile``: per tier the
owners hottest first as an int64 ``[N, 2]`` array plus float64 heat. Formats
without scores (pool-heat, arena heat) get rank-based heat ``(N - i) / N`` and
``ranked=True``.

Memory follows what a file describes, not its size: the owner lists (the only part
that grows) are cut out of the text and decoded run by run straight into those arrays
(24 bytes an entry, never a Python object per entry), after their length is checked
against the keys of the pack the file names (a tier names each key at most once); the
rest of the file is held to a few thousand JSON items before it is parsed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import msgspec
import numpy as np

from tierstore.errors import FormatError
from tierstore.files.untrusted import (
    DEFAULT_MAX_STRING,
    JsonBudget,
    json_array_runs,
    json_census,
    loads_strict,
    read_capped,
)
from tierstore.format.sidecar import MAX_KEYS

MAX_WARM_FILE_BYTES = 64 << 20  # a DS4 poolmon is ~0.5 MB; anything near this is hostile
MAX_WARM_DEPTH = 16  # a valid warm file nests 4 levels (tiers.pool.owners[i])
# Everything but the owner lists: a valid file holds a few dozen JSON items (a foreign
# pool-heat file may carry a few more keys).
WARM_SKELETON = JsonBudget(4096, 256, "all a warm-start file holds besides its owner lists")
WARM_SKELETON_BYTES = 1 << 20  # ... and in bytes (a valid one: a few hundred)
_SMALL = 1 << 20  # a file this small is parsed whole when it is not valid JSON,
# so the error is json's own (line, column, "truncated")
_RUN = 1 << 16  # owner entries decoded per step

POOLMON_VERSION = "tierstore-poolmon-v1"
POOL_HEAT_VERSION = "pool-heat-v1"
ARENA_HEAT_VERSION = 1
KINDS = ("poolmon", "pool-heat", "arena-heat")


# ---------------------------------------------------------------- structs
class PackIdentity(msgspec.Struct, forbid_unknown_fields=True):
    """What a warm file must agree on with the pack it warms. ``stride``,
    ``ckpt_id`` and ``key20`` are None when the source did not carry them
    (a pool-heat file, or a poolmon merged from pool-heat files)."""

    tag: str
    n_layers: int
    n_experts: int
    slot_bytes: int
    stride: int | None = None
    ckpt_id: str | None = None
    key20: str | None = None

    @classmethod
    def of_pack(cls, pack) -> PackIdentity:
        def opt(name, kind):
            value = getattr(pack, name, None)
            return None if value is None else kind(value)

        return cls(
            tag=str(pack.tag),
            n_layers=int(pack.n_layers),
            n_experts=int(pack.n_experts),
            slot_bytes=int(pack.slot_bytes),
            stride=opt("stride", int),
            ckpt_id=opt("ckpt_id", str),
            key20=opt("key20", str),
        )


class TierOwners(msgspec.Struct, forbid_unknown_fields=True):
    capacity: int
    owners: list[tuple[int, int, float]]  # [layer, expert, heat], hottest first


class PoolmonTiers(msgspec.Struct, forbid_unknown_fields=True):
    pool: TierOwners
    arena: TierOwners = msgspec.field(default_factory=lambda: TierOwners(0, []))


class TierCounters(msgspec.Struct, forbid_unknown_fields=True):
    hits: int = 0
    misses: int = 0
    promotions: int = 0
    evictions: int = 0


class PoolmonCounters(msgspec.Struct, forbid_unknown_fields=True):
    pool: TierCounters = msgspec.field(default_factory=TierCounters)
    arena: TierCounters = msgspec.field(default_factory=TierCounters)


class Poolmon(msgspec.Struct, forbid_unknown_fields=True):
    version: str
    pack: PackIdentity
    tiers: PoolmonTiers
    counters: PoolmonCounters = msgspec.field(default_factory=PoolmonCounters)
    wall_time: float = 0.0  # unix seconds when the snapshot was taken
    steps: int = 0  # store.step_count at the snapshot
    policy: str = ""  # pool policy name, informational


class PoolHeatMeta(msgspec.Struct):  # foreign format: extra keys are tolerated
    version: str
    tag: str
    n_layers: int
    E: int
    slot_bytes: int


class PoolHeat(msgspec.Struct):
    meta: PoolHeatMeta
    owners: list[tuple[int, int]]


class ArenaHeat(msgspec.Struct):
    version: int
    keys: list[tuple[int, int]]


# ---------------------------------------------------------------- in memory
@dataclass
class WarmTier:
    keys: np.ndarray  # int64 [N, 2] (layer, expert), hottest first
    heat: np.ndarray  # float64 [N], non-increasing
    capacity: int | None = None  # slots of the tier when it was recorded
    ranked: bool = False  # heat derived from rank, not measured

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    @classmethod
    def empty(cls, capacity: int | None = None) -> WarmTier:
        return cls(np.zeros((0, 2), np.int64), np.zeros(0, np.float64), capacity)


@dataclass
class WarmFile:
    path: str
    kind: str  # one of KINDS
    identity: PackIdentity | None  # None for arena heat
    pool: WarmTier
    arena: WarmTier
    counters: PoolmonCounters = field(default_factory=PoolmonCounters)
    wall_time: float = 0.0
    steps: int | None = None
    policy: str = ""
    skipped: dict = field(default_factory=dict)  # reason -> entries dropped


def rank_heat(n: int) -> np.ndarray:
    """Scores for a hottest-first list without scores: 1, (n-1)/n, ..., 1/n."""
    return (n - np.arange(n, dtype=np.float64)) / max(n, 1)


MAX_WALL_TIME = 1e11  # seconds since 1970 (year 5138): later is not a time, it is hostile


def _check_wall_time(t, path: str) -> None:
    if t is not None and not (np.isfinite(t) and 0 <= t <= MAX_WALL_TIME):
        raise FormatError(
            f"{path}: wall_time {t!r} is not a time (expected seconds since 1970, 0 .. {MAX_WALL_TIME:.0e})"
        )


def _check_geometry(ident: PackIdentity, path: str, where: str) -> None:
    """The identity's geometry within a pack's caps, before any table is sized by it
    (``warm inspect`` builds per-layer counts: n_layers 2^70 or -1 must not get there)."""
    from tierstore.format.sidecar import MAX_EXPERTS, MAX_LAYERS, MAX_SLOT_BYTES

    for name, value, cap in (
        ("n_layers", ident.n_layers, MAX_LAYERS),
        ("n_experts", ident.n_experts, MAX_EXPERTS),
        ("slot_bytes", ident.slot_bytes, MAX_SLOT_BYTES),
        ("stride", ident.stride, MAX_SLOT_BYTES + 4096),
    ):
        if value is not None and not 1 <= value <= cap:
            raise FormatError(f"{path}: {where}.{name} {value} is outside [1, {cap}]")


def _pairs(rows, path: str, where: str) -> np.ndarray:
    if isinstance(rows, np.ndarray):
        keys = rows
    else:
        try:
            keys = np.asarray(rows, dtype=np.int64).reshape(-1, 2) if rows else np.zeros((0, 2), np.int64)
        except OverflowError:
            raise FormatError(
                f"{path}: {where}: a layer or expert number is out of the int64 range"
            ) from None
    bad = np.flatnonzero((keys < 0).any(axis=1))
    if bad.size:
        i = int(bad[0])
        raise FormatError(
            f"{path}: {where}[{i}] = [{keys[i, 0]}, {keys[i, 1]}]: "
            f"layer and expert must be >= 0 ({bad.size} such entries)"
        )
    return keys


def _tier_from_owners(t: TierOwners, path: str, where: str, bulk=None) -> WarmTier:
    """``bulk``: (keys, heat) arrays decoded from the cut-out owner list, if it was cut."""
    if bulk is not None:
        keys, heat = _pairs(bulk[0], path, where), bulk[1]
    else:
        keys = _pairs([o[:2] for o in t.owners], path, where)
        heat = np.asarray([o[2] for o in t.owners], dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(heat) | (heat < 0))
    if bad.size:
        raise FormatError(
            f"{path}: {where}[{int(bad[0])}]: heat {float(heat[bad[0]])!r} is not a "
            f"finite non-negative number"
        )
    if t.capacity < 0:
        raise FormatError(f"{path}: {where}: capacity {t.capacity} is negative")
    order = np.argsort(-heat, kind="stable")  # writers sort, but a hint may not be
    return WarmTier(keys[order], heat[order], t.capacity, ranked=False)


def _ranked_tier(rows, path: str, where: str) -> WarmTier:
    keys = _pairs(rows, path, where)
    return WarmTier(keys, rank_heat(len(keys)), None, ranked=True)


# ---------------------------------------------------------------- bulk owner lists
class _Tier(msgspec.Struct):  # locating only: every other field skipped unparsed
    owners: msgspec.Raw = msgspec.Raw()


class _Tiers(msgspec.Struct):
    pool: msgspec.Raw = msgspec.Raw()
    arena: msgspec.Raw = msgspec.Raw()


class _Top(msgspec.Struct):
    tiers: msgspec.Raw = msgspec.Raw()
    owners: msgspec.Raw = msgspec.Raw()
    keys: msgspec.Raw = msgspec.Raw()


_ROW_DECODERS = {
    2: msgspec.json.Decoder(list[tuple[int, int]]),
    3: msgspec.json.Decoder(list[tuple[int, int, float]]),
}
_ROW_DTYPES = {
    2: np.dtype([("l", "<i8"), ("e", "<i8")]),
    3: np.dtype([("l", "<i8"), ("e", "<i8"), ("h", "<f8")]),
}


def _locate_owner_lists(data: bytes) -> dict[str, tuple[int, int]]:
    """Byte ranges of the owner lists (``tiers.pool.owners``, ``tiers.arena.owners``,
    ``owners``, ``keys``) that are JSON arrays, found by a typed msgspec pass that skips
    everything else unparsed. Raises msgspec.DecodeError when the text is not valid
    JSON; {} when it is not an object of that shape (the strict parse then says why)."""
    base = np.frombuffer(data, np.uint8).ctypes.data if data else 0
    found = {}

    def add(where: str, raw) -> None:
        if len(raw) and bytes(memoryview(raw)[:1]) == b"[":
            off = np.frombuffer(raw, np.uint8).ctypes.data - base  # a view into data
            if 0 <= off and off + len(raw) <= len(data):
                found[where] = (off, off + len(raw))

    def sub(raw, kind):
        return msgspec.json.decode(raw, type=kind) if bytes(memoryview(raw)[:1]) == b"{" else None

    try:
        top = msgspec.json.decode(data, type=_Top)
        add("owners", top.owners)
        add("keys", top.keys)
        tiers = sub(top.tiers, _Tiers) if len(top.tiers) else None
        for name in ("pool", "arena"):
            raw = getattr(tiers, name) if tiers is not None else msgspec.Raw()
            tier = sub(raw, _Tier) if len(raw) else None
            if tier is not None:
                add(f"tiers.{name}.owners", tier.owners)
    except msgspec.ValidationError:
        pass
    return found


def _cut(data: bytes, spans: dict[str, tuple[int, int]]) -> bytes:
    """``data`` with every span replaced by ``[]``: what remains is a few fields."""
    out, at = [], 0
    for a, b in sorted(spans.values()):
        out += [data[at:a], b"[]"]
        at = b
    out.append(data[at:])
    return b"".join(out)


def _owner_arrays(data: bytes, span: tuple[int, int], arity: int, ident, path: str, kind: str, where: str):
    """(keys int64 [N, 2], heat float64 [N] or None) of the owner list at ``span``,
    decoded run by run (bounded scratch) after its length N is checked against the keys
    of the pack ``ident`` (``_check_listed``). Type errors name the entry as a
    whole-file decode would (``$.tiers.pool.owners[123][0]``)."""
    view = memoryview(data)[span[0] : span[1]]
    n, runs = json_array_runs(view, _RUN)
    _check_listed(n, ident, path, where)
    keys = np.empty((n, 2), np.int64)
    heat = np.empty(n, np.float64) if arity == 3 else None
    done = 0
    for a, b in runs:
        try:
            rows = _ROW_DECODERS[arity].decode(b"[" + bytes(view[a:b]) + b"]")
        except msgspec.ValidationError as exc:
            text = re.sub(r"`\$\[(\d+)\]", lambda m: f"`$.{where}[{done + int(m[1])}]", str(exc))
            raise FormatError(f"{path}: {kind}: {text}") from None
        try:
            arr = np.array(rows, dtype=_ROW_DTYPES[arity])
        except OverflowError:
            raise FormatError(
                f"{path}: {where}: a layer or expert number is out of the int64 range"
            ) from None
        keys[done : done + len(arr), 0] = arr["l"]
        keys[done : done + len(arr), 1] = arr["e"]
        if heat is not None:
            heat[done : done + len(arr)] = arr["h"]
        done += len(arr)
    return keys[:done], None if heat is None else heat[:done]


def _parse_skeleton(data: bytes, path: str):
    """(the file's JSON with its owner lists as ``[]``, their spans): nesting and string
    lengths of the whole text first (one linear scan), then the strict parse of all but
    the owner lists, held to WARM_SKELETON items."""
    what = "warm-start file"
    deepest, longest, _, _ = json_census(data, MAX_WARM_DEPTH, DEFAULT_MAX_STRING)
    if deepest > MAX_WARM_DEPTH or longest > DEFAULT_MAX_STRING:
        return loads_strict(data, path, what, MAX_WARM_DEPTH), {}  # raises, naming which
    try:
        spans = _locate_owner_lists(data)
    except msgspec.DecodeError as exc:
        if len(data) <= _SMALL:  # json's own words: line, column, "truncated"
            return loads_strict(data, path, what, MAX_WARM_DEPTH), {}
        raise FormatError(f"{path}: {what} is not valid JSON: {exc}") from None
    rest = len(data) - sum(b - a for a, b in spans.values())
    if rest > WARM_SKELETON_BYTES:  # refused before a copy of it is made
        raise FormatError(
            f"{path}: {what} holds {rest:,} bytes besides its owner lists, "
            f"more than the {WARM_SKELETON_BYTES:,} any valid one needs"
        )
    skeleton = _cut(data, spans) if spans else data
    return loads_strict(skeleton, path, what, MAX_WARM_DEPTH, budget=WARM_SKELETON), spans


def sniff_kind(obj) -> str | None:
    """Which warm format a parsed JSON value is, or None."""
    # Decided by the most specific key present, so a file missing another
    # required key still gets that format's precise error message.
    if not isinstance(obj, dict):
        return None
    version = obj.get("version")
    if "tiers" in obj or (isinstance(version, str) and version.startswith("tierstore-poolmon")):
        return "poolmon"
    if "meta" in obj:
        return "pool-heat"
    if "keys" in obj:
        return "arena-heat"
    return None


def parse_warm_bytes(data: bytes, path: str, mtime: float = 0.0) -> WarmFile:
    """Decode one warm file (any of the three formats). Raises FormatError. Memory
    follows the entries the file lists, bounded by the keys of the pack it names."""
    if not data.strip():
        raise FormatError(f"{path}: empty file, expected warm-start JSON")
    obj, spans = _parse_skeleton(data, path)
    kind = sniff_kind(obj)
    if kind is None:
        raise FormatError(
            f"{path}: not a warm-start file (expected a poolmon, pool-heat-v1 or arena heat JSON object)"
        )

    def owners(where: str, arity: int, ident: PackIdentity | None):
        """The cut-out list ``where`` as arrays, or None when it was not cut out."""
        if where not in spans:
            return None
        return _owner_arrays(data, spans[where], arity, ident, path, kind, where)

    try:
        if kind == "poolmon":
            if obj.get("version") != POOLMON_VERSION:
                raise FormatError(
                    f"{path}: poolmon version {obj.get('version')!r}, expected {POOLMON_VERSION!r}"
                )
            pm = msgspec.convert(obj, Poolmon, strict=True)
            _check_wall_time(pm.wall_time, path)
            _check_geometry(pm.pack, path, "pack")
            _check_listed(len(pm.tiers.pool.owners), pm.pack, path, "tiers.pool.owners")
            _check_listed(len(pm.tiers.arena.owners), pm.pack, path, "tiers.arena.owners")
            pool = _tier_from_owners(
                pm.tiers.pool, path, "tiers.pool.owners", owners("tiers.pool.owners", 3, pm.pack)
            )
            arena = _tier_from_owners(
                pm.tiers.arena, path, "tiers.arena.owners", owners("tiers.arena.owners", 3, pm.pack)
            )
            return WarmFile(path, kind, pm.pack, pool, arena, pm.counters, pm.wall_time, pm.steps, pm.policy)
        if kind == "pool-heat":
            meta = obj.get("meta")
            version = meta.get("version") if isinstance(meta, dict) else None
            if version != POOL_HEAT_VERSION:
                raise FormatError(
                    f"{path}: pool-heat meta.version {version!r}, expected {POOL_HEAT_VERSION!r}"
                )
            ph = msgspec.convert(obj, PoolHeat, strict=True)
            m = ph.meta
            ident = PackIdentity(tag=m.tag, n_layers=m.n_layers, n_experts=m.E, slot_bytes=m.slot_bytes)
            _check_geometry(ident, path, "meta")
            _check_listed(len(ph.owners), ident, path, "owners")
            bulk = owners("owners", 2, ident)
            return WarmFile(
                path,
                kind,
                ident,
                _ranked_tier(ph.owners if bulk is None else bulk[0], path, "owners"),
                WarmTier.empty(),
                wall_time=mtime,
            )
        if obj.get("version") != ARENA_HEAT_VERSION or isinstance(obj.get("version"), bool):
            raise FormatError(
                f"{path}: arena heat version {obj.get('version')!r}, expected {ARENA_HEAT_VERSION}"
            )
        ah = msgspec.convert(obj, ArenaHeat, strict=True)
        _check_listed(len(ah.keys), None, path, "keys")
        bulk = owners("keys", 2, None)
        return WarmFile(
            path,
            kind,
            None,
            WarmTier.empty(),
            _ranked_tier(ah.keys if bulk is None else bulk[0], path, "keys"),
            wall_time=mtime,
        )
    except msgspec.ValidationError as exc:
        raise FormatError(f"{path}: {kind}: {exc}") from exc


def _check_listed(n: int, ident: PackIdentity | None, path: str, where: str) -> None:
    """An owner list names each key of the pack the file names at most once (arena heat
    names no pack: the largest one's): a longer list is refused before it is decoded."""
    if ident is None:
        limit, what = MAX_KEYS, "keys a pack may have"
    else:
        limit = ident.n_layers * ident.n_experts
        what = f"keys of the {ident.n_layers} x {ident.n_experts} pack it names"
    if n > limit:
        raise FormatError(
            f"{path}: {where} lists {n:,} entries, more than the "
            f"{limit:,} {what} (each is named at most once)"
        )


def read_warm_file(path: str | os.PathLike) -> WarmFile:
    """Read and decode a warm file strictly. Raises FileNotFoundError,
    FormatError or TierIOError; the message names the file."""
    path = os.fspath(path)
    data = read_capped(path, MAX_WARM_FILE_BYTES, "warm-start file")
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        mtime = 0.0
    return parse_warm_bytes(data, path, mtime)


# ---------------------------------------------------------------- writers
def _owners3(tier: WarmTier) -> list:
    return [[int(l), int(e), float(h)] for (l, e), h in zip(tier.keys.tolist(), tier.heat.tolist())]


def to_poolmon(wf: WarmFile, identity: PackIdentity | None = None) -> Poolmon:
    ident = identity or wf.identity
    if ident is None:
        raise FormatError(
            f"{wf.path}: {wf.kind} carries no pack identity; give --pack to convert it to a poolmon"
        )
    return Poolmon(
        version=POOLMON_VERSION,
        pack=ident,
        tiers=PoolmonTiers(
            pool=TierOwners(int(wf.pool.capacity or len(wf.pool)), _owners3(wf.pool)),
            arena=TierOwners(int(wf.arena.capacity or len(wf.arena)), _owners3(wf.arena)),
        ),
        counters=wf.counters,
        wall_time=float(wf.wall_time),
        steps=int(wf.steps or 0),
        policy=wf.policy,
    )


def to_pool_heat(wf: WarmFile, identity: PackIdentity | None = None) -> PoolHeat:
    """pool-heat-v1 from the pool tier (the arena tier when there is no pool)."""
    ident = identity or wf.identity
    if ident is None:
        raise FormatError(
            f"{wf.path}: {wf.kind} carries no pack identity; give --pack to convert it to pool-heat-v1"
        )
    tier = wf.pool if len(wf.pool) or not len(wf.arena) else wf.arena
    meta = PoolHeatMeta(
        version=POOL_HEAT_VERSION,
        tag=ident.tag,
        n_layers=ident.n_layers,
        E=ident.n_experts,
        slot_bytes=ident.slot_bytes,
    )
    return PoolHeat(meta=meta, owners=[tuple(k) for k in tier.keys.tolist()])


def to_arena_heat(wf: WarmFile) -> ArenaHeat:
    """Arena heat from the arena tier (the pool tier when the arena is empty)."""
    tier = wf.arena if len(wf.arena) or not len(wf.pool) else wf.pool
    return ArenaHeat(version=ARENA_HEAT_VERSION, keys=[tuple(k) for k in tier.keys.tolist()])


def encode(obj) -> bytes:
    """One-line JSON (pool-heat-v1 is specified as one line; the others follow)."""
    return msgspec.json.encode(obj)


def pool_heat_name(tag: str, rank: int = 0, world: int = 1, pp: tuple[int, int] | None = None) -> str:
    """vLLM-Moet's file name: ``pool-heat.<tag>.rank<r>of<w>[.pp<p>of<q>].json``."""
    name = f"pool-heat.{tag}.rank{rank}of{world}"
    if pp is not None:
        name += f".pp{pp[0]}of{pp[1]}"
    return name + ".json"


def arena_heat_path(pack_path: str | os.PathLike) -> str:
    """vLLM-Moet's arena heat file sits beside the pack: ``<pack path>.heat.json``."""
    return os.fspath(pack_path) + ".heat.json"
