"""tierstore plan: the memory model against hand-computed budgets, the geometry of each
config family, one-line refusals of bad inputs (hypothesis), and the recommendation
against a brute-force replay on the real trace and a synthetic one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from tierstore.cli import main as cli_main
from tierstore.errors import ConfigError, FormatError
from tierstore.plan import budget as B
from tierstore.plan.curve import CEILING, geometric_grid, hit_curve
from tierstore.plan.engines import gib_text
from tierstore.plan.geometry import Geometry, from_hf_config
from tierstore.store import sizing

DATA = Path(__file__).parent.parent / "data" / "plan"
GIB = 1 << 30
REAL_TRACE = Path("/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy")
DS4_ROW_FP4, DS4_ROW_BASE2 = 12_582_912, 7_077_888  # shared/COMPAT.md "Slot / row layouts"


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = cli_main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# -- geometry of each family -------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, expect",
    [
        (
            "deepseek_v4_flash",
            dict(
                moe_layers=43,
                dense_layers=0,
                n_experts=256,
                top_k=6,
                hidden=4096,
                moe_intermediate=2048,
                shared_intermediate=2048,
                attention="dsv4",
                mtp_layers=1,
                dense_quant="fp8",
            ),
        ),
        (
            "deepseek_v3",
            dict(
                moe_layers=58,
                dense_layers=3,
                n_experts=256,
                top_k=8,
                moe_intermediate=2048,
                shared_intermediate=2048,
                attention="mla",
            ),
        ),
        (
            "mixtral_8x7b",
            dict(
                moe_layers=32,
                n_experts=8,
                top_k=2,
                moe_intermediate=14336,
                shared_intermediate=0,
                attention="gqa",
                kv_heads=8,
                head_dim=128,
            ),
        ),
        (
            "qwen3_30b_a3b",
            dict(
                moe_layers=48,
                n_experts=128,
                top_k=8,
                moe_intermediate=768,
                shared_intermediate=0,
                head_dim=128,
                kv_heads=4,
            ),
        ),
        (
            "qwen2_57b_a14b",
            dict(moe_layers=28, n_experts=64, moe_intermediate=2560, shared_intermediate=20480, head_dim=128),
        ),
    ],
)
def test_each_family_config_gives_its_geometry(name, expect):
    geo = from_hf_config(DATA / f"{name}.json")
    for key, value in expect.items():
        assert getattr(geo, key) == value, key


def test_ds4_rows_are_compat_md_layouts():
    geo = from_hf_config(DATA / "deepseek_v4_flash.json")
    assert B.expert_row_bytes(geo, "fp4") == DS4_ROW_FP4
    assert B.expert_row_bytes(geo, "mxfp4") == 13_369_344
    assert B.expert_row_bytes(geo, "fp4q") == 7_864_320
    assert B.expert_row_bytes(geo, "base2") == DS4_ROW_BASE2


# -- the memory model, by hand ---------------------------------------------------------------------
def test_ds4_budget_by_hand_with_measured_parts():
    """96 GiB card, measured dense 8 GiB, KV 1 GiB, activations 0.5 GiB, vLLM's 0.9 share:
    reserve 9.6 GiB; base 11,008 x 7,077,888 B = 72.5625 GiB; pool = 96 - 8 - 72.5625 - 1 -
    0.5 - 9.6 = 4.3375 GiB = floor(4.3375 * 2^30 / 12,582,912) = 370 slots; floor
    43 * 6 * 1.7 = 438 (COMPAT.md), so 68 slots (0.797 GiB) short."""
    geo = from_hf_config(DATA / "deepseek_v4_flash.json")
    inp = B.Inputs(card_gb=96, dense_gb=8, kv_gb=1, activation_gb=0.5)
    b = B.plan_memory(geo, inp)
    assert b.item("resident base") == 11_008 * DS4_ROW_BASE2 == int(72.5625 * GIB)
    assert b.item("reserve") == int(0.1 * 96 * GIB)
    assert b.pool_slots == math.floor(4.3375 * GIB / DS4_ROW_FP4) == 370
    assert b.floor == 438 and not b.floor_holds and b.short_slots == 68
    assert any("68 slots (0.80 GiB) under the fire floor of 438" in line for line in b.does_not_fit)


@pytest.mark.parametrize(
    "spec, seqs, floor", [(0, 1, 438), (1, 1, 877), (2, 1, 1315), (0, 4, 1754), (0, 9, 1754)]
)
def test_floor_is_the_stores_fire_floor(spec, seqs, floor):
    geo = from_hf_config(DATA / "deepseek_v4_flash.json")
    b = B.plan_memory(
        geo, B.Inputs(card_gb=200, spec_tokens=spec, max_seqs=seqs, dense_gb=8, kv_gb=1, activation_gb=1)
    )
    assert b.floor == floor == sizing.fire_floor(43, 6, spec, seqs)


def test_mixtral_dense_and_kv_by_hand():
    """Mixtral-8x7B, bf16: embeddings 32000 x 4096 x 2 (untied) x 2 B = 524,288,000;
    per layer q 4096^2 + k,v 2 x 4096 x 8 x 128 + o 4096^2 = 41,943,040, router 8 x 4096
    = 32,768: 32 x 41,975,808 x 2 B = 2,686,451,712. KV: 32 layers x 2 x 8 x 128 x 2 B =
    131,072 B a token. Expert rows bf16: 3 x 4096 x 14336 x 2 = 352,321,536."""
    geo = from_hf_config(DATA / "mixtral_8x7b.json")
    inp = B.Inputs(card_gb=80, context=4096, max_seqs=3, base_dtype="none", expert_dtype="bf16")
    assert B.non_expert_bytes(geo, inp) == 524_288_000 + 2_686_451_712
    assert B.kv_bytes_per_seq(geo, inp, 4096) == 4096 * 131_072
    b = B.plan_memory(geo, inp)
    assert b.item("KV cache") == 3 * 4096 * 131_072 and b.item("resident base") == 0
    assert b.slot_bytes == 352_321_536
    before = sum(x for n, x, _ in b.items if n not in ("reserve", "pool"))
    assert b.pool_slots == min((80 * GIB - before - int(8 * GIB)) // 352_321_536, 256)


def test_mla_kv_by_hand():
    """DeepSeek-V3 MLA: (512 + 64) x 2 B x 61 layers a token; fp8 halves it; MTP (with
    speculation) adds a layer."""
    geo = from_hf_config(DATA / "deepseek_v3.json")
    assert B.kv_bytes_per_seq(geo, B.Inputs(card_gb=1), 1000) == 1000 * 576 * 2 * 61
    assert B.kv_bytes_per_seq(geo, B.Inputs(card_gb=1, kv_dtype="fp8"), 1000) == 1000 * 576 * 61
    assert B.kv_bytes_per_seq(geo, B.Inputs(card_gb=1, spec_tokens=1), 1000) == 1000 * 576 * 2 * 62


def test_dsv4_kv_by_hand():
    """Sliding window 128 x 512 on all 43 layers; ratio-4 layers (21) add ctx/4 x (512 +
    128 indexer), ratio-128 layers (20) ctx/128 x 512; bf16."""
    geo = from_hf_config(DATA / "deepseek_v4_flash.json")
    ctx = 65536
    want = (43 * 128 * 512 + 21 * (ctx // 4) * (512 + 128) + 20 * (ctx // 128) * 512) * 2
    assert B.kv_bytes_per_seq(geo, B.Inputs(card_gb=1), ctx) == want


def test_max_context_for_the_floor_is_the_edge():
    geo = from_hf_config(DATA / "mixtral_8x7b.json")
    inp = B.Inputs(
        card_gb=48, context=1 << 20, base_dtype="none", expert_dtype="fp8", dense_gb=3, activation_gb=0.5
    )
    b = B.plan_memory(geo, inp)
    edge = b.max_context_for_floor
    assert 0 < edge < inp.context and not b.floor_holds
    at = B.plan_memory(geo, B.Inputs(**{**vars(inp), "context": edge}))
    past = B.plan_memory(geo, B.Inputs(**{**vars(inp), "context": edge + 1}))
    assert at.floor_holds and not past.floor_holds


def test_a_card_too_small_says_by_how_much():
    geo = from_hf_config(DATA / "deepseek_v4_flash.json")
    b = B.plan_memory(geo, B.Inputs(card_gb=31.84, dense_gb=8, kv_gb=1, activation_gb=0.5))
    need = 8 + 72.5625 + 1 + 0.5 + 0.1 * 31.84
    assert b.pool_slots == 0 and b.deficit == pytest.approx((need - 31.84) * GIB, abs=2)
    assert b.does_not_fit[0].startswith("the card (31.84 GiB) is 53.41 GiB short")


@pytest.mark.parametrize("slots", [8, 438, 484, 512, 1044, 10_000])
def test_gib_text_sizes_exactly_the_planned_slots(slots):
    text = gib_text(slots, DS4_ROW_FP4)
    assert sizing.slots_for_gib(float(text), DS4_ROW_FP4) == slots


def test_settings_name_the_planned_pool(capsys):
    rc, out, _ = run(
        capsys,
        "plan",
        "--config",
        str(DATA / "deepseek_v4_flash.json"),
        "--card-gb",
        "95.59",
        "--context",
        "32768",
        "--json",
    )
    plan = json.loads(out)
    slots = plan["budget"]["pool_slots"]
    moet, vllm = plan["settings"]["vllm_moet"]["env"], plan["settings"]["vllm"]["env"]
    assert rc == 0 and sizing.slots_for_gib(float(moet["VLLM_MOE_W2_DELTA_GB"]), DS4_ROW_FP4) == slots
    assert vllm["TIERSTORE_VLLM_VRAM_GB"] == moet["VLLM_MOE_W2_DELTA_GB"]
    assert moet["VLLM_MOE_W2_NUM_LAYERS"] == "43"
    args = plan["settings"]["vllm"]["args"]
    assert args[:2] == ["--quantization", "tierstore"] and "--kv-cache-memory-bytes" in args


def test_prefill_t_follows_seqs_and_spec(capsys):
    rc, out, _ = run(
        capsys,
        "plan",
        "--config",
        str(DATA / "deepseek_v4_flash.json"),
        "--card-gb",
        "400",
        "--max-seqs",
        "64",
        "--spec-tokens",
        "2",
        "--json",
    )
    env = json.loads(out)["settings"]["vllm_moet"]["env"]
    assert rc == 0 and env["VLLM_MOE_W2_PREFILL_T"] == str(64 * 3)


def test_pack_gives_rows_and_must_match_the_config(tmp_path, capsys):
    from tierstore.testing.packs import make_random_pack

    pack = make_random_pack(tmp_path / "p", 4, 16, 9000)
    rc, out, _ = run(
        capsys, "plan", "--pack", str(pack.path), "--top-k", "2", "--hidden", "64", "--card-gb", "1", "--json"
    )
    plan = json.loads(out)
    assert rc == 0 and plan["budget"]["slot_bytes"] == 9000 and plan["budget"]["n_keys"] == 64
    rc, _, err = run(
        capsys,
        "plan",
        "--pack",
        str(pack.path),
        "--config",
        str(DATA / "mixtral_8x7b.json"),
        "--card-gb",
        "80",
    )
    assert rc == 1 and "4 layers x 16 experts, the model has 32 MoE layers x 8" in err
    assert err.count("\n") == 1


def test_table_and_png(tmp_path, capsys):
    png = tmp_path / "plan.png"
    rc, out, _ = run(
        capsys,
        "plan",
        "--config",
        str(DATA / "deepseek_v4_flash.json"),
        "--card-gb",
        "95.59",
        "--png",
        str(png),
    )
    assert rc == 0 and "memory budget" in out and "fire floor: 438 slots" in out
    assert "export VLLM_MOE_W2_DELTA_GB=" in out and png.read_bytes()[:4] == b"\x89PNG"


# -- bad inputs: one line, non-zero ------------------------------------------------------------
NUMERIC = [
    "--card-gb",
    "--context",
    "--max-seqs",
    "--spec-tokens",
    "--reserve-gb",
    "--gpu-util",
    "--pool-gb",
    "--kv-gb",
    "--dense-gb",
    "--tolerance",
    "--layers",
    "--top-k",
]


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flag=st.sampled_from(NUMERIC),
    value=st.sampled_from(
        ["nan", "NaN", "inf", "-inf", "-1", "0x10", "", "1e999", "abc", "1,5", "--", "9" * 40, "2x"]
    ),
)
def test_bad_numbers_are_refused_in_one_line(capsys, flag, value):
    argv = ["plan", "--config", str(DATA / "mixtral_8x7b.json"), "--card-gb", "80", flag, value]
    if flag == "--card-gb":
        argv = argv[:4] + [flag, value]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and not out
    assert err.count("\n") == 1 and flag in err and "Traceback" not in err


@hsettings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mutate=st.sampled_from(
        [
            ("n_routed_experts", float("nan")),
            ("n_routed_experts", "256"),
            ("num_experts_per_tok", -1),
            ("hidden_size", 2.5),
            ("hidden_size", True),
            ("num_hidden_layers", 10**12),
            ("compress_ratios", [4, "x"]),
            ("n_routed_experts", None),
            ("moe_intermediate_size", [1]),
            ("first_k_dense_replace", 43),
        ]
    )
)
def test_bad_configs_are_refused_in_one_line_naming_the_file(tmp_path_factory, capsys, mutate):
    cfg = json.loads((DATA / "deepseek_v4_flash.json").read_text())
    key, value = mutate
    if value is None:
        cfg.pop(key)
    else:
        cfg[key] = value
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(cfg, allow_nan=True))
    rc, out, err = run(capsys, "plan", "--config", str(path), "--card-gb", "96")
    assert rc == 1 and not out and err.count("\n") == 1
    assert str(path) in err and "Traceback" not in err


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "no such config.json"),
        (b"", "config.json"),
        (b'{"a": ', "config.json"),
        (b"[1, 2]", "expected a JSON object"),
        (DATA / "llama_dense.json", "not a mixture-of-experts"),
    ],
)
def test_missing_truncated_or_dense_configs(tmp_path, capsys, content, message):
    path = tmp_path / "config.json"
    if isinstance(content, Path):
        path.write_bytes(content.read_bytes())
    elif content is not None:
        path.write_bytes(content)
    rc, out, err = run(capsys, "plan", "--config", str(path), "--card-gb", "96")
    assert rc in (1, 2) and message in err and err.count("\n") == 1 and not out


def test_flags_without_a_config_name_what_is_missing(capsys):
    rc, _, err = run(capsys, "plan", "--layers", "4", "--card-gb", "1")
    assert rc == 1 and "give --config, or --top-k, --hidden, --experts" in err


def test_a_bad_trace_is_one_line(tmp_path, capsys):
    bad = tmp_path / "t.npy"
    np.save(bad, np.array([[0, 0, 1.5]]))
    rc, _, err = run(
        capsys, "plan", "--config", str(DATA / "mixtral_8x7b.json"), "--card-gb", "80", "--trace", str(bad)
    )
    assert rc == 1 and "expected int32" in err and err.count("\n") == 1


def test_geometry_checks_report_every_problem():
    with pytest.raises(ConfigError, match="top_k must be >= 1.*hidden must be >= 1"):
        Geometry(moe_layers=2, n_experts=4, top_k=0, hidden=0).check()
    with pytest.raises(FormatError, match="compress_ratios must be a list"):
        cfg = DATA / "deepseek_v4_flash.json"
        text = json.loads(cfg.read_text())
        text["compress_ratios"] = {"a": 1}
        tmp = cfg.parent / ".bad-ratios.json"
        tmp.write_text(json.dumps(text))
        try:
            from_hf_config(tmp)
        finally:
            tmp.unlink()


# -- the recommendation against a brute-force replay -------------------------------------------
def _brute_force_best(trace, policies, feasible: int, step: int, tolerance: float) -> int:
    """Smallest pool on a fine grid whose best policy (latency view) is within
    ``tolerance`` of the best at ``feasible`` (every ``step`` slots, replayed)."""
    from tierstore import sim

    prep = sim.Prepared(trace)
    sizes = sorted(set(range(step, feasible + 1, step)) | {feasible})
    res = sim.replay(prep, list(policies), sizes)
    best = {s: max(r.latency_hit_rate for r in res if r.slots == s) for s in sizes}
    target = best[feasible] - tolerance
    return next(s for s in sizes if best[s] >= target)


def _check_recommendation(trace, feasible: int, step: int, policies=("lru", "hybrid")):
    # tolerance 0.05: on these traces the knee then sits inside the grid, not at its end
    curve = hit_curve(
        trace,
        model_keys=trace.n_keys,
        feasible_model_slots=feasible,
        policies=policies,
        tolerance=0.05,
        points=8,
    )
    rec = curve.recommended["slots"]
    best = _brute_force_best(trace, policies, feasible, step, 0.05)
    assert best - step < rec <= best, (rec, best, step)
    assert rec < curve.grid[-1] - step  # a real choice, not the largest pool
    assert curve.recommended["policy"] in policies
    at = [r for r in curve.results if r.slots == rec]
    assert {r.policy for r in at} == set(policies) | {CEILING}
    mn = next(r for r in at if r.policy == CEILING)
    assert mn.latency_hit_rate >= curve.recommended["hit_rate"] - 1e-9  # MIN bounds them


def test_recommendation_on_a_synthetic_trace_is_within_one_step_of_replay():
    from tierstore.sim import synth

    trace = synth.synthetic_trace(
        192, n_layers=8, n_experts=32, top_k=4, prefill_tokens=32, prefill_every=96, seed=3
    )
    _check_recommendation(trace, feasible=256, step=4)


@pytest.mark.skipif(not REAL_TRACE.exists(), reason="shared/traces not present")
def test_recommendation_on_the_real_trace_is_within_one_step_of_replay():
    from tierstore.sim.traces import load_trace

    _check_recommendation(load_trace(REAL_TRACE), feasible=512, step=16)


def test_recommendation_is_raised_to_the_fire_floor():
    from tierstore.sim import synth

    trace = synth.synthetic_trace(96, n_layers=4, n_experts=32, top_k=4, prefill_tokens=0, seed=1)
    free = hit_curve(trace, model_keys=trace.n_keys, feasible_model_slots=120, policies=("lru",))
    knee = free.recommended["slots"]
    held = hit_curve(
        trace,
        model_keys=trace.n_keys,
        feasible_model_slots=120,
        floor_model_slots=knee + 10,
        policies=("lru",),
    )
    assert held.recommended["slots"] == knee + 10 and held.recommended["raised_to_floor"]


def test_grid_is_geometric_and_ends_at_what_fits():
    grid = geometric_grid(11_008, 484, 12)
    assert grid[0] == 86 and grid[-1] == 484 and grid == sorted(set(grid))
    ratios = np.diff(np.log(grid))
    assert ratios.max() - ratios.min() < 0.05
