"""Hostile I/O faults on the write side (hostile/write_faults.py): every writer against
a failing open / write / fsync / rename / ftruncate / pwrite / fdatasync / makedirs.
A fault is a TierstoreError of one line naming the file (and, for a byte write, the
offset reached); nothing is half-written: no temp file is left, the old file is
intact, a pack lists only layers that verify, and the same write without the fault
then succeeds. A live store whose snapshot failed keeps serving."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil

import numpy as np
import pytest
from store_helpers import assert_store_consistent

import tierstore as ts
from hostile.common import tree_digest
from hostile.syscall_faults import SyscallFault
from hostile.write_faults import ATOMIC, PAYLOAD, PE, PL, PSLOT, write_cases
from tierstore.errors import TierIOError, TierstoreError
from tierstore.files.atomic import (
    TEMP_MARK,
    create_sized_atomic,
    write_atomic,
    write_atomic_async,
    write_atomic_with,
)
from tierstore.format import Pack, PackWriter
from tierstore.testing.packs import make_random_pack
from tierstore.warm import PeriodicSnapshot, snapshot, write_warm_file

RED_TEAM_IO_FAULTS = 800
STRIDE = 4096  # round_up(PSLOT)


def rows(layer: int, version: int) -> np.ndarray:
    rng = np.random.default_rng([version, layer])
    return rng.integers(1, 256, size=(PE, PSLOT), dtype=np.uint8)


def test_the_write_fault_class_counts_and_names():
    cases = write_cases()
    assert len({c.name for c in cases}) == len(cases)
    assert len(cases) > 300


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    pack = make_random_pack(tmp_path_factory.mktemp("wf-store"), 2, 8, 2000, seed=3)
    with ts.ExpertStore(pack, vram_slots=4, device="cpu", threads=1) as s:
        s.release(s.fire([(0, 1), (1, 2)]))
        s.step()
        yield s


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """Pack directories the resume / rewrite cases start from (copied per case)."""
    root = tmp_path_factory.mktemp("wf-templates")
    out = {}
    for name, layers in (("pack_resume", range(PL - 1)), ("pack_rewrite", range(PL))):
        d = root / name
        with PackWriter(
            str(d / "newpack"), tag="wf", n_layers=PL, n_experts=PE, slot_bytes=PSLOT, ckpt_id="wf"
        ) as w:
            for layer in layers:
                w.write_layer(layer, rows(layer, 0))
        out[name] = d
    return out


def _run_atomic(writer: str, target: str, store):
    payload = bytes(range(256)) * (PAYLOAD // 256) + b"x" * (PAYLOAD % 256)
    if writer == "write_atomic":
        write_atomic(target, payload)
    elif writer == "write_atomic_with":
        write_atomic_with(target, lambda f: f.write(payload))
    elif writer == "write_atomic_async":
        asyncio.run(write_atomic_async(target, payload))
    elif writer == "save_poolmon":
        store.save_poolmon(target)
    elif writer == "write_warm_file":
        write_warm_file(snapshot(store), target, "pool-heat")
    elif writer == "snapshot_now":
        snap = PeriodicSnapshot(store, target, every_s=None, every_steps=1)
        ok = snap.snapshot_now()
        if not ok:  # a snapshot writer logs and carries on: its failure count is the error
            assert snap.failures == 1 and snap.writes == 0
            return "refused"
    elif writer == "create_sized_atomic":
        os.close(create_sized_atomic(target, 5 * 4096 + 3))
    return "written"


def _check_error(exc, case, names: list[str]) -> None:
    assert isinstance(exc, TierstoreError), f"{type(exc).__name__} is no TierstoreError: {exc}"
    msg = str(exc)
    assert "\n" not in msg, f"not one line: {msg!r}"
    assert any(n in msg for n in names), f"names none of {names}: {msg!r}"
    if isinstance(exc, TierIOError):
        assert exc.errno == case.err, f"errno {exc.errno}, injected {case.err}"
        assert "offset 0x" in msg, msg


def atomic_case(case, d: str, store) -> None:
    target = os.path.join(d, "target.bin")
    if case.writer != "create_sized_atomic":
        with open(target, "wb") as f:
            f.write(b"the old file\n" * 100)
    before = tree_digest(d)
    raised = outcome = None
    with SyscallFault(case.call, case.err, nth=case.nth, at_byte=case.at_byte, match=case.match) as fault:
        try:
            outcome = _run_atomic(case.writer, target, store)
        except Exception as exc:  # noqa: BLE001 - judged below
            raised = exc
    assert fault.fired, "the fault never fired"
    assert raised is not None or outcome == "refused", "the write succeeded through the fault"
    if raised is not None:
        _check_error(raised, case, [target])
        if case.call == "write":  # write_atomic_async said 0 here whatever had landed
            assert raised.offset == case.at_byte, f"offset {raised.offset}, {case.at_byte} landed"
    assert tree_digest(d) == before, "the old file changed or a temp file was left"
    assert _run_atomic(case.writer, target, store) == "written"  # no fault: it writes
    if case.writer in ATOMIC[3:]:
        assert_store_consistent(store)
        store.release(store.fire([(0, 3), (1, 4)]))


def _pack_of(d: str) -> str | None:
    found = glob.glob(os.path.join(d, "newpack", "*.pack"))
    return found[0] if found else None


def _write_pack(writer: str, d: str, box: list) -> None:
    with PackWriter(
        os.path.join(d, "newpack"), tag="wf", n_layers=PL, n_experts=PE, slot_bytes=PSLOT, ckpt_id="wf"
    ) as w:
        box.append(w)
        if writer == "pack_create":
            for layer in range(PL):
                w.write_layer(layer, rows(layer, 0))
        elif writer == "pack_resume":
            w.write_layer(PL - 1, rows(PL - 1, 0))
        else:
            w.write_layer(1, rows(1, 1))


def _expected(writer: str, layer: int) -> np.ndarray:
    return rows(layer, 1 if (writer == "pack_rewrite" and layer == 1) else 0)


def _check_listed_layers_verify(writer: str, path: str, allow_old_layer1: bool) -> list[int]:
    with Pack.open(path) as p:
        listed = [l for l in range(PL) if p.written[l]]
        report = p.verify()
        assert report.rows_checked == len(listed) * PE
        for layer in listed:
            got = np.stack([p.read_row(layer, e) for e in range(PE)])
            ok = np.array_equal(got, _expected(writer, layer)) or (
                allow_old_layer1 and layer == 1 and np.array_equal(got, rows(1, 0))
            )
            assert ok, f"listed layer {layer} holds other bytes than were written"
    return listed


def pack_case(case, d: str, templates) -> None:
    if case.writer != "pack_create":
        shutil.copytree(templates[case.writer], d, dirs_exist_ok=True)
    box: list = []
    raised = None
    with SyscallFault(case.call, case.err, nth=case.nth, at_byte=case.at_byte, match=case.match) as fault:
        try:
            _write_pack(case.writer, d, box)
        except Exception as exc:  # noqa: BLE001 - judged below
            raised = exc
    assert fault.fired, "the fault never fired"
    assert raised is not None, "the pack was written through the fault"
    _check_error(raised, case, [os.path.join(d, "newpack")])
    if case.call == "pwrite":
        per_layer = PE * PSLOT
        first = {"pack_create": 0, "pack_resume": PL - 1, "pack_rewrite": 1}[case.writer]
        layer, in_layer = first + case.at_byte // per_layer, case.at_byte % per_layer
        want = (layer * PE + in_layer // PSLOT) * STRIDE + in_layer % PSLOT
        assert raised.offset == want, f"offset {raised.offset:#x}, the write failed at {want:#x}"
    temps = [p for p in glob.glob(os.path.join(d, "**", "*"), recursive=True) if TEMP_MARK in p]
    temps += glob.glob(os.path.join(d, "newpack", ".*" + TEMP_MARK + "*"))
    assert not temps, f"temp files left: {temps}"
    path = _pack_of(d)
    if path is not None and os.path.exists(path[:-5] + ".json"):
        listed = _check_listed_layers_verify(case.writer, path, allow_old_layer1=True)
        if box:  # the writer's view of what is published is what is on disk
            assert list(box[0].written_layers) == listed, (
                f"the writer lists {list(box[0].written_layers)}, the sidecar {listed}"
            )
    _write_pack(case.writer, d, [])  # the same write, no fault: completes
    listed = _check_listed_layers_verify(case.writer, _pack_of(d), allow_old_layer1=False)
    assert listed == list(range(PL))


def test_every_write_fault_leaves_nothing_half_written(tmp_path, store, templates):
    bad = []
    cases = write_cases()
    for i, case in enumerate(cases):
        d = str(tmp_path / f"c{i}")
        os.makedirs(d)
        try:
            if case.writer.startswith("pack_"):
                pack_case(case, d, templates)
            else:
                atomic_case(case, d, store)
        except (AssertionError, TierstoreError, OSError) as exc:
            bad.append(f"{case.name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    assert not bad, f"{len(bad)} of {len(cases)} write faults went wrong:\n" + "\n".join(bad[:40])


@pytest.mark.parametrize("kw", [{"every_s": None}, {"fmt": "yaml"}])
def test_a_snapshot_writer_with_bad_arguments_is_a_config_error_naming_the_file(store, tmp_path, kw):
    # was a bare ValueError
    target = str(tmp_path / "snap.json")
    with pytest.raises(ts.ConfigError, match=str(tmp_path)):
        PeriodicSnapshot(store, target, **kw)
