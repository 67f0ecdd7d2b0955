"""Building real vLLM 0.34 MoE layers (FusedMoEFactory) with --quantization tierstore,
on CPU or CUDA, for tests/adapters/test_adapter_vllm_layers.py and test_adapter_vllm_gpu.py.

vLLM is imported on first use. On a machine without CUDA vLLM resolves the
UnspecifiedPlatform (VLLM_TARGET_DEVICE must NOT be "cpu": its CpuPlatform demands
triton-cpu), so the VllmConfig gets an explicit DeviceConfig(device=...)."""

from __future__ import annotations

import os

import pytest
import torch

from tierstore.adapters import vllm as hook

REQUIRE = os.environ.get("TIERSTORE_TEST_REQUIRE_VLLM") == "1"  # .ci/run: absent vLLM fails


def need_vllm():
    if hook.vllm_available():
        return
    if REQUIRE:
        pytest.fail("TIERSTORE_TEST_REQUIRE_VLLM=1 but vLLM does not import; see .ci/vllm-requirements.txt")
    pytest.skip("vLLM is not installed (CI installs it: .ci/vllm-requirements.txt)")


def vllm_config(device: str = "cpu"):
    from vllm.config import DeviceConfig, VllmConfig

    return VllmConfig(device_config=DeviceConfig(device=device))


def softmax_topk(hidden_states, gating_output, topk: int, renormalize: bool):
    """Softmax top-k in torch, through vLLM's custom_routing_function hook: the
    default router calls vLLM's compiled topk_softmax op, which a CPU torch without
    vLLM's _C extension does not have, and the GPU machine's torch is not the one
    vLLM 0.34's _C was built for either. Routing is not what these tests check."""
    w, ids = torch.topk(torch.softmax(gating_output.float(), dim=-1), topk, dim=-1)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    return w.contiguous(), ids.to(torch.int32).contiguous()


def build_layers(
    qc, prefixes, *, E: int, H: int, I: int, top_k: int, dtype=torch.bfloat16, device: str = "cpu"
):
    """One MoERunner per prefix, built by vLLM's own FusedMoEFactory with ``qc``."""
    extra = {"custom_routing_function": softmax_topk}
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.layer import FusedMoEFactory

    with set_current_vllm_config(vllm_config(device)):
        return [
            FusedMoEFactory(
                num_experts=E,
                top_k=top_k,
                hidden_size=H,
                intermediate_size=I,
                params_dtype=dtype,
                tp_size=1,
                dp_size=1,
                pcp_size=1,
                quant_config=qc,
                prefix=p,
                **extra,
            )
            for p in prefixes
        ]


def checkpoint_weights(model, layer: int, fmt: str = "bf16"):
    """(name, tensor) pairs as a checkpoint holds MoE layer ``layer`` of ``model``
    (tierstore.testing.model), relative to the experts module, in ``fmt``."""
    from tierstore.format import fp4

    out = []
    for e in range(model.n_experts):
        w13, w2 = model.w13[layer][e].float(), model.w2[layer][e].float()
        mats = {"gate_proj": w13[: model.I], "up_proj": w13[model.I :], "down_proj": w2}
        for name, w in mats.items():
            base = f"{e}.{name}"
            if fmt == "bf16":
                out.append((f"{base}.weight", w.to(torch.bfloat16)))
            elif fmt == "fp8":
                amax = w.abs().reshape(w.shape[0] // 32, 32, w.shape[1] // 32, 32).amax((1, 3))
                s = (amax / 448.0).clamp(min=1e-12)
                q = (w / s.repeat_interleave(32, 0).repeat_interleave(32, 1)).to(torch.float8_e4m3fn)
                out += [(f"{base}.weight", q), (f"{base}.weight_scale_inv", s)]
            elif fmt == "mxfp4":
                q, s = fp4.quantize_mxfp4(w)
                out += [(f"{base}.weight", q), (f"{base}.weight_scale", s)]
            elif fmt == "nvfp4":
                q, s, g = fp4.quantize_nvfp4(w)
                out += [
                    (f"{base}.weight", q),
                    (f"{base}.weight_scale", s),
                    (f"{base}.weight_scale_2", torch.tensor(g, dtype=torch.float32)),
                ]
            else:
                raise ValueError(fmt)
    return out


def route(runner, x: torch.Tensor, logits: torch.Tensor):
    """vLLM's own router for this layer (what MoERunner does before apply)."""
    method = runner.routed_experts.quant_method
    return runner.router.select_experts(x, logits, topk_indices_dtype=method.topk_indices_dtype)


def layer_forward(runner, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Routing by vLLM's router, then the layer's quant method exactly as
    RoutedExperts.forward_modular calls it (keywords)."""
    w, ids = route(runner, x, logits)
    layer = runner.routed_experts
    return layer.quant_method.apply(
        layer=layer, x=x, topk_weights=w, topk_ids=ids, shared_experts=None, shared_experts_input=None
    )
