"""One test per rejection reason, with hand-built sidecar bytes; every error names the
file and the field, and a failed open changes nothing on disk."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from tierstore import FormatError, Pack
from tierstore.format.sidecar import SIDECAR_MAX_BYTES
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 2, 3, 100  # stride 4096


@pytest.fixture
def pack_files(tmp_path):
    """A valid tierstore pack (old-style name, so the sidecar can change without the
    key20 check hiding the reason under test) -> (pack path, sidecar path, sidecar dict)."""
    with make_random_pack(tmp_path / "src", L, E, SLOT) as p:
        side = json.load(open(p.sidecar_path))
        data = open(p.path, "rb").read()
    path = tmp_path / "fp4.rank0of1.pack"
    path.write_bytes(data)
    sidecar = tmp_path / "fp4.rank0of1.json"
    sidecar.write_text(json.dumps(side))
    return str(path), sidecar, side


def _snapshot(d):
    return {
        n: (
            os.path.getsize(os.path.join(d, n)),
            hashlib.sha256(open(os.path.join(d, n), "rb").read()).hexdigest(),
        )
        for n in sorted(os.listdir(d))
        if os.path.isfile(os.path.join(d, n))
    }


def _expect_reject(path, pattern):
    d = os.path.dirname(path)
    before = _snapshot(d)
    with pytest.raises(FormatError, match=pattern) as ei:
        Pack.open(path)
    assert "\n" not in str(ei.value)
    assert _snapshot(d) == before
    return str(ei.value)


def test_valid_fixture_opens(pack_files):
    with Pack.open(pack_files[0]) as p:
        assert p.checksum_algo == "xxh3_64" and p.layers == (0, 1)


def test_sidecar_over_size_cap_rejected_before_parsing(pack_files):
    path, sidecar, _ = pack_files
    with open(sidecar, "r+b") as f:
        f.truncate(SIDECAR_MAX_BYTES + 1)  # sparse; never parsed
    _expect_reject(path, rf"fp4.rank0of1.json: sidecar is {SIDECAR_MAX_BYTES + 1} bytes, larger than")


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"", "not valid JSON"),
        (b'{"E": 3,', "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b'{"E": NaN}', "non-JSON number NaN"),
        (b'{"E": 3, "E": 4}', "duplicate key 'E'"),
        (b"[1, 2]", "must be a JSON object, found list"),
    ],
)
def test_non_json_sidecar_names_the_file(pack_files, raw, why):
    path, sidecar, _ = pack_files
    sidecar.write_bytes(raw)
    _expect_reject(path, rf"fp4\.rank0of1\.json: .*{why}")


@pytest.mark.parametrize(
    "field",
    [
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
    ],
)
def test_missing_field_is_named(pack_files, field):
    path, sidecar, side = pack_files
    del side[field]
    sidecar.write_text(json.dumps(side))
    _expect_reject(path, rf"\.json: sidecar field error: Object missing required field `{field}`")


def test_extra_field_in_tierstore_sidecar_is_named(pack_files):
    path, sidecar, side = pack_files
    side["colour"] = "blue"
    sidecar.write_text(json.dumps(side))
    _expect_reject(path, r"\.json: sidecar field error: Object contains unknown field `colour`")


@pytest.mark.parametrize(
    "field, value, found",
    [
        ("E", "3", "str"),
        ("E", True, "bool"),
        ("E", 3.0, "float"),
        ("layers", [0, "1"], "str"),
        ("ckpt_id", 5, "int"),
        ("layers", 0, "int"),
        ("checksums", [], "array"),
    ],
)
def test_wrong_typed_field_is_named(pack_files, field, value, found):
    path, sidecar, side = pack_files
    side[field] = value
    sidecar.write_text(json.dumps(side))
    _expect_reject(path, rf"got `{found}` - at `\$\.{field}")


@pytest.mark.parametrize(
    "field, value, pattern",
    [
        ("version", 1, r"field `version`: expected 2, found 1"),
        ("E", 0, r"field `E`: expected > 0, found 0"),
        ("n_layers", -1, r"field `n_layers`: expected > 0, found -1"),
        ("slot_bytes", 0, r"field `slot_bytes`: expected > 0"),
        ("stride", 100, r"field `stride`: expected 4096 \(slot_bytes 100 rounded up to 4096\), found 100"),
        ("stride", 8192, r"field `stride`: expected 4096"),
        ("layers", [0, 0], r"field `layers`: duplicate layer 0 at index 1"),
        ("layers", [1, 0], r"field `layers`: unsorted layer 0 at index 1"),
        ("layers", [0, 2], r"field `layers`: layer 2 out of range \[0, 2\)"),
        ("layers", [-1], r"field `layers`: layer -1 out of range"),
        ("tag", "base", r"sidecar tag 'base' does not match the name's tag 'fp4'"),
        ("tag", "a/b", r"field `tag`: 'a/b' is not a valid tag"),
        ("n_layers", 1 << 40, r"field `n_layers`: 1099511627776 is over the cap 65536"),
        ("slot_bytes", 1 << 40, r"field `slot_bytes`: 1099511627776 is over the cap"),
        ("checksum", "crc32", r"field `checksum`: unknown algorithm 'crc32'"),
    ],
)
def test_out_of_range_field_is_named(pack_files, field, value, pattern):
    path, sidecar, side = pack_files
    side[field] = value
    sidecar.write_text(json.dumps(side))
    msg = _expect_reject(path, pattern)
    assert "fp4.rank0of1" in msg


def test_checksums_must_cover_exactly_the_written_layers(pack_files):
    path, sidecar, side = pack_files
    side["checksums"].pop("1")
    sidecar.write_text(json.dumps(side))
    _expect_reject(path, r"field `checksums`: layers \[0\] do not match `layers` \(differ at \[1\]\)")


def test_checksum_list_of_wrong_length_is_named(pack_files):
    path, sidecar, side = pack_files
    side["checksums"]["0"] = side["checksums"]["0"][:2]
    sidecar.write_text(json.dumps(side))
    _expect_reject(path, r"field `checksums`: layer 0 has 2 entries, expected 3")


def test_checksum_value_over_64_bits_is_rejected(pack_files):
    path, sidecar, side = pack_files
    side["checksums"]["0"][1] = 1 << 64
    sidecar.write_text(json.dumps(side))
    _expect_reject(path, r"checksums")


def test_checksums_without_algorithm_are_rejected(pack_files):
    path, sidecar, side = pack_files
    del side["checksum"]
    sidecar.write_text(json.dumps(side))
    _expect_reject(path, r"field `checksums` given without field `checksum`")


def _with_layout(side, sections, order="linear"):
    side["layout"] = {"kind": "fp4", "order": order, "sections": sections}
    return side


def _sec(name, offset, nbytes, dtype="uint8", shape=None):
    return {
        "name": name,
        "offset": offset,
        "bytes": nbytes,
        "dtype": dtype,
        "shape": shape or [nbytes],
        "codec": "raw",
    }


@pytest.mark.parametrize(
    "sections, order, pattern",
    [
        (
            [_sec("a", 0, 60), _sec("b", 50, 40)],
            "linear",
            r"section `b` at offset 50 overlaps `a` ending at 60",
        ),
        (
            [_sec("a", 0, 60), _sec("b", 60, 41)],
            "linear",
            r"section `b`: \[60, 101\) is outside the 100-byte row",
        ),
        ([_sec("a", -4, 4)], "linear", r"outside"),
        (
            [_sec("a", 0, 10, "float32", [2])],
            "linear",
            r"section `a`: bytes 10, expected 8 for float32 \[2\]",
        ),
        ([_sec("a", 0, 10, "complex64", [10])], "linear", r"unknown dtype 'complex64'"),
        ([_sec("a", 0, 0, "uint8", [0])], "linear", r"non-positive dimension"),
        ([_sec("a", 0, 10), _sec("a", 10, 10)], "linear", r"section `a` appears twice"),
        ([], "linear", r"layout: no sections"),
        ([_sec("a", 0, 10)], "zigzag", r"Expected `str` matching one of|zigzag"),
    ],
)
def test_bad_layout_is_named(pack_files, sections, order, pattern):
    path, sidecar, side = pack_files
    sidecar.write_text(json.dumps(_with_layout(side, sections, order)))
    _expect_reject(path, pattern)


def test_extra_field_in_layout_section_is_named(pack_files):
    path, sidecar, side = pack_files
    sec = dict(_sec("a", 0, 10), align=16)
    sidecar.write_text(json.dumps(_with_layout(side, [sec])))
    _expect_reject(path, r"unknown field `align` - at `\$\.layout\.sections\[0\]`")


@pytest.mark.parametrize("size_delta", [-4096, -1, 1, 4096])
def test_wrong_file_size_names_expected_and_found(pack_files, size_delta):
    path, _, _ = pack_files
    want = L * E * 4096
    with open(path, "r+b") as f:
        f.truncate(want + size_delta)
    _expect_reject(
        path,
        rf"fp4\.rank0of1\.pack: file size {want + size_delta} bytes, "
        rf"expected {want} \(2 layers x 3 experts x stride 4096\)",
    )


def test_missing_pack_file_with_sidecar_is_a_format_error(pack_files):
    path, _, _ = pack_files
    os.unlink(path)
    _expect_reject(path, r"pack file is missing \(sidecar fp4\.rank0of1\.json exists\)")


def test_missing_sidecar_is_a_format_error(pack_files):
    path, sidecar, _ = pack_files
    os.unlink(sidecar)
    _expect_reject(path, r"fp4\.rank0of1\.json: sidecar is missing")


@pytest.mark.parametrize(
    "name",
    [
        "fp4.pack",
        "fp4.rank2of2.pack",
        "fp4.v2.XYZ.rank0of1.pack",
        "fp4.rank0of1.pp3of2.pack",
        "fp4.rank0of0.pack",
    ],
)
def test_bad_pack_name_is_rejected(tmp_path, name):
    (tmp_path / name).write_bytes(b"")
    with pytest.raises(FormatError, match=rf"{name}: (not a pack name|rank/pipeline index)"):
        Pack.open(tmp_path / name)


def test_verify_names_layer_expert_offset_of_first_bad_row(pack_files):
    path, _, _ = pack_files
    off = (1 * E + 2) * 4096 + 17
    with open(path, "r+b") as f:
        f.seek(off)
        b = f.read(1)
        f.seek(off)
        f.write(bytes([b[0] ^ 0x40]))
    with Pack.open(path) as p:  # open does not read rows: still opens
        with pytest.raises(
            FormatError,
            match=rf"fp4\.rank0of1\.pack: layer 1 expert 2 at offset "
            rf"{(1 * E + 2) * 4096:#x}: xxh3_64 0x[0-9a-f]{{16}}, "
            r"expected 0x[0-9a-f]{16}",
        ):
            p.verify()
        assert p.read_row(1, 1) is not None  # other rows still readable


def test_verify_ignores_padding_beyond_slot_bytes(pack_files):
    path, _, _ = pack_files
    with open(path, "r+b") as f:
        f.seek(4096 - 1)  # padding of row (0, 0)
        f.write(b"\x01")
    with Pack.open(path) as p:
        assert p.verify().rows_checked == L * E


# -- the error names the path the caller gave (a sidecar given: not the .pack it implies) --
def test_a_sidecar_given_whose_pack_is_short_is_named_as_given(pack_files):
    path, sidecar, _ = pack_files
    os.truncate(path, 5000)
    with pytest.raises(FormatError) as e:
        Pack.open(str(sidecar))
    assert str(e.value).startswith(f"{sidecar}: its pack fp4.rank0of1.pack: file size 5000 bytes")


def test_a_sidecar_given_whose_pack_is_gone_is_named_as_given(pack_files):
    path, sidecar, _ = pack_files
    os.unlink(path)
    with pytest.raises(FormatError, match=r"a sidecar whose pack file fp4\.rank0of1\.pack is missing") as e:
        Pack.open(str(sidecar))
    assert str(e.value).startswith(f"{sidecar}: ")


@pytest.mark.parametrize("name", ["warm.poolmon.json", "x.json", "fp4.json"])
def test_a_json_that_is_no_sidecar_is_named_as_given(tmp_path, name):
    (tmp_path / name).write_text("{}")
    with pytest.raises(FormatError, match=r": not a pack's sidecar; expected") as e:
        Pack.open(str(tmp_path / name))
    assert str(e.value).startswith(f"{tmp_path / name}: ")


def test_a_pack_given_whose_sidecar_is_bad_is_named_as_given(pack_files):
    path, sidecar, _ = pack_files
    sidecar.write_bytes(b"garbage")
    with pytest.raises(FormatError) as e:
        Pack.open(path)
    assert str(e.value).startswith(f"{path}: its sidecar fp4.rank0of1.json: sidecar is not valid JSON")


def test_an_io_error_renamed_for_the_given_path_keeps_its_path_offset_and_errno(pack_files, monkeypatch):
    import errno as errno_

    from tierstore import TierIOError
    from tierstore.format import pack as pack_mod

    path, sidecar, _ = pack_files

    def refuse(p, what="file"):
        raise TierIOError(p, 0, errno_.EACCES, what="open")

    monkeypatch.setattr(pack_mod, "open_regular", refuse)
    with pytest.raises(TierIOError) as e:
        Pack.open(str(sidecar))
    assert (e.value.path, e.value.offset, e.value.errno) == (path, 0, errno_.EACCES)
    assert str(e.value) == (
        f"{sidecar}: its pack fp4.rank0of1.pack: open at offset 0x0 failed: EACCES (Permission denied)"
    )
