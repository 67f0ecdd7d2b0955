"""`tierstore demo`: deterministic for a seed, warm restart on unseen routing, a PNG,
and its directory cleaned up or kept as asked."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import pytest
from conftest import private_temp_root

from tierstore.cli import main

SHORT = ["demo", "--steps", "16", "--warm-steps", "8", "--device", "cpu", "--rows", "small"]


def _demo(*extra, cwd=None):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*SHORT, *extra])
    assert rc == 0, err.getvalue()
    return out.getvalue(), err.getvalue()


private_tmp = pytest.fixture(autouse=True)(private_temp_root)  # conftest: own TMPDIR


def _demo_dirs():
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("tierstore-demo-")}


def test_same_seed_same_run_and_the_warm_run_sees_other_routing(tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    before = _demo_dirs()
    threads = torch.get_num_threads()
    a = json.loads(_demo("--json", "--no-plot")[0])
    # one-token decode ops run on one torch thread; the caller's setting is given back
    assert a["torch_threads"] == {"decode": 1, "default": threads}
    assert torch.get_num_threads() == threads
    for run in ("learn", "cold", "warm"):  # the picture counts every store fire, as the table
        assert a[run]["store_fires"] == len(a[run]["fire_latencies_ms"]) >= a[run]["fires"]
    b = json.loads(_demo("--json", "--no-plot")[0])
    for run in ("learn", "cold", "warm"):
        for key in (
            "fires",
            "fire_rounds",
            "promotions",
            "pool_hit_rate",
            "hit_rate_per_step",
            "err_pool",
            "err_base",
        ):
            assert a[run][key] == b[run][key], (run, key)
    # the cold/warm comparison runs on another stream of the same router
    assert a["config"]["warm_seed"] == a["config"]["seed"] + 1
    assert a["cold"]["err_base"] != a["learn"]["err_base"]
    assert a["cold"]["err_base"] == a["warm"]["err_base"]  # cold and warm: same routing
    assert len(a["warm"]["hit_rate_per_step"]) == 8
    assert a["kept"] is None and _demo_dirs() <= before  # temp directory removed
    assert os.listdir(tmp_path) == []  # --no-plot: nothing written


def test_png_is_written_where_printed_and_out_is_kept(tmp_path):
    out_dir = tmp_path / "demo"
    text, _ = _demo("--out", str(out_dir))
    png = out_dir / "demo.png"
    assert f"picture (hit rate over steps, fire latencies): {png}" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out_dir / "poolmon.json").exists()
    assert not [n for n in os.listdir(out_dir) if ".tmp-" in n]


def test_default_png_goes_to_the_current_directory_and_temp_dir_is_removed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = _demo_dirs()
    text, _ = _demo("--seed", "3")
    assert (tmp_path / "tierstore-demo.png").exists()
    assert "temp directory removed" in text and _demo_dirs() <= before


def test_keep_keeps_the_temp_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = json.loads(_demo("--keep", "--json", "--no-plot")[0])
    try:
        assert result["kept"] and os.path.exists(os.path.join(result["kept"], "poolmon.json"))
    finally:
        import shutil

        shutil.rmtree(result["kept"], ignore_errors=True)


def test_torch_threads_restores_the_callers_setting_on_error():
    import torch

    from tierstore.cli.demo_run import torch_threads

    before = torch.get_num_threads()
    with pytest.raises(KeyboardInterrupt):
        with torch_threads(1):
            assert torch.get_num_threads() == 1
            raise KeyboardInterrupt
    assert torch.get_num_threads() == before


def _run(rates, fires):
    return {
        "hit_rate_per_step": rates,
        "pool_hit_rate": sum(rates) / len(rates),
        "steps": len(rates),
        "fires": fires,
        "store_fires": fires,
        "fire_latencies_ms": [0.5] * fires,
    }


def test_headline_states_the_warm_start_gain_as_hit_rates_not_fire_counts():
    from tierstore.cli.demo_run import warm_start_headline

    cold = _run([0.0, 0.2, 0.4, 0.6, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7], fires=3)
    warm = _run([0.3, 0.5, 0.6, 0.6, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7], fires=5)
    text = warm_start_headline({"cold": cold, "warm": warm})
    # first 2 steps (a fifth of 10): warm 40.0% against cold 10.0%; step 1: 30.0% vs 0.0%
    assert "40.0% of the first 2 steps' experts against 10.0% after a cold start" in text
    assert "first step 30.0% vs 0.0%" in text and "all 10 steps 61.0% vs 53.0%" in text
    assert "fire" not in text  # more gate fires warm is the model's confidence, not a loss
