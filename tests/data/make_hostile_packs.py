"""Regenerate tests/data/hostile_packs/: one directory per attack, each a tiny pack
(1 layer x 2 experts x 64 B, stride 4096) plus an ``expect.json`` naming the stage
that must fail ("open" or "verify") and a regex the one-line error must match.

    python tests/data/make_hostile_packs.py
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import xxhash

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hostile_packs")
ROW = bytes(range(1, 65))
STRIDE = 4096


def _base():
    side = {
        "version": 2,
        "tag": "fp4",
        "E": 2,
        "n_layers": 1,
        "slot_bytes": 64,
        "stride": STRIDE,
        "ckpt_id": "hostile",
        "zero_mode": "none",
        "quantizer_abi": "tierstore-random-v1",
        "layers": [0],
        "checksum": "xxh3_64",
        "checksums": {"0": [xxhash.xxh3_64_intdigest(ROW)] * 2},
    }
    data = bytearray(2 * STRIDE)
    data[0:64] = ROW
    data[STRIDE : STRIDE + 64] = ROW
    return side, data


def _key20(side):
    ident = {
        k: side[k]
        for k in ("ckpt_id", "zero_mode", "quantizer_abi", "tag", "n_layers", "E", "slot_bytes", "stride")
    }
    return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]


def _write(case, stage, pattern, side=None, data=None, raw_side=None, stem="fp4.rank0of1", extra=()):
    d = os.path.join(HERE, case)
    os.makedirs(d)
    base_side, base_data = _base()
    side = base_side if side is None else side
    with open(os.path.join(d, stem + ".pack"), "wb") as f:
        f.write(base_data if data is None else data)
    with open(os.path.join(d, stem + ".json"), "wb") as f:
        f.write(raw_side if raw_side is not None else json.dumps(side, sort_keys=True).encode())
    for name, content in extra:
        with open(os.path.join(d, name), "wb") as f:
            f.write(content)
    with open(os.path.join(d, "expect.json"), "w") as f:
        json.dump({"stage": stage, "error": pattern}, f, indent=1)
        f.write("\n")


def main():
    shutil.rmtree(HERE, ignore_errors=True)
    side, data = _base()
    _write("truncated", "open", r"file size 6144 bytes, expected 8192", data=data[:6144])
    _write("overlong", "open", r"file size 12288 bytes, expected 8192", data=data + bytes(4096))
    _write("not_json", "open", r"sidecar is not valid JSON", raw_side=b"<html>oops</html>")
    _write(
        "nan_in_json",
        "open",
        r"non-JSON number NaN",
        raw_side=json.dumps(side).replace('"E": 2', '"E": NaN').encode(),
    )
    _write("deep_nesting", "open", r"nested too deeply", raw_side=b"[" * 5000 + b"]" * 5000)
    _write(
        "duplicate_key",
        "open",
        r"duplicate key 'layers'",
        raw_side=json.dumps(side)[:-1].encode() + b', "layers": [0, 0]}',
    )
    _write(
        "duplicate_layers",
        "open",
        r"field `layers`: duplicate layer 0",
        side=dict(side, n_layers=2, layers=[0, 0]),
        data=data + bytes(2 * STRIDE),
    )
    _write(
        "layer_out_of_range",
        "open",
        r"field `layers`: layer 5 out of range \[0, 1\)",
        side=dict(side, layers=[5], checksums={"5": side["checksums"]["0"]}),
    )
    _write(
        "missing_stride",
        "open",
        r"missing required field `stride`",
        side={k: v for k, v in side.items() if k != "stride"},
    )
    _write("extra_field", "open", r"unknown field `exec`", side=dict(side, exec="rm -rf /"))
    _write("string_count", "open", r"Expected `int`, got `str` - at `\$\.E`", side=dict(side, E="2"))
    _write(
        "stride_mismatch",
        "open",
        r"field `stride`: expected 4096 .* found 64",
        side=dict(side, stride=64),
        data=data[:128],
    )
    _write(
        "huge_geometry",
        "open",
        r"field `n_layers`: 4294967296 is over the cap",
        side=dict(side, n_layers=1 << 32),
    )
    _write("negative_experts", "open", r"field `E`: expected > 0, found -2", side=dict(side, E=-2))
    _write(
        "layout_overlap",
        "open",
        r"section `b` at offset 32 overlaps `a` ending at 48",
        side=dict(
            side,
            layout={
                "kind": "fp4",
                "order": "linear",
                "sections": [
                    {"name": "a", "offset": 0, "bytes": 48, "dtype": "uint8", "shape": [48]},
                    {"name": "b", "offset": 32, "bytes": 32, "dtype": "uint8", "shape": [32]},
                ],
            },
        ),
    )
    _write(
        "layout_outside_row",
        "open",
        r"section `a`: \[0, 4096\) is outside the 64-byte row",
        side=dict(
            side,
            layout={
                "kind": "fp4",
                "sections": [{"name": "a", "offset": 0, "bytes": 4096, "dtype": "uint8", "shape": [4096]}],
            },
        ),
    )
    _write(
        "checksums_wrong_length",
        "open",
        r"layer 0 has 1 entries, expected 2",
        side=dict(side, checksums={"0": side["checksums"]["0"][:1]}),
    )
    bad = bytearray(data)
    bad[STRIDE + 10] ^= 0xFF
    _write(
        "corrupt_row",
        "verify",
        r"layer 0 expert 1 at offset 0x1000: xxh3_64 0x[0-9a-f]{16}, "
        r"expected 0x[0-9a-f]{16}",
        data=bytes(bad),
    )
    k = _key20(side)
    other = dict(side, ckpt_id="another-model")
    _write(
        "key20_mismatch",
        "open",
        rf"key20 in the name is {k}, the sidecar's identity hashes",
        side=other,
        stem=f"fp4.v2.{k}.rank0of1",
    )
    v2 = f"fp4.v2.{k}.rank0of1"
    _write(
        "two_candidates",
        "open_dir",
        r"2 candidate packs for fp4\[.v2.<key20>\].rank0of1.pack: "
        rf"fp4.rank0of1.pack, {v2}.pack",
        extra=[(v2 + ".pack", bytes(data)), (v2 + ".json", json.dumps(side).encode())],
    )
    _write(
        "tag_mismatch",
        "open",
        r"sidecar tag 'base' does not match the name's tag 'fp4'",
        side=dict(side, tag="base"),
    )
    _write(
        "unknown_checksum_algo",
        "open",
        r"field `checksum`: unknown algorithm 'md5'",
        side=dict(side, checksum="md5"),
    )


if __name__ == "__main__":
    main()
