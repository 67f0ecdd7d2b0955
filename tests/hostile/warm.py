"""The hostile warm-start corpus: the three formats (tierstore poolmon, vLLM-Moet
pool-heat-v1 and arena heat) for the hostile pack (2 layers x 3 experts), every JSON
path set to every kind of wrong value, plus range, wall-time, truncation, encoding,
nesting and not-a-regular-file cases. Written by hand, never through tierstore."""

from __future__ import annotations

import copy
import json
import os

from hostile.packs import SLOT, STRIDE, WRONG, E, L, key20, sidecar


def poolmon() -> dict:
    side = sidecar("ts-v2")
    return {
        "version": "tierstore-poolmon-v1",
        "pack": {
            "tag": "fp4",
            "n_layers": L,
            "n_experts": E,
            "slot_bytes": SLOT,
            "stride": STRIDE,
            "ckpt_id": side["ckpt_id"],
            "key20": key20(side),
        },
        "tiers": {
            "pool": {"capacity": 4, "owners": [[0, 1, 3.0], [1, 2, 2.0]]},
            "arena": {"capacity": 2, "owners": [[1, 0, 1.0]]},
        },
        "counters": {
            "pool": {"hits": 1, "misses": 2, "promotions": 3, "evictions": 0},
            "arena": {"hits": 0, "misses": 0, "promotions": 0, "evictions": 0},
        },
        "wall_time": 1.7e9,
        "steps": 10,
        "policy": "heat",
    }


def pool_heat() -> dict:
    return {
        "meta": {"version": "pool-heat-v1", "tag": "fp4", "n_layers": L, "E": E, "slot_bytes": SLOT},
        "owners": [[0, 1], [1, 2]],
    }


def arena_heat() -> dict:
    return {"version": 1, "keys": [[1, 0], [0, 2]]}


BASES = {"poolmon": poolmon, "pool-heat": pool_heat, "arena-heat": arena_heat}


def _paths(obj, prefix=()):
    if prefix:
        yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list) and obj and prefix[-1:] != ("owners",) or isinstance(obj, list) and obj:
        yield from _paths(obj[0], prefix + (0,))


def _set(obj, path, value):
    obj = copy.deepcopy(obj)
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return obj


def cases() -> list[tuple[str, bytes | str]]:
    """(name, raw bytes) or (name, special kind) pairs."""
    out = []
    for fmt, base in BASES.items():
        obj = base()
        out.append((f"{fmt}-valid", json.dumps(obj).encode()))
        for path in _paths(obj):
            label = ".".join(map(str, path))
            for i, v in enumerate(WRONG):
                out.append((f"{fmt}-{label}-wrong{i}", json.dumps(_set(obj, path, v)).encode()))
        raw = json.dumps(obj).encode()
        for i, cut in enumerate((0, 1, len(raw) // 2, len(raw) - 1)):
            out.append((f"{fmt}-cut{i}", raw[:cut]))
        for label, fn in (
            ("garbage", lambda r: r + b"x"),
            ("nonutf8", lambda r: r[:3] + b"\xff" + r[3:]),
            ("nan", lambda r: r.replace(b"1", b"NaN", 1)),
            ("bom", lambda r: b"\xef\xbb\xbf" + r),
            ("deep", lambda r: b"[" * 100000 + b"]" * 100000),
            ("flood", lambda r: b'{"x": "' + b'\\"' * 500000 + b'"}'),
            ("dup", lambda r: r[:-1] + b", " + r[1 : r.index(b",")] + b"}"),
        ):
            out.append((f"{fmt}-{label}", fn(raw)))
    pm = poolmon()
    for i, (l, e) in enumerate(
        [(2 * 10**8, 1), (2, 0), (0, 3), (2**62, 2**62), (2**63, 0), (2**64, 0), (-1, 0), (0, -5)]
    ):
        out.append(
            (
                f"poolmon-range{i}",
                json.dumps(_set(pm, ("tiers", "pool", "owners"), [[l, e, 1.0], [0, 1, 0.5]])).encode(),
            )
        )
    for i, t in enumerate([1e20, 1e308, -1.0, 0.0, 1e11 + 1, 5e-324, 2**80]):
        out.append((f"poolmon-wall{i}", json.dumps(_set(pm, ("wall_time",), t)).encode()))
    for i, h in enumerate([1e308, -1.0, 0.0, 1e-320]):
        out.append(
            (f"poolmon-heat{i}", json.dumps(_set(pm, ("tiers", "pool", "owners"), [[0, 1, h]])).encode())
        )
    out.append(
        (
            "poolmon-many-owners",
            json.dumps(_set(pm, ("tiers", "pool", "owners"), [[0, 1, 1.0]] * 50000)).encode(),
        )
    )
    for v in ("tierstore-poolmon-v0", "tierstore-poolmon-v2", "", 1):
        out.append((f"poolmon-version-{v}", json.dumps(_set(pm, ("version",), v)).encode()))
    for kind in ("fifo", "dir", "dev-zero", "link-loop", "dangling", "missing", "over-cap"):
        out.append((f"special-{kind}", kind))
    return out


def materialise(d: str, name: str, body) -> str:
    path = os.path.join(d, name + ".json")
    if isinstance(body, bytes):
        with open(path, "wb") as f:
            f.write(body)
    elif body == "fifo":
        os.mkfifo(path)
    elif body == "dir":
        os.mkdir(path)
    elif body == "dev-zero":
        os.symlink("/dev/zero", path)
    elif body == "link-loop":
        os.symlink(path, path)
    elif body == "dangling":
        os.symlink(path + ".nowhere", path)
    elif body == "over-cap":
        with open(path, "wb") as f:
            f.truncate((64 << 20) + 1)
    return path
