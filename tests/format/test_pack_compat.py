"""Packs laid out exactly as vLLM-Moet writes them, built here from COMPAT.md facts
alone (hashlib + json + os, no tierstore helpers), must open with the right geometry."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from tierstore import FormatError, Pack

ABI = "tsym4-e8m0-fragmajor-a32-v2"


def _moet_pack(
    d,
    *,
    tag="base",
    n_layers=4,
    E=6,
    slot_bytes=7000,
    ckpt="ds4-flash",
    layers=(0, 2),
    rank=0,
    world=1,
    pp=None,
    old_name=False,
    extra=None,
):
    """Write a vLLM-Moet pack: sparse file, rows of layers listed, sorted-key sidecar."""
    stride = (slot_bytes + 4095) // 4096 * 4096
    ident = {
        "ckpt_id": ckpt,
        "zero_mode": "none",
        "quantizer_abi": ABI,
        "tag": tag,
        "n_layers": n_layers,
        "E": E,
        "slot_bytes": slot_bytes,
        "stride": stride,
    }
    key20 = hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:20]
    pp_part = f".pp{pp[0]}of{pp[1]}" if pp else ""
    stem = f"{tag}.rank{rank}of{world}" if old_name else f"{tag}.v2.{key20}.rank{rank}of{world}{pp_part}"
    path = os.path.join(d, stem + ".pack")
    rows = {}
    with open(path, "wb") as f:
        f.truncate(n_layers * E * stride)
        for li in layers:
            for ei in range(E):
                row = np.full(slot_bytes, (li * E + ei) % 251 + 1, np.uint8)
                f.seek((li * E + ei) * stride)
                f.write(row.tobytes())
                rows[li, ei] = row
    side = dict(ident, version=2, layers=sorted(layers), **(extra or {}))
    with open(os.path.join(d, stem + ".json"), "w") as f:
        json.dump(side, f, sort_keys=True)
    open(os.path.join(d, stem + ".lock"), "w").close()
    return path, key20, rows


def test_v2_named_moet_pack_opens_with_geometry_and_rows(tmp_path):
    path, key20, rows = _moet_pack(tmp_path)
    with Pack.open(path) as p:
        assert (p.tag, p.n_layers, p.n_experts, p.slot_bytes, p.stride) == ("base", 4, 6, 7000, 8192)
        assert p.layers == (0, 2) and p.key20 == key20 and p.ckpt_id == "ds4-flash"
        assert p.layout is None and p.checksum_algo is None
        assert p.identity["quantizer_abi"] == ABI
        assert np.array_equal(p.read_row(2, 5), rows[2, 5])
        assert p.row_offset(2, 5) == (2 * 6 + 5) * 8192
        with pytest.raises(FormatError, match="layer 1 is not written"):
            p.read_row(1, 0)
        report = p.verify()
        assert report.rows_checked == 0 and report.rows_unchecked == 2 * 6


def test_old_named_moet_pack_opens(tmp_path):
    path, _, rows = _moet_pack(tmp_path, tag="fp4", old_name=True, layers=(3,))
    assert os.path.basename(path) == "fp4.rank0of1.pack"
    with Pack.open(tmp_path, tag="fp4") as p:
        assert p.path == path and p.layers == (3,) and p.name.key20 is None
        assert np.array_equal(p.read_row(3, 0), rows[3, 0])


def test_pipeline_parallel_name_selects_by_pp(tmp_path):
    a, _, _ = _moet_pack(tmp_path, rank=1, world=2, pp=(0, 2))
    b, _, _ = _moet_pack(tmp_path, rank=1, world=2, pp=(1, 2), n_layers=3)
    with Pack.open(tmp_path, tag="base", rank=1, world=2, pp=(1, 2)) as p:
        assert p.path == b and p.n_layers == 3 and p.name.pp == (1, 2)
    with Pack.open(tmp_path, tag="base", rank=1, world=2, pp=(0, 2)) as p:
        assert p.path == a


def test_key20_of_another_checkpoint_is_refused(tmp_path):
    path, key20, _ = _moet_pack(tmp_path)
    side = path[:-5] + ".json"
    data = json.load(open(side))
    data["ckpt_id"] = "glm-5.2"  # same geometry, other checkpoint
    json.dump(data, open(side, "w"), sort_keys=True)
    with pytest.raises(
        FormatError,
        match=rf"key20 in the name is {key20}, the sidecar's "
        "identity hashes to",
    ):
        Pack.open(path)


def test_unknown_moet_field_tolerated_only_when_key20_proves_identity(tmp_path):
    os.makedirs(tmp_path / "a")
    path, _, _ = _moet_pack(tmp_path / "a", extra={"built_by": "moet-0.9"})
    with pytest.warns(UserWarning, match=r"ignoring unknown vLLM-Moet sidecar fields \['built_by'\]"):
        with Pack.open(path) as p:
            assert p.unknown_fields == ["built_by"]
    os.makedirs(tmp_path / "b")
    old, _, _ = _moet_pack(tmp_path / "b", old_name=True, extra={"built_by": "moet-0.9"})
    with pytest.raises(
        FormatError, match="unknown field `built_by` in a sidecar whose name carries no key20"
    ):
        Pack.open(old)


def test_two_candidates_old_and_v2_for_one_tag_rank_is_an_error_listing_both(tmp_path):
    _moet_pack(tmp_path, old_name=True)
    _moet_pack(tmp_path)
    with pytest.raises(FormatError) as ei:
        Pack.open(tmp_path, tag="base")
    msg = str(ei.value)
    assert "2 candidate packs" in msg and "base.rank0of1.pack" in msg and "base.v2." in msg


def test_moet_ds4_geometry_is_accepted_without_reading_rows(tmp_path):
    # 43 layers x 256 experts x 13,369,344 B: a 147 GB sparse file, nothing written
    path, _, _ = _moet_pack(tmp_path, tag="fp4", n_layers=43, E=256, slot_bytes=13_369_344, layers=())
    with Pack.open(path) as p:
        assert p.stride == 13_369_344 and p.file_bytes == 43 * 256 * 13_369_344
        assert not p.written.any()
