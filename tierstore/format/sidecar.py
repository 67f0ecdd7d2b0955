"""Pack file format: names, identity (key20), sidecar schema and its validation.

The spec is docs/FORMAT.md; this module is the one place that enforces it.
Every sidecar is untrusted. ``load_sidecar`` checks, in this order (safetensors
style): file size cap, JSON parse, typed decode (msgspec), meaning; the pack
file's size and the name's key20 are checked by ``Pack.open`` afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from dataclasses import dataclass
from typing import Literal

import msgspec

from tierstore import settings
from tierstore.errors import ConfigError, FormatError
from tierstore.files.untrusted import DEFAULT_MAX_STRING, JsonBudget, read_json

PAGE = 4096
SIDECAR_VERSION = 2
SIDECAR_MAX_BYTES = 64 << 20  # a DS4 sidecar with checksums is ~200 KiB
MAX_FILE_BYTES = 1 << 62  # keeps every offset inside int64 for the C++ reader
MAX_LAYERS = MAX_EXPERTS = 1 << 16  # per-layer/per-expert tables stay small for hostile input
MAX_SLOT_BYTES = 1 << 36
MAX_RANKS = 1 << 16  # tensor / pipeline ranks in a pack's name
MAX_KEYS = 1 << 22  # n_layers x E: the store keeps a few bytes per key (DS4 has 11,008)
# An identity string (ckpt_id, quantizer_abi, zero_mode) as the sidecar's JSON holds it: the
# reader refuses a longer string (files.untrusted.DEFAULT_MAX_STRING), so the writer does too.
MAX_FIELD_BYTES = DEFAULT_MAX_STRING
CHECKSUM_ALGOS = ("xxh3_64",)
DEFAULT_CHECKSUM = "xxh3_64"
ORDERS = ("linear", "fragmajor")
CODECS = ("e2m1", "e2m1.fragmajor", "e8m0", "base2", "raw")  # FORMAT.md, "RowLayout"
MAX_PARAM = 1 << 62  # layout params are sizes (H, I, blocks): far below this
# dtype name -> bytes per element; "e2m1x2" is two FP4 nibbles per byte.
DTYPE_BYTES = {
    "uint8": 1,
    "int8": 1,
    "e2m1x2": 1,
    "e8m0": 1,
    "float8_e4m3fn": 1,
    "uint16": 2,
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "int32": 4,
}
IDENTITY_FIELDS = ("ckpt_id", "zero_mode", "quantizer_abi", "tag", "n_layers", "E", "slot_bytes", "stride")
TIERSTORE_ONLY_FIELDS = frozenset({"layout", "checksum", "checksums"})

_TAG = r"[A-Za-z0-9_\-]+"
# [0-9], not \d: \d matches any Unicode digit ("rank\u0660of1"), which no other
# reader of these names would parse as 0; \Z, not $, which matches before a newline.
_NAME_RE = re.compile(
    rf"^(?P<tag>{_TAG})(?:\.v2\.(?P<key20>[0-9a-f]{{20}}))?"
    r"\.rank(?P<rank>[0-9]+)of(?P<world>[0-9]+)(?:\.pp(?P<p>[0-9]+)of(?P<q>[0-9]+))?\.pack\Z"
)
TAG_RE = re.compile(rf"^{_TAG}\Z")  # \Z: "$" would let a trailing newline through


def round_up(n: int, align: int = PAGE) -> int:
    return -(-n // align) * align


class RowSection(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One named byte range of an expert row: ``bytes`` = DTYPE_BYTES[dtype] * prod(shape)."""

    name: str
    offset: int
    bytes: int
    dtype: str
    shape: list[int]
    codec: str = "raw"


class RowLayout(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What the bytes of every row mean. ``kind`` is the row tag (``fp4``, ``base``,
    ``opaque``...); ``order`` is the nibble order of e2m1 planes."""

    kind: str
    sections: list[RowSection]
    order: Literal["linear", "fragmajor"] = "linear"
    params: dict[str, int] = {}


class Sidecar(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """The `.json` next to a pack. The first ten fields are vLLM-Moet's; the last three
    are tierstore's superset and absent from vLLM-Moet sidecars."""

    version: int
    tag: str
    E: int
    n_layers: int
    slot_bytes: int
    stride: int
    ckpt_id: str
    zero_mode: str
    quantizer_abi: str
    layers: list[int]
    layout: RowLayout | None = None
    checksum: str | None = None
    checksums: dict[int, list[int]] | None = None

    def identity(self) -> dict:
        return {k: getattr(self, k) for k in IDENTITY_FIELDS}


def key20_of(identity: dict) -> str:
    """First 20 hex chars of sha256 over the canonical JSON of the identity fields."""
    canon = json.dumps({k: identity[k] for k in IDENTITY_FIELDS}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class PackName:
    tag: str
    key20: str | None
    rank: int
    world: int
    pp: tuple[int, int] | None

    @classmethod
    def parse(cls, path: str | os.PathLike) -> PackName:
        base = os.path.basename(os.fspath(path))
        m = _NAME_RE.match(base)
        if not m:
            raise FormatError(
                f"{os.fspath(path)}: not a pack name; expected "
                "<tag>.v2.<key20>.rank<r>of<w>[.pp<p>of<q>].pack or "
                "<tag>.rank<r>of<w>.pack"
            )
        rank, world = int(m["rank"]), int(m["world"])
        pp = (int(m["p"]), int(m["q"])) if m["p"] is not None else None
        if world < 1 or rank >= world or (pp and (pp[1] < 1 or pp[0] >= pp[1])):
            raise FormatError(f"{os.fspath(path)}: rank/pipeline index out of range in the name")
        return cls(m["tag"], m["key20"], rank, world, pp)

    @staticmethod
    def checked(rank, world, pp, who: str) -> tuple[int, int, tuple[int, int] | None]:
        """(rank, world, pp) a caller gave, as settings.argument checks numbers: 1 <= world
        <= MAX_RANKS, 0 <= rank < world, pp = (stage, stages) likewise; ConfigError naming
        ``who`` and the argument (a rank -1 would name a pack no reader can open)."""
        world = settings.argument(f"{who}: world", world, settings.integer(1, MAX_RANKS))
        rank = settings.argument(f"{who}: rank", rank, settings.integer(0, world - 1))
        if pp is not None:
            if not isinstance(pp, (tuple, list)) or len(pp) != 2:
                raise ConfigError(f"{who}: pp must be (stage, stages), found {pp!r}")
            stages = settings.argument(f"{who}: pp stages", pp[1], settings.integer(1, MAX_RANKS))
            pp = (settings.argument(f"{who}: pp stage", pp[0], settings.integer(0, stages - 1)), stages)
        return rank, world, pp

    def filename(self) -> str:
        key = f".v2.{self.key20}" if self.key20 else ""
        pp = f".pp{self.pp[0]}of{self.pp[1]}" if self.pp else ""
        return f"{self.tag}{key}.rank{self.rank}of{self.world}{pp}.pack"


def sidecar_path_of(pack_path: str) -> str:
    return pack_path[: -len(".pack")] + ".json"


def lock_path_of(pack_path: str) -> str:
    return pack_path[: -len(".pack")] + ".lock"


SIDECAR_MAX_DEPTH = 16  # a valid sidecar nests 5 levels (layout.sections[i].shape)
# Beyond its per-layer and per-row entries a sidecar holds a few fields and a layout of a
# handful of sections (~15 items each): these leave room for ~250 sections.
SIDECAR_FIXED_ITEMS = 4096
SIDECAR_FIXED_CONTAINERS = 1024


class _Geometry(msgspec.Struct):
    """The two numbers a sidecar's size follows from; every other field is skipped
    unparsed (msgspec allocates nothing for it)."""

    n_layers: int = 0
    E: int = 0


def sidecar_budget(raw: bytes) -> JsonBudget:
    """How many JSON items and containers the sidecar ``raw`` may hold, from the
    geometry it declares (capped at the format's limits): ``layers`` (L), ``checksums``
    (L lists of E sums) and a few fixed fields. A 64 MiB sidecar of 2 layers x 3 experts
    is refused before json.loads spends gigabytes on it; undeclared geometry (not an
    object, fields missing or not integers) leaves only the fixed part, enough for the
    strict parse to name what is wrong in a small file."""
    try:
        g = msgspec.json.decode(raw, type=_Geometry)
        L, E = min(max(g.n_layers, 0), MAX_LAYERS), min(max(g.E, 0), MAX_EXPERTS)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        L = E = 0  # the strict parse names the problem (nesting first)
    keys = min(L * E, MAX_KEYS)
    return JsonBudget(
        keys + 3 * L + SIDECAR_FIXED_ITEMS,
        L + SIDECAR_FIXED_CONTAINERS,
        f"all a sidecar of {L} layers x {E} experts holds",
    )


def load_sidecar(path: str, *, key20_in_name: bool, partial_sums: bool = False) -> tuple[Sidecar, list[str]]:
    """Read and validate a sidecar file. Returns the sidecar and the names of unknown
    vLLM-Moet keys that were tolerated (see FORMAT.md, "Unknown fields")."""
    # 1. a regular file, its size against a cap, 2. nesting depth and how many items it
    #    holds against what its geometry describes (a linear scan), then strict JSON (no
    #    NaN/Infinity, no duplicate keys): tierstore.files.untrusted
    try:
        obj = read_json(path, SIDECAR_MAX_BYTES, "sidecar", SIDECAR_MAX_DEPTH, budget=sidecar_budget)
    except FileNotFoundError:
        raise FormatError(f"{path}: sidecar is missing") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{path}: sidecar must be a JSON object, found {type(obj).__name__}")
    # 3. typed decode; unknown keys: strict for tierstore's own sidecars
    known = set(Sidecar.__struct_fields__)
    unknown = sorted(set(obj) - known)
    if unknown and not (TIERSTORE_ONLY_FIELDS & set(obj)):
        if not key20_in_name:
            raise FormatError(
                f"{path}: unknown field `{unknown[0]}` in a sidecar whose name carries no key20 identity"
            )
        warnings.warn(f"{path}: ignoring unknown vLLM-Moet sidecar fields {unknown}", stacklevel=3)
        obj = {k: v for k, v in obj.items() if k in known}
    else:
        unknown = []
    try:
        sc = msgspec.convert(obj, Sidecar, strict=True, str_keys=True)
    except msgspec.ValidationError as exc:
        raise FormatError(f"{path}: sidecar field error: {exc}") from None
    # 4. meaning
    validate_sidecar(sc, path, partial_sums)
    return sc, unknown


def json_field_bytes(text: str) -> int:
    """Bytes ``text`` takes inside a sidecar's JSON quotes (escapes included), the length
    the reader's string cap measures."""
    return len(json.dumps(text)) - 2


def validate_sidecar(sc: Sidecar, path: str, partial_sums: bool = False) -> None:
    """Checks of meaning; every message names the file and the field. ``partial_sums``:
    listed layers may lack checksums (only PackWriter, resuming a pack another engine
    extended, asks: it hashes them before it publishes a sidecar)."""

    def bad(msg: str):
        raise FormatError(f"{path}: {msg}")

    if sc.version != SIDECAR_VERSION:
        bad(f"field `version`: expected {SIDECAR_VERSION}, found {sc.version}")
    for name in ("ckpt_id", "zero_mode", "quantizer_abi"):
        size = json_field_bytes(getattr(sc, name))
        if size > MAX_FIELD_BYTES:
            bad(
                f"field `{name}`: {size} bytes as JSON, over the cap {MAX_FIELD_BYTES} (a "
                f"reader refuses a longer string)"
            )
    if not TAG_RE.match(sc.tag):
        bad(f"field `tag`: {sc.tag!r} is not a valid tag ([A-Za-z0-9_-]+)")
    for name in ("E", "n_layers", "slot_bytes"):
        if getattr(sc, name) <= 0:
            bad(f"field `{name}`: expected > 0, found {getattr(sc, name)}")
    for name, cap in (("E", MAX_EXPERTS), ("n_layers", MAX_LAYERS), ("slot_bytes", MAX_SLOT_BYTES)):
        if getattr(sc, name) > cap:
            bad(f"field `{name}`: {getattr(sc, name)} is over the cap {cap}")
    if sc.n_layers * sc.E > MAX_KEYS:
        bad(
            f"geometry {sc.n_layers} layers x {sc.E} experts = {sc.n_layers * sc.E} rows, over "
            f"the limit of {MAX_KEYS} rows (per-row tables would not fit in bounded memory)"
        )
    if sc.stride != round_up(sc.slot_bytes):
        bad(
            f"field `stride`: expected {round_up(sc.slot_bytes)} (slot_bytes {sc.slot_bytes} "
            f"rounded up to {PAGE}), found {sc.stride}"
        )
    if sc.n_layers * sc.E * sc.stride >= MAX_FILE_BYTES:
        bad(f"geometry {sc.n_layers}x{sc.E}x{sc.stride} overflows the {MAX_FILE_BYTES} byte cap")
    for i, layer in enumerate(sc.layers):
        if not 0 <= layer < sc.n_layers:
            bad(f"field `layers`: layer {layer} out of range [0, {sc.n_layers})")
        if i and layer <= sc.layers[i - 1]:
            what = "duplicate" if layer == sc.layers[i - 1] else "unsorted"
            bad(f"field `layers`: {what} layer {layer} at index {i}")
    if sc.layout is not None:
        validate_layout(sc.layout, sc.slot_bytes, path)
    if sc.checksum is None:
        if sc.checksums is not None:
            bad("field `checksums` given without field `checksum` (the algorithm)")
        return
    if sc.checksum not in CHECKSUM_ALGOS:
        bad(f"field `checksum`: unknown algorithm {sc.checksum!r}, expected one of {CHECKSUM_ALGOS}")
    sums = sc.checksums or {}
    if partial_sums:  # PackWriter resuming another engine's layers: it sums the rest first
        stray = sorted(set(sums) - set(sc.layers))
        if stray:
            bad(f"field `checksums`: layers {stray[:8]} have sums but are not in `layers`")
    elif set(sums) != set(sc.layers):
        diff = sorted(set(sums) ^ set(sc.layers))
        bad(f"field `checksums`: layers {list(sums)[:8]} do not match `layers` (differ at {diff[:8]})")
    for layer, row_sums in sums.items():
        if len(row_sums) != sc.E:
            bad(f"field `checksums`: layer {layer} has {len(row_sums)} entries, expected {sc.E}")
        if any(not 0 <= v < 1 << 64 for v in row_sums):
            bad(f"field `checksums`: layer {layer} has a value outside [0, 2^64)")


def validate_layout(layout: RowLayout, slot_bytes: int, path: str) -> None:
    def bad(msg: str):
        raise FormatError(f"{path}: layout: {msg}")

    if layout.order not in ORDERS:
        bad(f"order {layout.order!r}, expected one of {ORDERS}")
    if not TAG_RE.match(layout.kind):
        bad(f"kind {layout.kind!r} is not a row tag ([A-Za-z0-9_-]+, or opaque)")
    for key, value in layout.params.items():
        if not 0 <= value < MAX_PARAM:
            bad(f"params `{key}`: {value} is outside [0, {MAX_PARAM})")
    if not layout.sections:
        bad("no sections")
    names: set[str] = set()
    end_prev, prev = 0, None
    for s in sorted(layout.sections, key=lambda s: s.offset):
        if s.name in names:
            bad(f"section `{s.name}` appears twice")
        names.add(s.name)
        if s.dtype not in DTYPE_BYTES:
            bad(f"section `{s.name}`: unknown dtype {s.dtype!r}")
        if s.codec not in CODECS:
            bad(f"section `{s.name}`: unknown codec {s.codec!r}, expected one of {CODECS}")
        n = DTYPE_BYTES[s.dtype]
        for d in s.shape:
            if d <= 0:
                bad(f"section `{s.name}`: shape {s.shape} has a non-positive dimension")
            n *= d
        if n != s.bytes:
            bad(f"section `{s.name}`: bytes {s.bytes}, expected {n} for {s.dtype} {s.shape}")
        if s.offset < 0 or s.offset + s.bytes > slot_bytes:
            bad(
                f"section `{s.name}`: [{s.offset}, {s.offset + s.bytes}) is outside the {slot_bytes}-byte row"
            )
        if s.offset < end_prev:
            bad(f"section `{s.name}` at offset {s.offset} overlaps `{prev}` ending at {end_prev}")
        end_prev, prev = s.offset + s.bytes, s.name


def encode_sidecar(sc: Sidecar) -> bytes:
    """Sorted keys (as vLLM-Moet writes them), one line, trailing newline."""
    return (json.dumps(msgspec.to_builtins(sc), sort_keys=True, separators=(",", ":")) + "\n").encode()
