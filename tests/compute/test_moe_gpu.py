"""The CUDA decode kernel against the fp64 reference (needs a GPU; skipped without one).

Every failure message carries the diagnostics needed to debug from one run: relative
error, worst element (token, column, got, expected), NaN count, per-token errors and
which experts were resident."""

from __future__ import annotations

import pytest
import torch
from moe_helpers import diag as _diag

from tierstore.compute.moe import BaseWeights, StaticPool, fused_moe, fused_moe_reference
from tierstore.testing.model import random_expert_rows

pytestmark = pytest.mark.gpu


def _setup(L=2, E=16, H=256, I=128, n_slots=16, seed=0, device="cuda"):
    fp4_rows = random_expert_rows(L * E, "fp4", H, I, seed, device).reshape(L, E, -1)
    base = BaseWeights(
        random_expert_rows(L * E, "base", H, I, seed + 1, device).reshape(L, E, -1), H, I, device
    )
    return StaticPool(fp4_rows, n_slots, device), base


def _routing(T, E, k, seed, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    w = torch.rand(T, k, generator=g) + 0.1
    return w.to(device), ids.to(device)


def _run(x, w, ids, layer, pool, base):
    out = torch.full_like(x, float("nan"))  # poison: every element must be written
    from tierstore.compute.moe_cuda import decode_workspace, fused_moe_decode

    ws = decode_workspace(x.shape[0], ids.shape[1], base.H, base.I, x.device)
    for t in ws:
        t.fill_(float("nan"))
    fused_moe_decode(x, w, ids, layer, pool, base, out=out, workspace=ws)
    torch.cuda.synchronize()
    return out


@pytest.mark.parametrize("T", [1, 3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_matches_fp64_reference_mixed_residency(T, dtype):
    pool, base = _setup()
    pool.promote([(1, e) for e in (0, 3, 5, 6, 9, 12, 15)] + [(0, 1)])
    torch.cuda.synchronize()
    w, ids = _routing(T, 16, 4, seed=T)
    x = torch.randn(T, 256, device="cuda").to(dtype)
    got = _run(x, w, ids, 1, pool, base)
    ref = fused_moe_reference(x, w, ids, 1, pool, base, dtype=torch.float64)
    rel, msg = _diag(got, ref, f"T={T} {dtype}")
    assert got.dtype == dtype and not torch.isnan(got).any(), msg
    if dtype == torch.float32:
        assert rel < 1e-3, msg
    else:
        assert 1e-3 <= rel < 1e-2, msg


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_kernel_at_ds4_shape(dtype):
    H, I, E, k = 4096, 2048, 24, 6
    pool, base = _setup(L=1, E=E, H=H, I=I, n_slots=E)
    pool.promote([(0, e) for e in range(0, E, 2)])
    w, ids = _routing(16, E, k, seed=7)
    x = torch.randn(16, H, device="cuda").to(dtype)
    got = _run(x, w, ids, 0, pool, base)
    ref = fused_moe_reference(x, w, ids, 0, pool, base, dtype=torch.float64)
    rel, msg = _diag(got, ref, f"DS4 {dtype}")
    assert not torch.isnan(got).any(), msg
    assert rel < (1e-3 if dtype == torch.float32 else 1e-2), msg


def test_shared_experts_over_16_pairs_and_invalid_ids():
    pool, base = _setup(E=4)
    pool.promote([(0, 2)])
    T = 16
    ids = torch.tensor([[2, 2, 1]] * 8 + [[3, -1, 2]] * 4 + [[0, 7, 2]] * 4, device="cuda")  # 7 >= E
    w = torch.rand(T, 3, device="cuda") + 0.1
    x = torch.randn(T, 256, device="cuda")
    got = _run(x, w, ids, 0, pool, base)
    ref = fused_moe_reference(x, w, ids, 0, pool, base, dtype=torch.float64)
    rel, msg = _diag(got, ref, "shared + invalid")
    assert not torch.isnan(got).any() and rel < 1e-3, msg


def test_dispatch_split_batches_agree_with_the_whole_batch():
    pool, base = _setup()
    w, ids = _routing(32, 16, 4, seed=1)
    x = torch.randn(32, 256, device="cuda")
    big = fused_moe(x, w, ids, 0, pool, base)  # one grouped call (T = 32)
    small = torch.cat(
        [
            fused_moe(x[:16], w[:16], ids[:16], 0, pool, base),
            fused_moe(x[16:], w[16:], ids[16:], 0, pool, base),
        ]
    )
    rel, msg = _diag(small, big, "dispatch")
    assert rel < 1e-3, msg


def test_cuda_graph_replay_sees_slot_table_changes():
    pool, base = _setup()
    T, k = 8, 4
    w, ids = _routing(T, 16, k, seed=3)
    x = torch.randn(T, 256, device="cuda")
    from tierstore.compute.moe_cuda import decode_workspace, fused_moe_decode

    out = torch.full_like(x, float("nan"))
    ws = decode_workspace(T, k, 256, 128, "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm up off the capture
        fused_moe_decode(x, w, ids, 1, pool, base, out=out, workspace=ws)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe_decode(x, w, ids, 1, pool, base, out=out, workspace=ws)
    for step, promote in enumerate([[], [(1, int(e)) for e in ids[0]], [(1, e) for e in range(16)]]):
        pool.promote(promote)
        x.copy_(torch.randn(T, 256, device="cuda"))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = fused_moe_reference(x, w, ids, 1, pool, base, dtype=torch.float64)
        rel, msg = _diag(out, ref, f"graph replay {step} (resident {int((pool.slot_table[1] >= 0).sum())})")
        assert not torch.isnan(out).any() and rel < 1e-3, msg
