"""Pack reader and PackWriter on real files: geometry, rows, holes, resume, locking."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from tierstore import ConfigError, FormatError, Pack, PackWriter
from tierstore.format.sidecar import key20_of
from tierstore.format.writer import PackBusyError, PackReplacedError
from tierstore.testing.packs import make_random_pack, random_layer_rows

L, E, SLOT = 3, 8, 5000  # SLOT not page-aligned: stride 8192


def _writer(tmp_path, **kw):
    args = dict(tag="fp4", n_layers=L, n_experts=E, slot_bytes=SLOT, ckpt_id="ck")
    args.update(kw)
    return PackWriter(tmp_path, **args)


def test_random_pack_geometry_and_rows_match_generator(tmp_path):
    with make_random_pack(tmp_path, L, E, SLOT, seed=7) as p:
        assert (p.tag, p.n_layers, p.n_experts, p.slot_bytes, p.stride) == ("fp4", L, E, SLOT, 8192)
        assert p.layers == (0, 1, 2) and p.written.all()
        assert os.path.getsize(p.path) == L * E * 8192
        assert p.key20 == os.path.basename(p.path).split(".")[2] == key20_of(p.identity)
        for layer in range(L):
            want = random_layer_rows(7, layer, E, SLOT)
            assert (want != 0).all()
            for e in (0, E - 1):
                assert np.array_equal(p.read_row(layer, e), want[e])
                assert p.row_offset(layer, e) == (layer * E + e) * 8192
        assert p.verify().rows_checked == L * E


def test_unwritten_layer_is_a_hole_and_never_read(tmp_path):
    with make_random_pack(tmp_path, L, E, SLOT, layers=[1]) as p:
        assert p.layers == (1,) and list(p.written) == [False, True, False]
        with pytest.raises(FormatError, match=r"layer 0 is not written in .*\.pack"):
            p.read_row(0, 3)
        with pytest.raises(FormatError, match="layer 2 is not written"):
            p.check_keys(np.array([[1, 0], [2, 5]]))
        assert p.row_checksum(0, 0) is None and p.row_checksum(1, 0) is not None
        # sparse: only one layer's blocks are allocated (allow filesystem slack)
        assert os.stat(p.path).st_blocks * 512 <= 2 * E * 8192


def test_check_keys_returns_dense_ids_and_rejects_out_of_range(tmp_path):
    with make_random_pack(tmp_path, L, E, SLOT) as p:
        keys = np.array([[0, 0], [2, 7], [1, 3]])
        ids = p.check_keys(keys)
        assert ids.dtype == np.int64 and list(ids) == [0, 2 * E + 7, E + 3]
        assert list(p.row_offsets(ids)) == [0, (2 * E + 7) * 8192, (E + 3) * 8192]
        with pytest.raises(ConfigError, match=r"key 1 \(layer 0, expert 8\) out of range"):
            p.check_keys([[0, 0], [0, E]])
        with pytest.raises(ConfigError, match="layer 3"):
            p.check_keys([[L, 0]])
        assert p.check_keys(np.zeros((0, 2), np.int64)).shape == (0,)


def test_open_by_directory_and_sidecar_path(tmp_path):
    make_random_pack(tmp_path, L, E, SLOT).close()
    with Pack.open(tmp_path, tag="fp4") as p:
        assert p.n_layers == L
    with Pack.open(p.sidecar_path) as q:
        assert q.path == p.path
    with pytest.raises(FormatError, match="no pack named base"):
        Pack.open(tmp_path, tag="base")
    with pytest.raises(FormatError, match="rank1of2"):
        Pack.open(tmp_path, tag="fp4", rank=1, world=2)


def test_resume_keeps_written_layers_and_adds_new_ones(tmp_path):
    with _writer(tmp_path) as w:
        w.write_layer(0, random_layer_rows(0, 0, E, SLOT))
    with _writer(tmp_path) as w:
        assert w.written_layers == (0,)
        w.write_layer(2, random_layer_rows(0, 2, E, SLOT))
        path = w.path
    with Pack.open(path) as p:
        assert p.layers == (0, 2)
        assert np.array_equal(p.read_row(0, 1), random_layer_rows(0, 0, E, SLOT)[1])
        p.verify()


def test_rewrite_of_a_layer_replaces_its_rows_and_checksums(tmp_path):
    with _writer(tmp_path) as w:
        w.write_layer(1, random_layer_rows(0, 1, E, SLOT))
        w.write_layer(1, random_layer_rows(9, 1, E, SLOT))
        path = w.path
    with Pack.open(path) as p:
        assert p.layers == (1,)
        assert np.array_equal(p.read_row(1, 4), random_layer_rows(9, 1, E, SLOT)[4])
        p.verify()


def test_resume_with_other_identity_names_the_differing_field(tmp_path):
    # a v2 name changes with the identity; an old-style name does not, so it must be checked
    path = tmp_path / "fp4.rank0of1.pack"
    _writer(path).close()
    with pytest.raises(ConfigError, match=r"cannot resume \(ckpt_id: existing 'ck', new 'other'"):
        _writer(path, ckpt_id="other")
    with pytest.raises(
        ConfigError, match=r"n_layers: existing 3, new 4; slot_bytes: existing 5000, new 9000"
    ):
        _writer(path, n_layers=4, slot_bytes=9000)


def test_other_identity_in_a_directory_gets_its_own_v2_name(tmp_path):
    with _writer(tmp_path) as a, _writer(tmp_path, ckpt_id="other") as b:
        assert a.path != b.path and a.key20 != b.key20
    with pytest.raises(FormatError, match="2 candidate packs"):
        Pack.open(tmp_path, tag="fp4")


def test_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    with _writer(tmp_path):
        with pytest.raises(PackBusyError, match=r"\.lock: another writer holds"):
            _writer(tmp_path)
    _writer(tmp_path).close()  # released on close


def test_writer_refuses_to_write_through_a_replaced_file(tmp_path):
    with _writer(tmp_path) as w:
        w.write_layer(0, random_layer_rows(0, 0, E, SLOT))
        os.rename(w.path, w.path + ".old")
        with open(w.path, "wb") as f:  # someone puts another file at the path
            f.truncate(L * E * 8192)
        with pytest.raises(PackReplacedError, match="replaced or removed"):
            w.write_layer(1, random_layer_rows(0, 1, E, SLOT))
        with open(w.sidecar_path) as f:
            assert '"layers":[0]' in f.read()


def test_failed_write_leaves_sidecar_unchanged(tmp_path, monkeypatch):
    with _writer(tmp_path) as w:
        w.write_layer(0, random_layer_rows(0, 0, E, SLOT))
        before = open(w.sidecar_path, "rb").read()
        calls = {"n": 0}
        real = os.pwrite

        def failing_pwrite(fd, data, off):
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, data, off)

        monkeypatch.setattr(os, "pwrite", failing_pwrite)
        with pytest.raises(OSError, match=r"write at offset 0x\w+ failed: ENOSPC"):
            w.write_layer(2, random_layer_rows(0, 2, E, SLOT))
        assert open(w.sidecar_path, "rb").read() == before
        monkeypatch.setattr(os, "pwrite", real)
        assert w.written_layers == (0,)


def test_short_writes_are_continued(tmp_path, monkeypatch):
    real = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, off: real(fd, bytes(data)[:1000], off))
    with _writer(tmp_path) as w:
        w.write_layer(1, random_layer_rows(0, 1, E, SLOT))
        path = w.path
    monkeypatch.setattr(os, "pwrite", real)
    with Pack.open(path) as p:
        p.verify()


def test_write_layer_rejects_wrong_shape_dtype_and_layer(tmp_path):
    with _writer(tmp_path) as w:
        with pytest.raises(ConfigError, match=r"rows must be uint8 \[8, 5000\], found int16"):
            w.write_layer(0, np.zeros((E, SLOT), np.int16))
        with pytest.raises(ConfigError, match=r"found uint8 \[8, 4999\]"):
            w.write_layer(0, np.zeros((E, SLOT - 1), np.uint8))
        with pytest.raises(ConfigError, match="layer 3 out of range"):
            w.write_layer(L, np.zeros((E, SLOT), np.uint8))


def test_writer_accepts_torch_rows(tmp_path):
    torch = pytest.importorskip("torch")
    rows = torch.from_numpy(random_layer_rows(3, 0, E, SLOT))
    with _writer(tmp_path) as w:
        w.write_layer(0, rows)
        with w.open_pack() as p:
            assert np.array_equal(p.read_row(0, 2), rows[2].numpy())


def test_writer_rejects_bad_arguments_with_config_error(tmp_path):
    with pytest.raises(ConfigError, match="n_experts must be an integer >= 1 and <= 65536, found 0"):
        _writer(tmp_path, n_experts=0)
    for name, bad in (
        ("n_layers", float("nan")),
        ("n_layers", 1.5),
        ("slot_bytes", float("inf")),
        ("n_experts", "8"),
        ("rank", -1),
        ("world", 0),
    ):
        with pytest.raises(ConfigError, match=f"{name} must be an integer"):  # one validation
            _writer(tmp_path, **{name: bad})
    assert not os.listdir(tmp_path) or all(not f.endswith(".pack") for f in os.listdir(tmp_path))
    with pytest.raises(ConfigError, match="not a valid tag"):
        _writer(tmp_path, tag="a.b")
    with pytest.raises(ConfigError, match="key20 in the name"):
        PackWriter(
            tmp_path / "fp4.v2.00000000000000000000.rank0of1.pack",
            tag="fp4",
            n_layers=L,
            n_experts=E,
            slot_bytes=SLOT,
            ckpt_id="ck",
        )
    assert not list(tmp_path.iterdir())


def test_closed_pack_refuses_reads(tmp_path):
    p = make_random_pack(tmp_path, 1, 2, 4096)
    p.close()
    with pytest.raises(Exception, match="closed"):
        p.read_row(0, 0)


def test_file_truncated_after_open_gives_format_error_with_offset(tmp_path):
    with make_random_pack(tmp_path, L, E, SLOT) as p:
        os.truncate(p.path, (2 * E + 3) * 8192 + 100)
        with pytest.raises(
            FormatError,
            match=rf"end of file at offset {(2 * E + 3) * 8192 + 100:#x}"
            r", expected 4900 more bytes \(truncated pack\)",
        ):
            p.read_row(2, 3)
        with pytest.raises(FormatError, match="truncated pack"):
            p.verify()


def test_read_error_becomes_tier_io_error_naming_offset(tmp_path, monkeypatch):
    from tierstore import TierIOError

    def failing_preadv(fd, bufs, off):
        raise OSError(errno.EIO, "Input/output error")

    with make_random_pack(tmp_path, L, E, SLOT) as p:
        monkeypatch.setattr(os, "preadv", failing_preadv)
        with pytest.raises(TierIOError, match=rf"read at offset {(E + 1) * 8192:#x} failed: EIO") as ei:
            p.read_row(1, 1)
        assert ei.value.errno == errno.EIO and ei.value.offset == (E + 1) * 8192


def test_short_reads_are_continued(tmp_path, monkeypatch):
    real = os.preadv

    def short_preadv(fd, bufs, off):
        return real(fd, [bufs[0][:777]], off)

    with make_random_pack(tmp_path, L, E, SLOT, seed=3) as p:
        monkeypatch.setattr(os, "preadv", short_preadv)
        assert np.array_equal(p.read_row(2, 7), random_layer_rows(3, 2, E, SLOT)[7])
        p.verify()


def test_verify_reports_progress_per_layer(tmp_path):
    seen = []
    with make_random_pack(tmp_path, L, E, SLOT, layers=[0, 2]) as p:
        report = p.verify(progress=lambda done, total: seen.append((done, total)))
        assert seen == [(E, 2 * E), (2 * E, 2 * E)]
        assert (report.rows_checked, report.bytes_checked) == (2 * E, 2 * E * SLOT)
        assert p.verify(progress=True).rows_checked == 2 * E  # rich bar, no terminal needed
