"""`tierstore warm inspect | merge | convert` through tierstore.cli.main."""

from __future__ import annotations

import json
import os

import pytest

from tierstore.cli import main
from tierstore.testing.packs import make_random_pack
from tierstore.warm import PackIdentity, read_warm_file

L, E, SLOT = 4, 8, 64


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    return make_random_pack(tmp_path_factory.mktemp("pack"), L, E, SLOT, seed=5)


def _ident(pack):
    i = PackIdentity.of_pack(pack)
    return {f: getattr(i, f) for f in i.__struct_fields__}


def poolmon(tmp_path, pack, name, owners, wall_time, arena=()):
    d = {
        "version": "tierstore-poolmon-v1",
        "pack": _ident(pack),
        "tiers": {
            "pool": {"capacity": 8, "owners": [list(o) for o in owners]},
            "arena": {"capacity": 16, "owners": [list(o) for o in arena]},
        },
        "counters": {"pool": {"hits": 10, "misses": 4, "promotions": 4, "evictions": 1}},
        "wall_time": wall_time,
        "steps": 100,
        "policy": "heat",
    }
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return str(p)


def pool_heat(tmp_path, name, owners, E_=E):
    p = tmp_path / name
    p.write_text(
        json.dumps(
            {
                "meta": {"version": "pool-heat-v1", "tag": "fp4", "n_layers": L, "E": E_, "slot_bytes": SLOT},
                "owners": [list(o) for o in owners],
            }
        )
    )
    return str(p)


def run(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_inspect_poolmon_json_reports_concentration_and_layers(tmp_path, pack, capsys):
    owners = [(0, e, 100.0 if e == 0 else 1.0) for e in range(8)] + [(2, 3, 1.0), (2, 3, 1.0)]
    p = poolmon(tmp_path, pack, "pm.json", owners, 1.7e9)
    rc, out, _ = run(capsys, "warm", "inspect", p, "--json", "--top", "2")
    s = json.loads(out)
    assert rc == 0 and s["kind"] == "poolmon" and s["identity"]["key20"] == pack.key20
    pool = s["tiers"]["pool"]
    assert pool["entries"] == 10 and pool["per_layer"] == [8, 0, 2, 0]
    assert pool["top_n"] == 2 and pool["top_n_share"] == pytest.approx(101 / 109)
    assert pool["top10pct_entries"] == 1 and pool["top10pct_share"] == pytest.approx(100 / 109)
    assert s["problems"] == {"pool: duplicate": 1}
    assert s["counters"]["pool"]["hits"] == 10


def test_inspect_text_for_each_format(tmp_path, pack, capsys):
    ph = pool_heat(tmp_path, "pool-heat.fp4.rank0of1.json", [(1, 2), (0, 0), (9, 9)])
    rc, out, _ = run(capsys, "warm", "inspect", ph)
    assert rc == 0 and "pool-heat" in out and "rank heat" in out and "1 pool: out of range" in out
    ah = tmp_path / "x.pack.heat.json"
    ah.write_text('{"version": 1, "keys": [[0, 1], [0, 2]]}')
    rc, out, _ = run(capsys, "warm", "inspect", str(ah))
    assert rc == 0 and "arena: 2 entries" in out and "no identity" in out


def test_inspect_corrupt_file_one_line_exit_1(tmp_path, capsys):
    p = tmp_path / "bad.json"
    p.write_text('{"version": 1, "keys": [[0, 1]')
    rc, out, err = run(capsys, "warm", "inspect", str(p))
    assert rc == 1 and out == ""
    assert err == f"tierstore: error: {p}: warm-start file is not valid JSON: truncated\n"


def test_inspect_missing_file_exit_1(tmp_path, capsys):
    rc, _, err = run(capsys, "warm", "inspect", str(tmp_path / "none.json"))
    assert rc == 2 and "none.json: no such warm-start file" in err


def test_merge_decays_older_run_by_half_life(tmp_path, pack, capsys):
    old = poolmon(tmp_path, pack, "old.json", [(0, 0, 10.0), (1, 1, 10.0)], wall_time=1000.0)
    new = poolmon(tmp_path, pack, "new.json", [(2, 2, 10.0), (1, 1, 10.0)], wall_time=1100.0)
    out = str(tmp_path / "merged.json")
    rc, text, _ = run(capsys, "warm", "merge", old, new, "-o", out, "--half-life-s", "100")
    assert rc == 0 and "3 pool" in text
    m = read_warm_file(out)
    # shares: old 0.5 each x weight 0.5, new 0.5 each x weight 1
    assert m.pool.keys.tolist() == [[1, 1], [2, 2], [0, 0]]
    assert m.pool.heat.tolist() == pytest.approx([0.75, 0.5, 0.25])
    assert m.counters.pool.hits == 20 and m.steps == 200 and m.wall_time == 1100.0
    assert m.identity.key20 == pack.key20


def test_merge_pool_heat_uses_rank_scores_and_pack_identity(tmp_path, pack, capsys):
    a = pool_heat(tmp_path, "a.json", [(0, 0), (0, 1)])
    b = pool_heat(tmp_path, "b.json", [(0, 1), (3, 3)])
    out = str(tmp_path / "m.json")
    rc, _, _ = run(capsys, "warm", "merge", a, b, "-o", out, "--pack", pack.path)
    assert rc == 0
    m = read_warm_file(out)
    assert m.pool.keys[0].tolist() == [0, 1]  # in both files
    assert m.identity.ckpt_id == pack.ckpt_id  # completed from --pack


def test_merge_refuses_mismatched_geometry_naming_file(tmp_path, pack, capsys):
    a = pool_heat(tmp_path, "a.json", [(0, 0)])
    b = pool_heat(tmp_path, "b.json", [(0, 0)], E_=16)
    out = tmp_path / "m.json"
    rc, _, err = run(capsys, "warm", "merge", a, b, "-o", str(out))
    assert rc == 1 and err.startswith(f"tierstore: error: {b}: does not match {a}")
    assert "n_experts 16, expected 8" in err and not out.exists()


def test_merge_refuses_arena_heat_outside_geometry(tmp_path, pack, capsys):
    a = pool_heat(tmp_path, "a.json", [(0, 0)])
    h = tmp_path / "h.heat.json"
    h.write_text('{"version": 1, "keys": [[0, 1], [7, 1]]}')
    rc, _, err = run(capsys, "warm", "merge", a, str(h), "-o", str(tmp_path / "m.json"))
    assert rc == 1 and f"{h}: arena entry 1 is layer 7 expert 1, outside" in err


def test_convert_poolmon_to_pool_heat_and_back(tmp_path, pack, capsys):
    src = poolmon(tmp_path, pack, "pm.json", [(3, 1, 5.0), (0, 2, 4.0)], 1.0, arena=[(1, 1, 1.0)])
    ph = str(tmp_path / "pool-heat.fp4.rank0of1.json")
    assert run(capsys, "warm", "convert", src, "-o", ph, "--to", "pool-heat")[0] == 0
    raw = open(ph).read()
    assert raw.count("\n") == 0 and json.loads(raw)["owners"] == [[3, 1], [0, 2]]
    back = str(tmp_path / "back.json")
    assert run(capsys, "warm", "convert", ph, "-o", back, "--to", "poolmon", "--pack", pack.path)[0] == 0
    wf = read_warm_file(back)
    assert wf.pool.keys.tolist() == [[3, 1], [0, 2]] and wf.identity.key20 == pack.key20
    ah = str(tmp_path / "a.heat.json")
    assert run(capsys, "warm", "convert", src, "-o", ah, "--to", "arena-heat")[0] == 0
    assert json.load(open(ah)) == {"version": 1, "keys": [[1, 1]]}


def test_convert_arena_heat_without_pack_is_an_error(tmp_path, capsys):
    h = tmp_path / "h.heat.json"
    h.write_text('{"version": 1, "keys": [[0, 1]]}')
    out = tmp_path / "o.json"
    rc, _, err = run(capsys, "warm", "convert", str(h), "-o", str(out), "--to", "pool-heat")
    assert rc == 1 and "carries no pack identity; give --pack" in err and not out.exists()


def test_convert_refuses_file_of_another_pack(tmp_path, pack, capsys):
    ph = pool_heat(tmp_path, "ph.json", [(0, 0)], E_=4)
    rc, _, err = run(
        capsys, "warm", "convert", ph, "-o", str(tmp_path / "o.json"), "--to", "poolmon", "--pack", pack.path
    )
    assert rc == 1 and "is for another pack" in err and "n_experts 4, pack has 8" in err
    assert os.listdir(tmp_path) == ["ph.json"]


def test_inspect_against_pack_reports_usable_or_cold(tmp_path, pack, capsys):
    ok = pool_heat(tmp_path, "ok.json", [(0, 0), (3, 9)])
    rc, out, _ = run(capsys, "warm", "inspect", ok, "--pack", pack.path)
    assert rc == 0 and f"against {pack.path}: usable, 1 pool" in out and "1 pool: out of range" in out
    bad = pool_heat(tmp_path, "bad.json", [(0, 0)], E_=32)
    rc, out, _ = run(capsys, "warm", "inspect", bad, "--pack", pack.path, "--json")
    against = json.loads(out)["against_pack"]
    assert rc == 0 and against["usable"] is False and "n_experts 32, pack has 8" in against["reason"]
