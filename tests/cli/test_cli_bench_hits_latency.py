"""``tierstore bench hits``: the latency view end to end: both views
printed with the lead-time model stated, models reading more than LRU marked not
comparable (never a gap share), read-ratio curves, the report files."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierstore.cli import main

SMALL = [
    "--synthetic",
    "--ticks",
    "40",
    "--layers",
    "3",
    "--experts",
    "16",
    "--top-k",
    "2",
    "--prefill-tokens",
    "8",
    "--prefill-every",
    "20",
]
MODELS = "lru,hybrid,belady,lru+prefetch,hybrid+prefetch"


def test_both_views_and_the_lead_time_model_are_printed(capsys):
    assert (
        main(["bench", "hits", *SMALL, "--slots", "6,10", "--policies", MODELS, "--read-ratios", "1,2"]) == 0
    )
    out = capsys.readouterr().out
    assert "bandwidth view" in out and "latency view" in out
    assert "lead-time model: a prefetch is issued after layer l reads and targets layer l+1" in out
    assert "untimed" in out
    assert "lru+prefetch@2" in out and "hybrid+prefetch@2" in out
    assert "NOT comparable: reads > LRU" in out  # a budget of twice LRU's reads more


def _rows(capsys, argv):
    assert main(["bench", "hits", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 50),
    experts=st.integers(6, 16),
    slots=st.integers(3, 12),
    ratio=st.sampled_from(["0.5", "1.2", "3"]),
)
def test_latency_share_only_at_no_more_reads_than_lru(capsys, seed, experts, slots, ratio):
    rows = _rows(
        capsys,
        [
            "--synthetic",
            "--ticks",
            "24",
            "--layers",
            "3",
            "--experts",
            str(experts),
            "--top-k",
            "2",
            "--prefill-tokens",
            "4",
            "--prefill-every",
            "12",
            "--seed",
            str(seed),
            "--slots",
            str(slots),
            "--policies",
            MODELS,
            "--read-ratios",
            f"1,{ratio}",
        ],
    )
    lru = next(r for r in rows if r["policy"] == "lru")
    mn = next(r for r in rows if r["policy"] == "belady")
    span = mn["latency_hit_rate"] - lru["latency_hit_rate"]
    assert {r["policy"] for r in rows} >= {f"lru+prefetch@{ratio}", f"hybrid+prefetch@{ratio}"}
    for r in rows:
        if r["policy"] == "belady":
            assert r["latency_comparable"] is None and r["latency_gap_closed"] is None
            continue
        assert r["latency_comparable"] == (r["reads"] <= lru["reads"])
        assert r["reads_vs_lru"] == pytest.approx(r["reads"] / lru["reads"])
        if r["latency_comparable"] and span > 0:
            assert r["latency_gap_closed"] == pytest.approx(
                (r["latency_hit_rate"] - lru["latency_hit_rate"]) / span
            )
        else:
            assert r["latency_gap_closed"] is None
        if "+prefetch" in r["policy"]:
            assert r["read_ratio"] == (float(ratio) if "@" in r["policy"] else 1.0)
            assert r["reads"] == r["demand_reads"] + r["prefetched"]  # every read counted
        else:
            assert r["read_ratio"] is None and r["prefetched"] == 0


def test_report_writes_markdown_json_and_png(capsys, tmp_path):
    prefix = tmp_path / "hits_latency_small"
    assert (
        main(
            [
                "bench",
                "hits",
                *SMALL,
                "--slots",
                "6,10",
                "--policies",
                MODELS,
                "--read-ratios",
                "0.9,1",
                "--report",
                str(prefix),
            ]
        )
        == 0
    )
    capsys.readouterr()
    doc = json.loads((tmp_path / "hits_latency_small.json").read_text())
    assert doc["lead_time"]["lead"] == 1 and doc["lead_time"]["timed"] is False
    assert "lead-time model" in doc["lead_time"]["text"]
    names = {(r["policy"], r["slots"]) for r in doc["results"]}
    assert ("hybrid+prefetch@0.9", 10) in names and ("lru", 6) in names
    md = (tmp_path / "hits_latency_small.md").read_text()
    assert "## Latency view" in md and "## Bandwidth view" in md
    assert md.count("| hybrid+prefetch@0.9 |") == 4  # 2 pools x 2 views
    assert (tmp_path / "hits_latency_small.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timed_model_counts_unlanded_rows_as_misses_and_keeps_the_decisions(capsys):
    base = [
        *SMALL,
        "--slots",
        "10",
        "--policies",
        "lru,belady,lru+prefetch",
        "--read-ratios",
        "1.5",
        "--row-bytes",
        "1000",
    ]
    untimed = {r["policy"]: r for r in _rows(capsys, base)}
    # A row takes 100 layers of compute to read: no prefetch lands before its layer.
    slow = {r["policy"]: r for r in _rows(capsys, [*base, "--read-gbps", "0.001", "--layer-us", "10"])}
    pf_u, pf_s = untimed["lru+prefetch"], slow["lru+prefetch"]
    assert pf_u["prefetched"] > 0
    for key in ("hit_rate", "reads", "prefetched", "prefetch_hits", "evictions"):
        assert pf_s[key] == pf_u[key]  # the timing changes the scoring only
    assert pf_s["latency_hit_rate"] < pf_u["latency_hit_rate"] == pf_u["hit_rate"]
    for name in ("lru", "belady"):  # demand fill: what is resident has landed
        assert slow[name]["latency_hit_rate"] == untimed[name]["latency_hit_rate"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--read-gbps", "2"], "a read bandwidth (2.0 GB/s) needs row bytes > 0 and a layer time"),
        (
            ["--read-gbps", "2", "--row-bytes", "64", "--layer-us", "5", "--policies", "lru,predict"],
            "models predict have no timed lead-time model",
        ),
        (["--lead", "0"], "a prefetch must be issued at least one layer ahead, got lead 0"),
    ],
)
def test_bad_lead_time_settings_are_one_line_errors(capsys, argv, message):
    assert main(["bench", "hits", *SMALL, "--slots", "6", *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_read_ratios_are_refused_by_the_parser(capsys):
    assert main(["bench", "hits", *SMALL, "--read-ratios", "1,-2"]) == 2
    err = capsys.readouterr().err
    assert "--read-ratios: expected comma-separated numbers >= 0, found '-2'" in err


def test_reads_against_lru_need_no_min_run(capsys):
    # Without MIN (belady) in the run, a model is still compared with LRU's reads;
    # only the gap share, which needs MIN's hit rate, is left out.
    rows = _rows(capsys, [*SMALL, "--slots", "6", "--policies", "lru,hybrid,lru+prefetch"])
    lru = next(r for r in rows if r["policy"] == "lru")
    for r in rows:
        assert r["latency_comparable"] == (r["reads"] <= lru["reads"])
        assert r["reads_vs_lru"] == pytest.approx(r["reads"] / lru["reads"])
        assert r["latency_gap_closed"] is None and r["gap_closed"] is None
    assert main(["bench", "hits", *SMALL, "--slots", "6", "--policies", "hybrid"]) == 0
    assert "no LRU run at this pool" in capsys.readouterr().out
