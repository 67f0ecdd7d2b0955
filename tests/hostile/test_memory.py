"""Memory at the caps (issue 41): a hostile sidecar or warm file as large as its cap
(64 MiB) is parsed in memory proportional to what it describes, not to its size, and
`pack verify` streams a row of any size in bounded chunks.

Each case runs in its own child process: the kernel's high-water mark (VmHWM, reset
after the imports) minus the resident size at that moment is the peak the case added.
Before issue 41: 1.5-1.7 GB for the sidecars, 2.0-2.6 GB for the warm files, the whole
row (512 MiB here) for verify."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import xxhash
from cli_process import child_env

MiB = 1 << 20
CAP = 64 * MiB

_CHILD = textwrap.dedent("""
    import json, sys, warnings
    warnings.simplefilter("ignore")
    from tierstore.format.sidecar import load_sidecar
    from tierstore.warm.formats import read_warm_file
    from tierstore.cli import main

    def status():
        with open("/proc/self/status") as f:
            return {l.split(":")[0]: int(l.split()[1]) << 10 for l in f
                    if l.startswith(("VmRSS", "VmHWM"))}

    kind, path, warm_up = sys.argv[1], sys.argv[2], sys.argv[3]
    run = {"sidecar": lambda p: load_sidecar(p, key20_in_name=True),
           "warm": read_warm_file,
           "verify": lambda p: main(["pack", "verify", p])}[kind]
    try:
        run(warm_up)                  # lazy imports and caches: not the case's memory
    except Exception:
        pass
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")                  # VmHWM := VmRSS
    base = status()["VmRSS"]
    try:
        got = run(path)
        out = {"outcome": "read", "detail": repr(got)[:200]}
        if kind == "warm":
            out["entries"] = [len(got.pool), len(got.arena)]
    except Exception as exc:
        out = {"outcome": "refused", "detail": f"{type(exc).__name__}: {exc}"}
    out["grew"] = status()["VmHWM"] - base
    print(json.dumps(out))
""")


def _measure(kind: str, path, warm_up) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(path), str(warm_up)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    print(
        f"{kind} {os.path.basename(str(path))}: peak +{res['grew'] / MiB:.0f} MiB, {res['outcome']}"
    )  # pytest -s: the numbers tests/hostile/README.md quotes
    return res


def _fill(path, head: bytes, unit: bytes, tail: bytes, size: int = CAP) -> str:
    n = (size - len(head) - len(tail)) // len(unit)
    with open(path, "wb") as f:
        f.write(head)
        block = unit * max(1, (4 * MiB) // len(unit))
        for _ in range(n // (len(block) // len(unit))):
            f.write(block)
        f.write(unit * (n % (len(block) // len(unit))))
        f.write(tail)
    return str(path)


def _sidecar_head(L: int, E: int, checksums: bool = False) -> bytes:
    head = {
        "version": 2,
        "tag": "fp4",
        "E": E,
        "n_layers": L,
        "slot_bytes": 4096,
        "stride": 4096,
        "ckpt_id": "c",
        "zero_mode": "none",
        "quantizer_abi": "q",
    }
    text = json.dumps(head)[:-1]
    return text.encode()


NAME = "fp4.v2.0123456789abcdef0123.rank0of1.json"  # a v2 name: unknown keys tolerated

# (label, head, unit, tail): each 64 MiB, each describing a 2 x 3 pack or nothing
SIDECARS = [
    ("unknown-field-of-empty-lists", _sidecar_head(2, 3) + b', "layers": [], "x": [', b"[],", b"[]]}"),
    ("unknown-field-of-objects", _sidecar_head(2, 3) + b', "layers": [], "x": [', b"{},", b"{}]}"),
    ("layers-of-zeros", _sidecar_head(2, 3) + b', "layers": [', b"0,", b"0]}"),
    (
        "checksums-of-one-layer",
        _sidecar_head(2, 3) + b', "layers": [0], "checksum": "xxh3_64", "checksums": {"0": [',
        b"18446744073709551615,",
        b"1]}}",
    ),
    ("top-level-keys", b"{", b'"k":0,', b'"z":0}'),
    ("no-geometry-empty-lists", b'{"x": [', b"[],", b"[]]}"),
]


@pytest.fixture(scope="module")
def small_files(tmp_path_factory):
    """Valid small files to warm each child up with."""
    import tierstore as ts
    from tierstore import PackWriter
    from tierstore.testing.packs import random_layer_rows

    d = tmp_path_factory.mktemp("small")
    with PackWriter(d, tag="fp4", n_layers=2, n_experts=3, slot_bytes=4096, ckpt_id="c") as w:
        for layer in range(2):
            w.write_layer(layer, random_layer_rows(0, layer, 3, 4096))
        pack = w.path
    with ts.ExpertStore(pack, vram_slots=2, device="cpu") as s:
        s.release(s.fire([(0, 1)]))
        s.save_poolmon(d / "poolmon.json")
    return {"pack": pack, "sidecar": pack[: -len(".pack")] + ".json", "warm": d / "poolmon.json"}


@pytest.mark.parametrize("label, head, unit, tail", SIDECARS, ids=[c[0] for c in SIDECARS])
def test_a_64_mib_hostile_sidecar_is_refused_in_memory_far_under_its_size(
    tmp_path, small_files, label, head, unit, tail
):
    path = _fill(tmp_path / NAME, head, unit, tail)
    if label == "top-level-keys":  # distinct keys: no duplicate to stop at
        with open(path, "wb") as f:
            f.write(b"{" + b",".join(b'"k%d":0' % i for i in range(CAP // 14)) + b"}")
    res = _measure("sidecar", path, small_files["sidecar"])
    assert res["outcome"] == "refused" and NAME in res["detail"], res
    # the 64 MiB read itself, and a bounded scan; nothing per item
    assert res["grew"] < 2 * CAP + 24 * MiB, f"{label}: {res['grew'] / MiB:.0f} MiB"


def test_a_sidecar_at_the_cap_that_describes_its_size_costs_in_proportion(tmp_path, small_files):
    # the largest geometry (65536 layers x 64 experts), as many 20-digit sums as 64 MiB
    # holds (~3 M): the largest honest parse; it is proportional to what the file says
    L, E = 1 << 16, 64
    per_layer = json.dumps([18446744073709551615] * E).encode()
    n = (CAP - MiB) // (len(per_layer) + 10)
    head = (
        _sidecar_head(L, E)
        + b', "layers": '
        + json.dumps(list(range(n))).encode()
        + b', "checksum": "xxh3_64", "checksums": {'
    )
    body = b",".join(b'"%d": ' % i + per_layer for i in range(n))
    path = tmp_path / NAME
    path.write_bytes(head + body + b"}}")
    res = _measure("sidecar", path, small_files["sidecar"])
    assert res["outcome"] == "read", res
    assert res["grew"] < 6 * CAP, f"{res['grew'] / MiB:.0f} MiB"


def _poolmon_head(L: int, E: int) -> bytes:
    return (
        b'{"version": "tierstore-poolmon-v1", "pack": {"tag": "fp4", "n_layers": %d, '
        b'"n_experts": %d, "slot_bytes": 4096}, "tiers": {"pool": {"capacity": 4, '
        b'"owners": [' % (L, E)
    )


WARM = [
    ("poolmon-owners", _poolmon_head(2, 3), b"[0,1,1.0],", b"[0,1,1.0]]}}}", "refused"),
    (
        "pool-heat-owners",
        b'{"meta": {"version": "pool-heat-v1", "tag": "fp4", "n_layers": 2, '
        b'"E": 3, "slot_bytes": 4096}, "owners": [',
        b"[0,1],",
        b"[0,1]]}",
        "refused",
    ),
    ("arena-heat-keys", b'{"version": 1, "keys": [', b"[0,1],", b"[0,1]]}", "refused"),
    ("arena-heat-empty-lists", b'{"version": 1, "keys": [', b"[],", b"[]]}", "refused"),
    (
        "pool-heat-unknown-field",
        b'{"meta": {"version": "pool-heat-v1", "tag": "fp4", '
        b'"n_layers": 2, "E": 3, "slot_bytes": 4096}, "owners": [[0, 1]], "x": [',
        b"[],",
        b"[]]}",
        "refused",
    ),
    # the largest pack a warm file may name (4 Mi keys), every key listed once: an honest
    # file at the cap, read whole, 24 bytes an entry
    ("poolmon-of-the-largest-pack", _poolmon_head(1 << 16, 64), b"[1,2,0.5],", b"[1,2,0.5]]}}}", "read"),
]


@pytest.mark.parametrize("label, head, unit, tail, outcome", WARM, ids=[c[0] for c in WARM])
def test_a_64_mib_warm_file_is_read_in_memory_proportional_to_its_entries(
    tmp_path, small_files, label, head, unit, tail, outcome
):
    size = CAP if outcome == "refused" else len(head) + len(tail) + len(unit) * ((1 << 22) - 1)
    path = _fill(tmp_path / f"{label}.json", head, unit, tail, size)
    res = _measure("warm", path, small_files["warm"])
    assert res["outcome"] == outcome, res
    if outcome == "refused":
        assert str(path) in res["detail"], res
        assert res["grew"] < 2 * CAP + 24 * MiB, f"{label}: {res['grew'] / MiB:.0f} MiB"
    else:
        assert res["entries"] == [1 << 22, 0], res
        # the text, 24 B an entry for the arrays, and the sort of them
        assert res["grew"] < 2 * CAP + 5 * 24 * (1 << 22), f"{label}: {res['grew'] / MiB:.0f} MiB"


def test_pack_verify_streams_a_row_larger_than_its_chunk(tmp_path, small_files):
    from tierstore import PackWriter
    from tierstore.files.atomic import write_atomic
    from tierstore.format.sidecar import encode_sidecar, load_sidecar

    slot = 512 * MiB  # one row, sparse: reads as zeros
    with PackWriter(tmp_path, tag="fp4", n_layers=1, n_experts=1, slot_bytes=slot, ckpt_id="c") as w:
        path = w.path
    side = path[: -len(".pack")] + ".json"
    sc, _ = load_sidecar(side, key20_in_name=True)
    h = xxhash.xxh3_64()
    zeros = bytes(16 * MiB)
    for _ in range(slot // len(zeros)):
        h.update(zeros)
    sc.layers, sc.checksums = [0], {0: [h.intdigest()]}
    write_atomic(side, encode_sidecar(sc))
    res = _measure("verify", path, small_files["pack"])
    assert res["outcome"] == "read" and res["detail"] == "0", res
    assert res["grew"] < 128 * MiB, f"verify held {res['grew'] / MiB:.0f} MiB for a 512 MiB row"
    with open(path, "r+b") as f:  # one bad byte deep in the row
        f.seek(300 * MiB + 5)
        f.write(b"\x01")
    r = subprocess.run(
        [sys.executable, "-m", "tierstore", "pack", "verify", path],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "layer 0 expert 0 at offset 0x0" in r.stderr, r.stderr
    assert os.path.getsize(path) == slot
