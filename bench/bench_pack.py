"""Pack format benchmarks, each against a ceiling measured in the same run.

    python bench/bench_pack.py [--dir DIR] [--mib 512] [--slot 13369344]

- write: PackWriter.write_layer (pwrite + checksums + fdatasync + sidecar publish)
  vs raw pwrite + fdatasync of the same bytes to a plain file;
- verify: Pack.verify (pread + xxh3_64 per row) vs raw pread of the same file
  (page cache warm) and vs xxh3_64 over bytes already in memory;
- open: Pack.open of a DS4-geometry pack (43 x 256 x 13,369,344 B, every layer
  listed with checksums) -- a sparse 147 GB file, no row read.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import numpy as np
import xxhash

from tierstore import Pack, PackWriter


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def bench_write_verify(d: str, total_mib: int, slot: int) -> dict:
    E = 16
    n_layers = max(1, (total_mib << 20) // (E * slot))
    rows = np.random.default_rng(0).integers(1, 256, size=(E, slot), dtype=np.uint8)
    nbytes = n_layers * E * slot

    raw = os.path.join(d, "raw.bin")
    fd = os.open(raw, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    stride = -(-slot // 4096) * 4096
    os.ftruncate(fd, n_layers * E * stride)
    t = time.perf_counter()
    for layer in range(n_layers):
        for e in range(E):
            os.pwrite(fd, memoryview(rows[e]), (layer * E + e) * stride)
        os.fdatasync(fd)
    t_raw_write = time.perf_counter() - t

    t = time.perf_counter()
    with PackWriter(d, tag="fp4", n_layers=n_layers, n_experts=E, slot_bytes=slot, ckpt_id="bench") as w:
        for layer in range(n_layers):
            w.write_layer(layer, rows)
        path = w.path
    t_write = time.perf_counter() - t

    buf = np.empty(64 << 20, np.uint8)
    for _ in range(2):  # second pass: page cache warm
        t = time.perf_counter()
        off = 0
        size = n_layers * E * stride
        while off < size:
            n = os.preadv(fd, [memoryview(buf)[: min(len(buf), size - off)]], off)
            off += n
        t_raw_read = time.perf_counter() - t
    os.close(fd)
    t = time.perf_counter()
    for e in range(E):
        xxhash.xxh3_64_intdigest(memoryview(rows[e]))
    t_hash = (time.perf_counter() - t) * n_layers
    with Pack.open(path) as p:
        p.verify()  # warm
        t = time.perf_counter()
        p.verify()
        t_verify = time.perf_counter() - t
    return {
        "bytes": nbytes,
        "layers": n_layers,
        "E": E,
        "slot": slot,
        "write": _gbps(nbytes, t_write),
        "raw_write": _gbps(nbytes, t_raw_write),
        "verify": _gbps(nbytes, t_verify),
        "raw_read": _gbps(nbytes, t_raw_read),
        "hash_mem": _gbps(nbytes, t_hash),
    }


def bench_open_ds4(d: str) -> dict:
    import json

    from tierstore.format.sidecar import PackName, key20_of

    L, E, slot = 43, 256, 13_369_344
    rng = np.random.default_rng(1)
    side = {
        "version": 2,
        "tag": "fp4",
        "E": E,
        "n_layers": L,
        "slot_bytes": slot,
        "stride": slot,
        "ckpt_id": "ds4",
        "zero_mode": "none",
        "quantizer_abi": "x",
        "layers": list(range(L)),
        "checksum": "xxh3_64",
        "checksums": {str(l): [int(v) for v in rng.integers(0, 2**63, E)] for l in range(L)},
    }
    stem = PackName("fp4", key20_of(side), 0, 1, None).filename()[: -len(".pack")]
    with open(os.path.join(d, stem + ".pack"), "wb") as f:
        f.truncate(L * E * slot)
    with open(os.path.join(d, stem + ".json"), "w") as f:
        json.dump(side, f, sort_keys=True)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        Pack.open(os.path.join(d, stem + ".pack")).close()
        times.append(time.perf_counter() - t)
    return {
        "open_ms_median": 1e3 * float(np.median(times)),
        "sidecar_bytes": os.path.getsize(os.path.join(d, stem + ".json")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--slot", type=int, default=13_369_344)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        wv = bench_write_verify(d, a.mib, a.slot)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        op = bench_open_ds4(d)
    print(f"machine: {platform.node()} {os.cpu_count()} cores, {platform.platform()}")
    print(f"pack {wv['layers']} layers x {wv['E']} experts x {wv['slot']} B = {wv['bytes'] / 1e9:.2f} GB")
    print(
        f"write   PackWriter {wv['write']:.2f} GB/s   raw pwrite+fdatasync {wv['raw_write']:.2f} GB/s"
        f"   ratio {wv['write'] / wv['raw_write']:.2f}"
    )
    print(
        f"verify  Pack.verify {wv['verify']:.2f} GB/s   raw pread (cached) {wv['raw_read']:.2f} GB/s"
        f"   xxh3 in memory {wv['hash_mem']:.2f} GB/s"
        f"   ratio to min {wv['verify'] / min(wv['raw_read'], wv['hash_mem']):.2f}"
    )
    print(f"open    DS4 geometry, {op['sidecar_bytes']} B sidecar: {op['open_ms_median']:.2f} ms median")


if __name__ == "__main__":
    main()
