"""`tierstore pack build | inspect | verify` through cli.main: exit codes, one-line
errors, nothing half-written."""

from __future__ import annotations

import json
import os

import pytest

from tierstore.cli import main
from tierstore.testing.packs import make_random_pack


def _run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_synthetic_build_then_verify_and_inspect(tmp_path, capsys):
    rc, out, err = _run(capsys, "pack", "build", "--synthetic", "4,16,65536", str(tmp_path / "out"))
    assert rc == 0, err
    path = out.strip()
    assert path.endswith(".pack") and os.path.isfile(path) and "opaque" in err
    rc, out, _ = _run(capsys, "pack", "verify", path)
    assert rc == 0 and "ok, 64 rows" in out
    rc, out, _ = _run(capsys, "pack", "inspect", str(tmp_path / "out"), "--json")
    d = json.loads(out)
    assert {
        k: d[k] for k in ("tag", "n_layers", "n_experts", "slot_bytes", "stride", "layers", "format")
    } == {
        "tag": "fp4",
        "n_layers": 4,
        "n_experts": 16,
        "slot_bytes": 65536,
        "stride": 65536,
        "layers": [0, 1, 2, 3],
        "format": "mxfp4",
    }
    assert d["key20"] == d["key20_in_name"] and d["checksum"] == "xxh3_64"
    assert d["layout"]["kind"] == "opaque" and "no (H, I) fits" in d["layout_note"]
    assert d["identity"]["E"] == 16 and d["container"] == "tierstore"


def test_synthetic_build_with_fitting_slot_records_expert_shape(tmp_path, capsys):
    rc, out, err = _run(
        capsys, "pack", "build", "--synthetic", "2,4,6528", "--format", "nvfp4", str(tmp_path)
    )
    assert rc == 0, err
    rc, text, _ = _run(capsys, "pack", "inspect", out.strip())
    assert rc == 0 and "fp4 linear (H=64, I=64)" in text and "w13.q" in text
    assert "from-nvfp4" in text


def test_inspect_text_lists_written_layer_ranges(tmp_path, capsys):
    make_random_pack(tmp_path, 6, 2, 4096, layers=[0, 1, 2, 4]).close()
    rc, out, _ = _run(capsys, "pack", "inspect", str(tmp_path))
    assert rc == 0 and "layers written 4/6: 0-2,4" in out and "checksum xxh3_64" in out


def test_verify_of_corrupt_row_exits_1_naming_layer_expert_offset(tmp_path, capsys):
    with make_random_pack(tmp_path, 2, 3, 5000) as p:
        off = p.row_offset(1, 2)
        path = p.path
    with open(path, "r+b") as f:
        f.seek(off + 4999)
        f.write(b"\x00")
    before = open(path, "rb").read()
    rc, out, err = _run(capsys, "pack", "verify", path)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1
    assert f"layer 1 expert 2 at offset {off:#x}: xxh3_64" in err and path in err
    assert open(path, "rb").read() == before


@pytest.mark.parametrize(
    "argv, pattern, code",
    [
        (["pack", "build", "--synthetic", "4,16", "X"], "expected three integers L,E,SLOT", 2),
        (["pack", "build", "--synthetic", "0,16,4096", "X"], "expected L,E,SLOT >= 1", 2),
        (["pack", "build", "--synthetic", "1,1,10", "X"], "too small for one MXFP4 block", 1),
        (["pack", "build", "--from-safetensors", "NOPE", "X"], "NOPE: no such directory", 2),
        (["pack", "inspect", "missing.rank0of1.pack"], "missing.rank0of1.pack: no such pack", 2),
        (["pack", "verify", "junk.pack"], "junk.pack: no such pack", 2),
    ],
)
def test_bad_input_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch, argv, pattern, code):
    monkeypatch.chdir(tmp_path)
    rc, out, err = _run(capsys, *argv)
    assert rc == code and pattern in err and err.count("\n") == 1 and "Traceback" not in err
    assert not os.path.exists(tmp_path / "X") or not os.listdir(tmp_path / "X")


def test_inspect_of_dir_with_two_candidates_lists_both(tmp_path, capsys):
    make_random_pack(tmp_path, 1, 2, 4096, seed=1).close()
    make_random_pack(tmp_path, 1, 2, 4096, seed=2).close()
    rc, _, err = _run(capsys, "pack", "inspect", str(tmp_path))
    assert rc == 1 and "2 candidate packs" in err and err.count(".pack") >= 2


def test_rebuild_into_same_dir_resumes_and_gives_same_bytes(tmp_path, capsys):
    _, first, _ = _run(capsys, "pack", "build", "--synthetic", "2,2,8192", str(tmp_path))
    data = open(first.strip(), "rb").read()
    _, second, _ = _run(capsys, "pack", "build", "--synthetic", "2,2,8192", str(tmp_path))
    assert second == first and open(second.strip(), "rb").read() == data
