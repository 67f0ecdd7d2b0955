"""The hostile pack corpus: a few hundred packs generated deterministically from one
valid base (2 layers x 3 experts x 100-byte rows, stride 4096), each wrong in one way.

Four base styles cover both containers and both name styles (docs/FORMAT.md):
``ts-v2`` / ``ts-old`` (tierstore sidecar with layout and checksums) and ``moet-v2`` /
``moet-old`` (vLLM-Moet v2 sidecar: the ten plain fields). A v2 name carries the key20
of the *valid* identity, so a case that edits an identity field is also a key20 case.

Every case says what must happen: ``refuse`` (Pack.open raises), ``open`` (opens and
every row reads back as written), ``verify_fail`` (opens; ``verify`` and a checksumming
store refuse the rows in ``bad_rows``), or ``either`` (a clean refusal or a correct open).
The sidecar is written here by hand (json / raw bytes), never through tierstore."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import xxhash

L, E, SLOT, STRIDE = 2, 3, 100, 4096
FILE_BYTES = L * E * STRIDE
STYLES = ("ts-v2", "ts-old", "moet-v2", "moet-old")
BASE_FIELDS = (
    "version",
    "tag",
    "E",
    "n_layers",
    "slot_bytes",
    "stride",
    "ckpt_id",
    "zero_mode",
    "quantizer_abi",
    "layers",
)
TS_FIELDS = ("layout", "checksum", "checksums")
IDENTITY = ("ckpt_id", "zero_mode", "quantizer_abi", "tag", "n_layers", "E", "slot_bytes", "stride")
# one value of every JSON kind, plus ints no field accepts
WRONG = ["str", 1.5, True, None, [], {}, 2**70, -1, 0, [1], {"a": 1}]


def rows(seed: int = 7) -> np.ndarray:
    """The intended bytes: uint8 [L, E, SLOT], never zero (a hole can't pass as data)."""
    return np.random.default_rng(seed).integers(1, 256, size=(L, E, SLOT), dtype=np.uint8)


ROWS = rows()


def row_sum(layer: int, expert: int) -> int:
    return xxhash.xxh3_64_intdigest(ROWS[layer, expert].tobytes())


def layout() -> dict:
    n = SLOT // 17
    return {
        "kind": "opaque",
        "order": "linear",
        "params": {"blocks": n},
        "sections": [
            {"name": "q", "offset": 0, "bytes": 16 * n, "dtype": "uint8", "shape": [n, 16], "codec": "e2m1"},
            {"name": "s", "offset": 16 * n, "bytes": n, "dtype": "uint8", "shape": [n, 1], "codec": "e8m0"},
        ],
    }


def sidecar(style: str, layers=(0, 1)) -> dict:
    moet = style.startswith("moet")
    side = {
        "version": 2,
        "tag": "fp4",
        "E": E,
        "n_layers": L,
        "slot_bytes": SLOT,
        "stride": STRIDE,
        "ckpt_id": "hostile-ckpt",
        "zero_mode": "none",
        "quantizer_abi": "tsym4-e8m0-fragmajor-a32-v2" if moet else "tierstore-random-v1",
        "layers": list(layers),
    }
    if not moet:
        side.update(
            layout=layout(),
            checksum="xxh3_64",
            checksums={str(l): [row_sum(l, e) for e in range(E)] for l in layers},
        )
    return side


def key20(side: dict) -> str:
    canon = json.dumps({k: side[k] for k in IDENTITY}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canon.encode()).hexdigest()[:20]


def pack_name(style: str, side: dict | None = None, tag: str = "fp4", rank: str = "rank0of1") -> str:
    if style.endswith("v2"):
        return f"{tag}.v2.{key20(side or sidecar(style))}.{rank}.pack"
    return f"{tag}.{rank}.pack"


def data(layers=(0, 1)) -> bytearray:
    out = bytearray(FILE_BYTES)
    for l in layers:
        for e in range(E):
            off = (l * E + e) * STRIDE
            out[off : off + SLOT] = ROWS[l, e].tobytes()
    return out


@dataclass
class PackCase:
    name: str
    build: Callable[[str], str]  # writes into the case dir, returns what to open
    expect: str = "refuse"  # refuse | open | verify_fail | either
    match: str | None = None  # regex the one-line error must match
    open_kwargs: dict = field(default_factory=dict)
    written: tuple = (0, 1)  # layers an open must list
    bad_rows: tuple = ()  # (layer, expert) a checksum must refuse

    def to_json(self, d: str, target: str) -> dict:
        return {
            "name": self.name,
            "dir": d,
            "target": target,
            "expect": self.expect,
            "match": self.match,
            "open_kwargs": self.open_kwargs,
            "written": list(self.written),
            "bad_rows": [list(r) for r in self.bad_rows],
        }


def write_pack(
    d: str, style: str, side=None, raw_side: bytes | None = None, body=None, name: str | None = None
) -> str:
    """Write one pack into ``d``: the sidecar (an object, or raw bytes) and the data."""
    os.makedirs(d, exist_ok=True)
    name = name or pack_name(style)
    side = sidecar(style) if side is None else side
    path = os.path.join(d, name)
    with open(path, "wb") as f:
        f.write(data() if body is None else body)
    with open(path[:-5] + ".json", "wb") as f:
        f.write(raw_side if raw_side is not None else json.dumps(side, sort_keys=True).encode())
    return path


def _side_case(name, style, edit, expect="refuse", match=None, written=(0, 1)) -> PackCase:
    def build(d):
        side = sidecar(style)
        edit(side)
        return write_pack(d, style, side)

    return PackCase(name, build, expect, match, written=written)


def _raw_case(name, style, raw: Callable[[], bytes], expect="refuse", match=None) -> PackCase:
    return PackCase(name, lambda d: write_pack(d, style, raw_side=raw()), expect, match)


def _type_ok(fname: str, v) -> bool:
    if fname in ("version", "E", "n_layers", "slot_bytes", "stride"):
        return type(v) is int and -(2**63) <= v < 2**64
    if fname in ("tag", "ckpt_id", "zero_mode", "quantizer_abi", "checksum"):
        return type(v) is str
    if fname == "layers":
        return type(v) is list and all(type(x) is int for x in v)
    if fname == "layout":
        return v is None
    if fname == "checksums":
        return v is None or type(v) is dict
    return False


def _expect_field(style: str, fname: str, v) -> tuple[str, tuple]:
    """(expect, written layers) when field ``fname`` of a ``style`` sidecar is ``v``."""
    if not _type_ok(fname, v):
        return "refuse", ()
    moet, v2 = style.startswith("moet"), style.endswith("v2")
    if fname in ("ckpt_id", "zero_mode", "quantizer_abi"):
        return ("refuse", ()) if v2 else ("open", (0, 1))  # key20 proves identity
    if fname == "layers":
        ok = moet and v == sorted(set(v)) and all(0 <= x < L for x in v)
        return ("open", tuple(v)) if ok else ("refuse", ())  # ts: checksums keys differ
    if fname == "layout":
        return "open", (0, 1)  # null = none recorded
    return "refuse", ()


def field_cases() -> list[PackCase]:
    out = []
    for style in STYLES:
        fields = BASE_FIELDS + (TS_FIELDS if style.startswith("ts") else ())
        for fname in fields:
            for i, v in enumerate(WRONG):
                expect, written = _expect_field(style, fname, v)
                out.append(
                    _side_case(
                        f"{style}-{fname}-wrong{i}",
                        style,
                        lambda s, f=fname, v=v: s.__setitem__(f, v),
                        expect,
                        written=written,
                    )
                )
            optional = fname in ("layout",)
            out.append(
                _side_case(
                    f"{style}-{fname}-missing",
                    style,
                    lambda s, f=fname: s.pop(f),
                    "open" if optional else "refuse",
                    None if optional else None,
                )
            )
    return out


def _dup_key(style: str, fname: str, same: bool) -> bytes:
    side = sidecar(style)
    text = json.dumps(side, sort_keys=True)
    value = json.dumps(side[fname] if same else WRONG[0])
    return (text[:-1] + f', "{fname}": {value}}}').encode()


def structure_cases() -> list[PackCase]:
    out = []
    for style in ("ts-v2", "moet-old"):
        for fname in BASE_FIELDS:
            for same in (True, False):
                out.append(
                    _raw_case(
                        f"{style}-dup-{fname}-{'same' if same else 'other'}",
                        style,
                        lambda s=style, f=fname, sm=same: _dup_key(s, f, sm),
                        match="duplicate key",
                    )
                )
        valid = json.dumps(sidecar(style), sort_keys=True).encode()
        for i, cut in enumerate(
            (0, 1, 2, 10, len(valid) // 3, len(valid) // 2, len(valid) - 2, len(valid) - 1)
        ):
            out.append(_raw_case(f"{style}-json-cut{i}", style, lambda v=valid, c=cut: v[:c]))
        for label, mangle in [
            ("top-list", lambda v: b"[" + v + b"]"),
            ("top-str", lambda v: b'"x"'),
            ("top-int", lambda v: b"12"),
            ("top-null", lambda v: b"null"),
            ("top-true", lambda v: b"true"),
            ("top-float", lambda v: b"1.5"),
            ("spaces", lambda v: b"   \n\t  "),
            ("bom", lambda v: b"\xef\xbb\xbf" + v),
            ("trailing-garbage", lambda v: v + b"}x"),
            ("two-objects", lambda v: v + v),
            ("comment", lambda v: b"// c\n" + v),
            ("single-quotes", lambda v: v.replace(b'"', b"'")),
            ("trailing-comma", lambda v: v[:-1] + b",}"),
            ("nul-byte", lambda v: v[:5] + b"\0" + v[5:]),
            ("utf16", lambda v: v.decode().encode("utf-16")),
            ("latin1-in-string", lambda v: v.replace(b"hostile-ckpt", b"hostile-\xe9")),
            ("invalid-utf8", lambda v: v.replace(b"hostile-ckpt", b"\xff\xfe\xfd")),
            ("overlong-utf8", lambda v: v.replace(b"hostile-ckpt", b"\xc0\xaf")),
            ("lone-surrogate", lambda v: v.replace(b"hostile-ckpt", b"\\ud800")),
            ("surrogate-in-tag", lambda v: v.replace(b'"tag": "fp4"', b'"tag": "fp4\\udfff"')),
            ("escaped-nul", lambda v: v.replace(b"hostile-ckpt", b"a\\u0000b")),
            ("unterminated-string", lambda v: v.replace(b'"hostile-ckpt"', b'"hostile-ckpt')),
            ("raw-newline-in-string", lambda v: v.replace(b"hostile-ckpt", b"a\nb")),
            ("bad-escape", lambda v: v.replace(b"hostile-ckpt", b"a\\qb")),
        ]:
            expect = "refuse"
            if label in ("lone-surrogate", "escaped-nul") and style == "moet-old":
                expect = "either"  # a legal JSON string; a clean answer either way
            out.append(_raw_case(f"{style}-json-{label}", style, lambda v=valid, m=mangle: m(v), expect))
        for fname in ("version", "E", "n_layers", "slot_bytes", "stride"):
            for lit in (b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-0", b"2.0", b"1" + b"0" * 5000):

                def raw(s=style, f=fname, lit=lit):
                    side = sidecar(s)
                    side[f] = "@@"
                    return json.dumps(side, sort_keys=True).encode().replace(b'"@@"', lit)

                out.append(_raw_case(f"{style}-{fname}-lit-{lit[:9].decode()}-{len(lit)}", style, raw))
    for lit in (b"NaN", b"1e400", b"1.0", b"18446744073709551616", b"-1"):

        def raw(lit=lit):
            side = sidecar("ts-old")
            side["checksums"]["1"][2] = "@@"
            return json.dumps(side, sort_keys=True).encode().replace(b'"@@"', lit)

        out.append(_raw_case(f"ts-old-checksum-value-{lit[:8].decode()}", "ts-old", raw))
    out += _nesting_cases() + _flood_cases()
    return out


def _nesting_cases() -> list[PackCase]:
    out = []
    for depth in (17, 64, 1000, 100_000, 1_000_000):
        for where in ("extra", "params", "layers"):

            def raw(depth=depth, where=where):
                side = sidecar("ts-old")
                side[{"extra": "zz_extra", "params": "layout", "layers": "layers"}[where]] = "@@"
                nest = b"[" * depth + b"]" * depth
                if where == "params":
                    nest = b'{"kind":"opaque","params":{"a":' + b"[" * depth + b"]" * depth + b"}}"
                return json.dumps(side, sort_keys=True).encode().replace(b'"@@"', nest)

            out.append(
                _raw_case(
                    f"nest-{where}-{depth}", "ts-old", raw, match="nested too deeply" if depth > 16 else None
                )
            )
        out.append(
            _raw_case(f"nest-unclosed-{depth}", "moet-old", lambda depth=depth: b'{"layers": ' + b"[" * depth)
        )
    return out


def _flood_cases() -> list[PackCase]:
    """Escaped quotes and backslashes by the megabyte: the depth scan must stay linear."""
    out = []
    for n in (1_000, 65_000, 100_000, 1_000_000, 4_000_000, 60_000_000):
        for unit, label in ((b'\\"', "quotes"), (b"\\\\", "backslashes"), (b'\\\\\\"', "mixed")):
            for style in ("moet-old", "ts-v2"):

                def raw(n=n, unit=unit, style=style):
                    side = sidecar(style)
                    side["ckpt_id"] = "@@"
                    return (
                        json.dumps(side, sort_keys=True)
                        .encode()
                        .replace(b'"@@"', b'"' + unit * (n // len(unit)) + b'"')
                    )

                # a string longer than any field is refused before the parse
                expect = "open" if style == "moet-old" and n < 1 << 16 else "refuse"
                match = "string of more than 65536 bytes" if n > 1 << 16 else None
                if n >= 1_000_000 and (style == "ts-v2" or unit != b'\\"'):
                    continue
                out.append(_raw_case(f"flood-{label}-{n}-{style}", style, raw, expect, match))
        out.append(
            _raw_case(f"flood-unterminated-{n}", "moet-old", lambda n=n: b'{"ckpt_id": "' + b'\\"' * (n // 2))
        )
    return out
