"""Shared helpers for the adapter tests (not a test module).

A small generated model (real MXFP4 / 2-bit quantisation, heavy-tailed weights)
is written once per process as the ``fp4`` and ``base`` packs a vLLM-Moet store
directory would hold; each test opens its own MoetTier on it.
"""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile

import pytest
import torch

from tierstore.adapters.moet_config import from_env

L, E, H, I = 3, 8, 64, 64
P = "VLLM_MOE_W2_"


@functools.lru_cache(maxsize=None)
def model_and_dir(n_layers: int = L, n_experts: int = E, seed: int = 1):
    from tierstore.testing.model import make_moe_model, write_model_packs
    model = make_moe_model(n_layers, n_experts, H, I, seed=seed)
    d = tempfile.mkdtemp(prefix="tierstore-adapter-")
    atexit.register(shutil.rmtree, d, True)
    write_model_packs(model, d)
    return model, d


def slot_bytes() -> int:
    from tierstore.format import fp4
    from tierstore.format import layouts
    return layouts.row_bytes("fp4", H, I)


def env_for(store_dir: str, slots: int | None = 16, **extra) -> dict:
    """Environment of a tier on ``store_dir``: a pool of exactly ``slots`` slots
    (None: auto), a tiny arena, the gate armed."""
    env = {P + "STORE_DIR": store_dir, P + "TIERSTORE_RAM_GB": repr(64 * 8192 / 2**30),
           P + "STORE_THREADS": "2", P + "GATE": "1"}
    env[P + "DELTA_GB"] = "auto" if slots is None else repr(slots * slot_bytes() / 2**30)
    env.update({P + k: str(v) for k, v in extra.items()})
    return env


def make_tier(store_dir: str, slots: int | None = 16, device="cpu", **extra):
    from tierstore.adapters.moet_native import MoetTier
    return MoetTier(from_env(env_for(store_dir, slots, **extra)), device=device)


@pytest.fixture
def one_torch_thread():
    """Tiny tensors on a shared 2-core machine: intra-op threads only add contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
