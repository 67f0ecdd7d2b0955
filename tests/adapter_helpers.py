"""Shared helpers for the adapter tests (not a test module).

A small generated model (real MXFP4 / 2-bit quantisation, heavy-tailed weights)
is written once per process as the ``fp4`` and ``base`` packs; each test opens its own
serving tier (the upstream vLLM face, adapters/vllm_tier.py) on it, and drives it with
``TinyDecoder``, a residual stack of the model's MoE layers.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile

import pytest
import torch

L, E, H, I = 3, 8, 64, 64
P = "VLLM_MOE_W2_"


@functools.cache
def model_and_dir(n_layers: int = L, n_experts: int = E, seed: int = 1):
    from tierstore.testing.model import make_moe_model, write_model_packs

    model = make_moe_model(n_layers, n_experts, H, I, seed=seed)
    d = tempfile.mkdtemp(prefix="tierstore-adapter-")
    atexit.register(shutil.rmtree, d, True)
    fp4, base = write_model_packs(model, d)
    model_and_dir.packs = getattr(model_and_dir, "packs", {})
    model_and_dir.packs[d] = {"fp4": fp4, "base": base}
    return model, d


def make_tier(store_dir: str, slots: int | None = 16, device="cpu", **options):
    """The serving tier over the model packs in ``store_dir``: a pool of exactly ``slots``
    slots (None: auto), sized as the worker does (finalize), a small arena."""
    from tierstore.adapters.vllm_tier import ServingTier

    options.setdefault("threads", 2)
    options.setdefault("ram_gb", 64 * 8192 / 2**30)
    if slots is not None:
        options["vram_slots"] = int(slots)
    tier = ServingTier(model_and_dir.packs[store_dir], device=device, **options)
    tier.finalize()
    return tier


class TinyDecoder:
    """Residual stack of the model's MoE layers + an LM head, weights on ``device``; its
    forward calls a tier as vLLM's MoE layers do (mark_seen, ensure_resident on prefill,
    moe_w2_forward)."""

    def __init__(
        self, model, top_k: int, vocab: int = 64, device="cpu", seed: int = 0, logit_std: float = 8.0
    ):
        self.top_k, self.n_layers = int(top_k), model.n_layers
        g = torch.Generator().manual_seed(seed + 1)
        self.router = model.router.to(device)  # [L, H, E]
        scale = logit_std / model.H**0.5  # std ~logit_std over 64 words: sure and unsure rows
        self.head = (torch.randn(model.H, vocab, generator=g) * scale).to(device)

    def route(self, h: torch.Tensor, layer: int):
        logits = h.float() @ self.router[layer]
        w, ids = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
        return w / w.sum(-1, keepdim=True), ids.to(torch.int32)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        hn = h.float() * torch.rsqrt(h.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return hn @ self.head

    def forward(self, tier, x: torch.Tensor, prefill: bool = False) -> torch.Tensor:
        h = x
        for layer in range(self.n_layers):
            w, ids = self.route(h, layer)
            if prefill:
                tier.ensure_resident(layer, ids)
            tier.mark_seen(layer, ids)
            h = h + tier.moe_w2_forward(h, w, ids, layer)
        return self.logits(h)


@pytest.fixture
def one_torch_thread():
    """Tiny tensors on a shared 2-core machine: intra-op threads only add contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
