"""Hostile packs: every generated case is refused with one line naming the file, or opens
and serves exactly the bytes that were written, in bounded time and memory, with
nothing on disk changed. The reading runs in one capped child (hostile/child.py)."""

from __future__ import annotations

import os
import re
import warnings

import numpy as np
import pytest
import xxhash

import tierstore as ts
from hostile.common import assert_fast, assert_one_line_error, run_batch, tree_digest, without_new_locks
from hostile.packs import ROWS, SLOT, E, data, sidecar, write_pack
from hostile.packs_more import all_cases
from tierstore.format import Pack

RED_TEAM_PACKS = 430


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """name -> (case, json, result, digest before, digest after)."""
    root = str(tmp_path_factory.mktemp("hostile-packs"))
    cases = all_cases()
    assert len({c.name for c in cases}) == len(cases), "case names must be unique"
    jobs, digests = [], {}
    for c in cases:
        d = os.path.join(root, c.name)
        target = c.build(d)
        jobs.append(c.to_json(d, target))
        digests[c.name] = tree_digest(d)
    results = run_batch("packs", jobs)
    return {
        j["name"]: (c, j, results[j["name"]], digests[j["name"]], tree_digest(j["dir"]))
        for c, j in zip(cases, jobs)
    }


def test_the_corpus_is_larger_than_the_red_team_s(corpus):
    assert len(corpus) > RED_TEAM_PACKS
    kinds = {}
    for c, *_ in corpus.values():
        kinds[c.expect] = kinds.get(c.expect, 0) + 1
    # most cases are refusals; the rest prove a hostile-looking pack still serves right bytes
    assert kinds["refuse"] > 350 and kinds.get("open", 0) > 30 and kinds["verify_fail"] > 30


def _intended(layer: int, expert: int) -> int:
    return xxhash.xxh3_64_intdigest(ROWS[layer, expert].tobytes())


def _check(name, case, job, res, before, after):
    assert res["outcome"] != "hang", f"{name}: blocked ({res})"
    assert before == after, f"{name}: the case changed files on disk"
    assert_fast(res, name)
    if case.expect == "refuse" or (case.expect == "either" and res["outcome"] == "refused"):
        assert_one_line_error(res, job["dir"], name)
        if case.match:
            assert re.search(case.match, res["msg"]), f"{name}: {res['msg']!r} !~ {case.match!r}"
        return
    assert res["outcome"] == "opened", f"{name}: expected it to open: {res}"
    if case.expect == "either":
        written = res["layers"]
    else:
        written = list(case.written)
        assert res["layers"] == written, f"{name}: lists {res['layers']}, expected {written}"
    for key, got in res["rows"].items():
        layer, expert = map(int, key.split(","))
        if (layer, expert) in case.bad_rows:
            continue
        if case.expect != "verify_fail" or not case.bad_rows:
            assert got == _intended(layer, expert) or case.expect == "verify_fail", (
                f"{name}: row {key} reads other bytes than were written"
            )
    for key, msg in res["unwritten"].items():
        assert msg != "served" and "is not written" in msg, f"{name}: unwritten row {key}: {msg}"
    v = res["verify"]
    if case.expect == "verify_fail":
        assert v["outcome"] == "refused" and "TierstoreError" in v["mro"], f"{name}: verify {v}"
        layer, expert = case.bad_rows[0]
        off = (layer * E + expert) * 4096
        assert f"layer {layer} expert {expert} at offset {off:#x}" in v["msg"], v["msg"]
        assert "\n" not in v["msg"]
    else:
        assert v["outcome"] == "ok", f"{name}: verify of an intact pack failed: {v}"


def test_every_case_is_refused_cleanly_or_served_exactly(corpus):
    failures = []
    for name, (case, job, res, before, after) in sorted(corpus.items()):
        try:
            _check(name, case, job, res, before, after)
        except AssertionError as exc:
            failures.append(str(exc).splitlines()[0])
    assert not failures, f"{len(failures)} cases failed:\n" + "\n".join(failures[:40])


def _serve_all(pack, bad_rows=(), verify="always"):
    """Fire every written key through a CPU store; every published slot must hold the
    intended row, and a row the checksums refuse must not be published."""
    keys = [(l, e) for l in pack.layers for e in range(pack.n_experts)]
    with ts.ExpertStore(
        pack, vram_slots=len(keys) or 1, ram_gb=0, device="cpu", verify=verify, lazy_per_step=0
    ) as store:
        for key in keys:
            try:
                store.release(store.fire([key]))
            except ts.TierIOError as exc:
                assert key in bad_rows, f"{pack.path}: {key} refused: {exc}"
                assert f"layer {key[0]} expert {key[1]}" in str(exc) and "\n" not in str(exc)
                assert int(store.slot_table[key]) == -1
                continue
            assert key not in bad_rows, f"{pack.path}: corrupted row {key} was published"
            slot = int(store.slot_table[key])
            assert slot >= 0
            assert np.array_equal(store.pool[slot].numpy()[:SLOT], ROWS[key]), (
                f"{pack.path}: slot of {key} holds other bytes"
            )


def test_every_pack_that_opens_serves_only_the_intended_bytes(corpus):
    served = 0
    for name, (case, job, res, _before, after) in sorted(corpus.items()):
        if res["outcome"] != "opened" or res.get("verify", {}).get("outcome") not in ("ok", "refused"):
            continue
        if res["unknown_fields"] or case.expect == "either":
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Pack.open(job["target"], **job["open_kwargs"]) as pack:
                _serve_all(pack, case.bad_rows)
        assert without_new_locks(after, tree_digest(job["dir"])) == after, f"{name}: the store changed files"
        served += 1
    assert served > 60


# -- files replaced or changed between Pack.open and the store ----------------------------
def _other_bytes():
    b = data()
    b[0] ^= 1
    return b


def _replace(p):
    tmp = p.path + ".new"
    with open(tmp, "wb") as f:
        f.write(_other_bytes())
    os.replace(tmp, p.path)


def _truncate(p):
    os.truncate(p.path, 4096)


def _extend(p):
    os.truncate(p.path, os.path.getsize(p.path) + 4096)


def _rewrite_same_mtime(p):
    st = os.stat(p.path)
    fd = os.open(p.path, os.O_WRONLY)
    os.pwrite(fd, b"\x00" * 16, 0)
    os.close(fd)
    os.utime(p.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.posix_fadvise(os.open(p.path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)


def _rewrite(p):
    fd = os.open(p.path, os.O_WRONLY)
    os.pwrite(fd, b"\x00" * 16, 0)
    os.close(fd)
    os.utime(p.path, ns=(1, 1))


def _unlink(p):
    os.unlink(p.path)


def _to_fifo(p):
    os.unlink(p.path)
    os.mkfifo(p.path)


def _swap_sidecar(p):
    side = sidecar("ts-old")
    side["checksums"]["0"][0] ^= 1
    import json

    with open(p.sidecar_path, "w") as f:
        json.dump(side, f)


REPLACED = {
    "replaced": _replace,
    "truncated": _truncate,
    "extended": _extend,
    "rewritten": _rewrite,
    "rewritten-same-mtime": _rewrite_same_mtime,
    "unlinked": _unlink,
    "fifo": _to_fifo,
    "sidecar-rewritten": _swap_sidecar,
}


@pytest.mark.parametrize("when", ["before-store", "under-store"])
@pytest.mark.parametrize("how", sorted(REPLACED))
def test_a_pack_changed_after_open_is_refused_or_served_right(tmp_path, how, when):
    path = write_pack(str(tmp_path), "ts-old")
    pack = Pack.open(path)
    try:
        if when == "before-store":
            REPLACED[how](pack)
            try:
                store = ts.ExpertStore(pack, vram_slots=6, ram_gb=0, device="cpu", lazy_per_step=0)
            except ts.TierstoreError as exc:
                assert "\n" not in str(exc) and path in str(exc)
                return
        else:
            store = ts.ExpertStore(pack, vram_slots=6, ram_gb=0, device="cpu", lazy_per_step=0)
            store.release(store.fire([(1, 1)]))
            REPLACED[how](pack)
        with store:
            for key in [(0, 0), (0, 1), (1, 2)]:
                try:
                    store.release(store.fire([key]))
                except ts.TierstoreError as exc:
                    assert "\n" not in str(exc) and path in str(exc), str(exc)
                    assert int(store.slot_table[key]) == -1
                    continue
                slot = int(store.slot_table[key])
                assert np.array_equal(store.pool[slot].numpy()[:SLOT], ROWS[key]), (
                    f"{how} {when}: a wrong row of {key} was served"
                )
    finally:
        pack.close()
