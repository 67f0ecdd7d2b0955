"""The CUDA decode kernels, run unchanged on CPU threads (csrc/kernels/tests/moe_cpu_emulation.cpp),
against the fp64 torch reference: catches indexing, staging and barrier mistakes on a
machine with no GPU. Arithmetic differs from the GPU only in exp (exact here) and in
bf16 rounding being done by the shim."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tierstore.compute.moe import BaseWeights, StaticPool, fused_moe_reference
from tierstore.testing.model import random_expert_rows

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    exe = tmp_path_factory.mktemp("emu") / "moe_cpu_emulation"
    cmd = [
        cxx,
        "-std=c++20",
        "-O2",
        "-pthread",
        "-Wno-unknown-pragmas",
        f"-I{ROOT / 'csrc/kernels/include'}",
        str(ROOT / "csrc/kernels/tests/moe_cpu_emulation.cpp"),
        "-o",
        str(exe),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"emulator build failed:\n{res.stderr[-3000:]}")
    return exe


def _run(emulator, tmp_path, x, w, ids, layer, pool, base, kernel=0):
    T, k = ids.shape
    bf16 = x.dtype == torch.bfloat16
    meta = [
        T,
        k,
        base.n_experts,
        pool.pool.shape[0],
        base.H,
        base.I,
        int(bf16),
        pool.pool.shape[1],
        base.rows.shape[-1],
        kernel,
    ]
    (tmp_path / "meta.txt").write_text(" ".join(map(str, meta)))
    xb = x.contiguous().view(torch.int16) if bf16 else x.float().contiguous()
    xb.numpy().tofile(tmp_path / "x.bin")
    ids.to(torch.int32).numpy().tofile(tmp_path / "ids.bin")
    w.float().numpy().tofile(tmp_path / "w.bin")
    pool.slot_table[layer].numpy().tofile(tmp_path / "slot.bin")
    pool.pool.numpy().tofile(tmp_path / "pool.bin")
    base.rows[layer].numpy().tofile(tmp_path / "base.bin")
    res = subprocess.run([str(emulator), str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    raw = np.fromfile(tmp_path / "out.bin", dtype=np.int16 if bf16 else np.float32)
    out = torch.from_numpy(raw.copy()).reshape(T, base.H)
    return out.view(torch.bfloat16) if bf16 else out


def _setup(E=6, H=128, I=96, seed=0):
    # I = 96: a K (for w2) that is not a multiple of the 512-element chunk, nor of 64
    fp4_rows = random_expert_rows(2 * E, "fp4", H, I, seed).reshape(2, E, -1)
    base = BaseWeights(random_expert_rows(2 * E, "base", H, I, seed + 1).reshape(2, E, -1), H, I)
    return StaticPool(fp4_rows, E), base


def _rel(got, ref):
    assert not torch.isnan(got).any(), "NaN in the kernel output (an element was never written)"
    return float((got.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_emulated_kernel_matches_reference_with_mixed_residency(emulator, tmp_path, dtype):
    pool, base = _setup()
    pool.promote([(1, 4), (1, 0), (0, 3), (1, 2)])  # slots != expert ids
    ids = torch.tensor([[0, 1, 2], [3, 4, 5], [2, 0, 5], [1, 3, 4], [5, 2, 1]])
    w = torch.rand(5, 3) + 0.1
    x = torch.randn(5, 128).to(dtype)
    got = _run(emulator, tmp_path, x, w, ids, 1, pool, base)
    ref = fused_moe_reference(x, w, ids, 1, pool, base, dtype=torch.float64)
    rel = _rel(got, ref)
    assert rel < (1e-5 if dtype == torch.float32 else 1e-2), rel
    if dtype == torch.bfloat16:
        assert rel > 1e-3, rel  # really rounded to bf16


def test_emulated_kernel_long_k_shared_experts_and_invalid_ids(emulator, tmp_path):
    # H = 1088 = one full 1024-element chunk + a 64-element tail for w13; expert 1 takes
    # 17 pairs (three passes of 8); -1 and E + 3 contribute nothing.
    E, H, I = 4, 1088, 64
    pool, base = _setup(E=E, H=H, I=I, seed=5)
    pool.promote([(0, 1), (0, 2)])
    T = 10
    ids = torch.tensor([[1, 1]] * 8 + [[1, -1], [E + 3, 0]])
    w = torch.rand(T, 2) + 0.1
    x = torch.randn(T, H)
    got = _run(emulator, tmp_path, x, w, ids, 0, pool, base)
    ref = fused_moe_reference(x, w, ids, 0, pool, base, dtype=torch.float64)
    assert _rel(got, ref) < 1e-5


@pytest.mark.parametrize("ids", [[[2, 2, 5]], [[0, 3, 3], [3, 1, 0]]])
def test_emulated_kernel_small_t_batches_repeated_ids(emulator, tmp_path, ids):
    # T = 1 and 2 stage 1 and 2 pairs per pass: a repeated id in a token takes a second
    # pass over the expert; residency mixed so both codecs run.
    pool, base = _setup(seed=9)
    pool.promote([(1, 2), (1, 3)])
    ids = torch.tensor(ids)
    T = ids.shape[0]
    w = torch.rand(T, 3) + 0.1
    x = torch.randn(T, 128)
    got = _run(emulator, tmp_path, x, w, ids, 1, pool, base)
    ref = fused_moe_reference(x, w, ids, 1, pool, base, dtype=torch.float64)
    assert _rel(got, ref) < 1e-5


# ---- the tensor-core grouped kernels (kernel=1): routing, tiles, mma fragments ------


def _mma_check(emulator, tmp_path, x, w, ids, layer, pool, base):
    got = _run(emulator, tmp_path, x, w, ids, layer, pool, base, kernel=1)
    ref = fused_moe_reference(x, w, ids, layer, pool, base, dtype=torch.float64)
    rel = _rel(got, ref)
    if x.dtype == torch.float32:
        assert rel < 1e-5, rel  # 3 bf16 terms of x and h: f32-exact weights
    else:
        assert 1e-3 < rel < 1e-2, rel
    return rel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_emulated_mma_kernel_mixed_residency(emulator, tmp_path, dtype):
    pool, base = _setup()
    pool.promote([(1, 4), (1, 0), (0, 3), (1, 2)])
    ids = torch.tensor([[0, 1, 2], [3, 4, 5], [2, 0, 5], [1, 3, 4], [5, 2, 1]])
    w = torch.rand(5, 3) + 0.1
    _mma_check(emulator, tmp_path, torch.randn(5, 128).to(dtype), w, ids, 1, pool, base)


def test_emulated_mma_kernel_long_k_invalid_ids_and_multi_tile_groups(emulator, tmp_path):
    # H = 1088: 34 scale blocks = 8 full chunks + a 2-block tail, split over the 8 warps;
    # expert 1 takes 17 pairs = 3 tiles of 8; -1 and E + 3 contribute nothing.
    E, H, I = 4, 1088, 64
    pool, base = _setup(E=E, H=H, I=I, seed=5)
    pool.promote([(0, 1), (0, 2)])
    ids = torch.tensor([[1, 1]] * 8 + [[1, -1], [E + 3, 0]])
    w = torch.rand(10, 2) + 0.1
    _mma_check(emulator, tmp_path, torch.randn(10, H), w, ids, 0, pool, base)


@pytest.mark.parametrize("T,dtype", [(40, torch.float32), (72, torch.bfloat16)])
def test_emulated_mma_kernel_wide_tiles(emulator, tmp_path, T, dtype):
    # E = 3, k = 2: mean pairs per expert 27 (T=40) / 48 (T=72) -> 32-pair tiles (nt8 = 4);
    # random -1 holes; T=72 bf16 also has groups that span two tiles.
    E, H, I = 3, 64, 32
    pool, base = _setup(E=E, H=H, I=I, seed=T)
    pool.promote([(0, 1)])
    g = torch.Generator().manual_seed(T)
    ids = torch.randint(-1, E, (T, 2), generator=g)
    w = torch.rand(T, 2, generator=g) + 0.1
    _mma_check(emulator, tmp_path, torch.randn(T, H, generator=g).to(dtype), w, ids, 0, pool, base)


def test_emulated_mma_kernel_middle_tiles(emulator, tmp_path):
    # mean 12 pairs per expert -> 16-pair tiles (nt8 = 2), every expert in the base or the pool
    E, H, I = 4, 96, 64
    pool, base = _setup(E=E, H=H, I=I, seed=11)
    pool.promote([(1, 0), (1, 3)])
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, E, (24, 2), generator=g)
    w = torch.rand(24, 2, generator=g) + 0.1
    _mma_check(emulator, tmp_path, torch.randn(24, H, generator=g), w, ids, 1, pool, base)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    T=st.integers(1, 40),
    k=st.integers(1, 4),
    n_res=st.integers(0, 6),
    bf16=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_emulated_mma_property_random_slot_tables(emulator, tmp_path_factory, T, k, n_res, bf16, seed):
    """Random slot tables (-1 mixes, slots out of expert order, stale slots >= n_slots) and
    ids with -1 / >= E holes: the grouped kernels match fp64 (the GPU twin of this test is
    tests/compute/test_moe_mma_gpu.py::test_mma_property_random_slot_tables)."""
    E, H, I = 6, 64, 32
    g = torch.Generator().manual_seed(seed)
    pool, base = _setup(E=E, H=H, I=I, seed=seed % 1000)
    pool.slot_table.fill_(-1)
    chosen = torch.randperm(E, generator=g)[:n_res]
    pool.slot_table[0, chosen] = torch.randint(0, E + 2, (n_res,), generator=g, dtype=torch.int32)
    ids = torch.randint(-2, E + 2, (T, k), generator=g)
    w = torch.rand(T, k, generator=g) + 0.1
    x = torch.randn(T, H, generator=g).to(torch.bfloat16 if bf16 else torch.float32)
    got = _run(emulator, tmp_path_factory.mktemp("prop"), x, w, ids, 0, pool, base, kernel=1)
    ref = fused_moe_reference(x, w, ids, 0, pool, base, dtype=torch.float64)
    if float(ref.norm()) == 0.0:
        assert torch.equal(got.float(), torch.zeros(T, H))
        return
    assert _rel(got, ref) < (1e-2 if bf16 else 1e-5)
