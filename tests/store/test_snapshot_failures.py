"""A failing periodic snapshot (issue 41) warns once per run of failures and counts the
rest, in each of the three periodic writers: the store's own ``snapshot=`` option,
PeriodicSnapshot and async_snapshot_loop. A success after a run says so once."""

from __future__ import annotations

import asyncio
import logging
import os
import time

import tierstore as ts
import tierstore.warm as ws
from tierstore import PackWriter
from tierstore.testing.packs import random_layer_rows


def _pack(d) -> str:
    with PackWriter(d, tag="fp4", n_layers=2, n_experts=4, slot_bytes=4096, ckpt_id="c") as w:
        for layer in range(2):
            w.write_layer(layer, random_layer_rows(0, layer, 4, 4096))
        return w.path


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_store_s_failing_snapshot_warns_once_then_counts(tmp_path, caplog):
    target = tmp_path / "gone" / "poolmon.json"  # its directory does not exist
    with (
        caplog.at_level(logging.INFO, logger="tierstore.store"),
        ts.ExpertStore(
            _pack(tmp_path), vram_slots=2, device="cpu", snapshot=str(target), snapshot_every_s=0.001
        ) as store,
    ):
        for _ in range(6):
            time.sleep(0.003)
            store.step()
            assert store.wait_idle(10)
        assert store.snapshot_failures == 6
        warned = _warnings(caplog)
        assert len(warned) == 1 and str(target) in warned[0] and "counted" in warned[0], warned
        (tmp_path / "gone").mkdir()  # the disk is back
        time.sleep(0.003)
        store.step()
        assert store.wait_idle(10) and target.exists()
        assert any("again after 6 failed" in r.getMessage() for r in caplog.records)
        os.unlink(target)
        os.rmdir(tmp_path / "gone")  # a new run of failures: warned
        time.sleep(0.003)
        store.step()
        assert store.wait_idle(10) and store.snapshot_failures == 7
        assert len(_warnings(caplog)) == 2


def test_periodic_snapshot_warns_once_for_a_run_of_different_errors(tmp_path, caplog):
    target = tmp_path / "d" / "p.json"
    with (
        ts.ExpertStore(_pack(tmp_path), vram_slots=2, device="cpu") as store,
        caplog.at_level(logging.WARNING, logger="tierstore.warmstart"),
    ):
        snap = ws.PeriodicSnapshot(store, target, every_s=100)
        assert snap.snapshot_now() is False  # ENOENT: no directory
        target.mkdir(parents=True)  # now the name is a directory
        assert snap.snapshot_now() is False and snap.snapshot_now() is False
    assert snap.failures == 3
    warned = _warnings(caplog)
    assert len(warned) == 1 and str(target) in warned[0], warned


def test_async_snapshot_loop_warns_once_not_every_tick(tmp_path, caplog):
    target = tmp_path / "gone" / "p.json"
    with ts.ExpertStore(_pack(tmp_path), vram_slots=2, device="cpu") as store:

        async def go():
            task = asyncio.create_task(ws.async_snapshot_loop(store, target, every_s=0.005))
            await asyncio.sleep(0.3)  # ~60 ticks, every one failing
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

        with caplog.at_level(logging.WARNING, logger="tierstore.warmstart"):
            asyncio.run(go())
    warned = _warnings(caplog)
    assert len(warned) == 1 and str(target) in warned[0], warned
