"""Hostile warm-start files: a strict read is a one-line TierstoreError naming the file
(or a file read as written); as a hint (the store's warm start) never an exception,
a cold start after a warning naming the file, or only in-range pairs of written layers;
bounded time and memory (one capped child), nothing on disk changed."""

from __future__ import annotations

import os
import warnings

import pytest

import tierstore as ts
from hostile.common import assert_fast, run_batch, tree_digest
from hostile.packs import E, L, write_pack
from hostile.warm import cases, materialise
from tierstore.format import Pack

RED_TEAM_WARM = 160


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("hostile-warm"))
    pack = write_pack(os.path.join(root, "pack"), "ts-v2")
    d = os.path.join(root, "files")
    os.makedirs(d)
    all_cases = cases()
    jobs = [{"name": n, "target": materialise(d, n, b), "pack": pack} for n, b in all_cases]
    before = tree_digest(root)
    results = run_batch("warm", jobs)
    return jobs, results, before, tree_digest(root), pack


def test_the_warm_corpus_is_larger_than_the_red_team_s(corpus):
    assert len(corpus[0]) > RED_TEAM_WARM


def test_every_warm_file_is_refused_cleanly_or_fitted_to_the_pack(corpus):
    jobs, results, before, after, _ = corpus
    assert before == after
    bad = []
    for job in jobs:
        name, res = job["name"], results[job["name"]]
        try:
            assert res["outcome"] == "done", f"{name}: {res}"
            assert_fast(res, name)
            strict = res["strict"]
            if strict["outcome"] != "read":
                assert "TierstoreError" in strict["mro"] or strict["etype"] == "FileNotFoundError", (
                    f"{name}: strict read raised {strict['etype']}: {strict['msg']}"
                )
                assert "\n" not in strict["msg"] and job["target"] in strict["msg"], f"{name}: {strict}"
            if res["hint"] is None:
                assert res["hint_warnings"] and all(
                    job["target"] in w and "\n" not in w for w in res["hint_warnings"]
                ), f"{name}: {res}"
            else:
                for l, e in res["hint"]["pool"] + res["hint"]["arena"]:
                    assert 0 <= l < L and 0 <= e < E, f"{name}: hint kept ({l}, {e})"
            if name.startswith("special-") or "-cut" in name or name.endswith(("-deep", "-flood")):
                assert res["hint"] is None and strict["outcome"] != "read", name
        except AssertionError as exc:
            bad.append(str(exc).splitlines()[0])
    assert not bad, f"{len(bad)} warm cases failed:\n" + "\n".join(bad[:30])


@pytest.mark.parametrize(
    "name",
    [
        "special-fifo",
        "special-dev-zero",
        "poolmon-range0",
        "poolmon-wall0",
        "special-over-cap",
        "arena-heat-flood",
    ],
)
def test_a_store_warm_started_from_a_hostile_file_starts_cold_or_warms_right(corpus, name):
    jobs, _, _, _, pack_path = corpus
    target = next(j["target"] for j in jobs if j["name"] == name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ts.ExpertStore(Pack.open(pack_path), vram_slots=6, device="cpu", warm_start=target) as store:
            assert store.stats().pool.capacity == 6
    assert any(target in str(w.message) for w in caught) or name == "poolmon-range0"
