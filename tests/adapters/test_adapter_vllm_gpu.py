"""CUDA graphs through vLLM 0.34's real MoE layer objects with --quantization tierstore.

Self-contained: builds the layers with vLLM's FusedMoEFactory on "cuda", writes the
packs at first boot through vLLM's loader, finalizes the tier (pool + slot table
allocated once), then for each capture size captures ``quant_method.apply`` exactly
as RoutedExperts calls it, changes residency (promotions and evictions), replays and
compares with an eager call on the same state.

Skips (with the reason) without CUDA or without an importable vLLM. Sizes above the
decode kernel's 16 tokens need the graph-capturable grouped MoE path (issue 17); until
``tierstore.compute.moe.fused_moe`` has one, their capture fails and is reported as
xfail naming that, not as a pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from vllm_layer_helpers import build_layers, checkpoint_weights, need_vllm, route

from tierstore.adapters import vllm_quant
from tierstore.compute.checks import DECODE_MAX_TOKENS
from tierstore.testing.model import make_moe_model

pytestmark = pytest.mark.gpu
E, H, I, K = 32, 128, 128, 4
PREFIXES = ("model.layers.1.mlp.experts", "model.layers.2.mlp.experts")
SIZES = (1, 8, 64, 256, 512)


@pytest.fixture(scope="module")
def booted(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    need_vllm()
    from tierstore.format import layouts

    model = make_moe_model(len(PREFIXES), E, H, I, seed=5)
    env = {
        "dir": None,
        "vram_gb": 24 * layouts.row_bytes("fp4", H, I) / 2**30,
        "ram_gb": 0.0,
        "prefill_tokens": 16,
        "mode": "tiered",
    }
    rt = vllm_quant.Runtime(
        pack_dir=str(tmp_path_factory.mktemp("packs")), ckpt_id="gpu-test", n_layers=4, device="cuda", env=env
    )
    qc = vllm_quant.config_class()(None, rt)
    runners = build_layers(qc, PREFIXES, E=E, H=H, I=I, top_k=K, device="cuda")
    for i, r in enumerate(runners):
        list(r.routed_experts.load_weights(checkpoint_weights(model, i)))
    for r in runners:
        r.routed_experts.quant_method.process_weights_after_loading(r.routed_experts)
    rt.tier.finalize()
    yield model, runners, rt.tier
    rt.tier.shutdown()


def _apply(runner, x, w, ids):
    layer = runner.routed_experts
    return layer.quant_method.apply(
        layer=layer, x=x, topk_weights=w, topk_ids=ids, shared_experts=None, shared_experts_input=None
    )


def _churn(tier, rng, layer: int):
    """Evict some residents, promote others: the slot table changes under the graph."""
    store = tier.store
    resident = store.resident_keys()
    if len(resident):
        drop = resident[rng.choice(len(resident), size=max(1, len(resident) // 3), replace=False)]
        store.evict(drop)
    keys = [(layer, int(e)) for e in rng.choice(E, size=12, replace=False)]
    store.promote(keys).wait()
    store.wait_idle()


@pytest.mark.parametrize("size", SIZES)
def test_graph_replay_equals_eager_after_promotions_and_evictions(booted, size):
    model, runners, tier = booted
    rng = np.random.default_rng(size)
    runner = runners[size % 2]
    layer = runner.routed_experts.quant_method.layer_index
    x = model.tokens(size, seed=size).to("cuda", torch.bfloat16)
    logits = x.float() @ model.router[layer].cuda()
    w, ids = route(runner, x, logits)
    _churn(tier, rng, layer)
    _apply(runner, x, w, ids)  # warm up outside capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with tier.quiet(), torch.cuda.graph(graph):
            out = _apply(runner, x, w, ids)
    except Exception as exc:  # torch raises several types for a broken capture
        torch.cuda.synchronize()
        if size > DECODE_MAX_TOKENS:
            pytest.xfail(
                f"T={size} > {DECODE_MAX_TOKENS}: fused_moe has no graph-capturable "
                f"grouped path yet (issue 17): {type(exc).__name__}: {exc}"
            )
        raise
    for _ in range(3):
        _churn(tier, rng, layer)
        tier.seen.zero_()
        graph.replay()
        torch.cuda.synchronize()
        eager = _apply(runner, x, w, ids)
        torch.testing.assert_close(out, eager, rtol=0, atol=0)
        assert int(tier.seen[layer].sum()) > 0  # mark_seen replays in the graph
    assert int((tier.store.slot_table >= 0).sum()) > 0
