"""CUDA decode path of ``tierstore.moe.fused_moe`` (T <= 16): argument checks that need
no host sync, scratch allocation on torch's current stream, and the launch of
``tierstore._C.moe_decode`` (csrc/kernels/src/moe_decode.cu). Capturable in a CUDA graph."""
from __future__ import annotations

import torch

from tierstore.compute.checks import DECODE_MAX_TOKENS, check_moe_args
from tierstore.errors import ConfigError

_prepared: set[int] = set()
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def _prepare(device_index: int) -> None:
    # Module load must not happen inside graph capture; do it on the first eager call.
    if device_index in _prepared or torch.cuda.is_current_stream_capturing():
        return
    from tierstore import _C
    _C.moe_decode_prepare(device_index)
    _prepared.add(device_index)


def _same_device(name: str, t: torch.Tensor, dev: torch.device) -> None:
    if t.device != dev:
        raise ConfigError(f"fused_moe (cuda): {name} is on {t.device}, x is on {dev}")


def decode_workspace(T: int, k: int, H: int, I: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch for one call: (h float32 [T*k, I], y float32 [T*k, H])."""
    return (torch.empty(T * k, I, dtype=torch.float32, device=device),
            torch.empty(T * k, H, dtype=torch.float32, device=device))


def fused_moe_decode(x, topk_weights, topk_ids, layer: int, store, base, *, out=None,
                     workspace=None) -> torch.Tensor:
    """The decode kernel. Same contract as ``fused_moe``; fp16 inputs run in fp32.

    ``out`` ([T, H], x's dtype) and ``workspace`` (from ``decode_workspace``) may be
    given to keep every address fixed, e.g. across CUDA-graph replays."""
    from tierstore import _C
    check_moe_args(x, topk_weights, topk_ids, layer, store, base)
    T, k = topk_ids.shape
    if T > DECODE_MAX_TOKENS or k > 16:
        raise ConfigError(f"fused_moe (cuda): T={T}, k={k}; the decode kernel takes T <= "
                          f"{DECODE_MAX_TOKENS} and k <= 16")
    dev = x.device
    for name, t in (("slot_table", store.slot_table), ("pool", store.pool),
                    ("base.rows", base.rows), ("topk_ids", topk_ids),
                    ("topk_weights", topk_weights)):
        _same_device(name, t, dev)
    if store.slot_table.dtype != torch.int32 or not store.slot_table.is_contiguous():
        raise ConfigError(f"fused_moe (cuda): slot_table must be contiguous int32, found "
                          f"{store.slot_table.dtype}")
    if store.pool.dtype != torch.uint8 or not store.pool.is_contiguous():
        raise ConfigError("fused_moe (cuda): pool must be a contiguous uint8 tensor")
    in_dtype = x.dtype
    xc = x if in_dtype in _DTYPES else x.float()
    xc = xc.contiguous()
    if xc.data_ptr() % 16:              # the kernel stages x with 16/8-byte vector loads
        xc = xc.clone()
    ids = topk_ids.to(torch.int32).contiguous()        # device ops: no host sync
    w = topk_weights.to(torch.float32).contiguous()
    H, I = base.H, base.I
    if out is not None and (out.shape != x.shape or out.dtype != in_dtype or out.device != dev
                            or not out.is_contiguous()):
        raise ConfigError(f"fused_moe (cuda): out must be contiguous {in_dtype} {list(x.shape)} "
                          f"on {dev}, found {out.dtype} {list(out.shape)} on {out.device}")
    result = out if out is not None and out.dtype == xc.dtype else torch.empty_like(xc)
    h, y = workspace if workspace is not None else decode_workspace(T, k, H, I, dev)
    if h.shape != (T * k, I) or y.shape != (T * k, H) or h.dtype != torch.float32 \
            or y.dtype != torch.float32 or h.device != dev or y.device != dev:
        raise ConfigError(f"fused_moe (cuda): workspace must be float32 [{T * k}, {I}] and "
                          f"[{T * k}, {H}] on {dev}")
    E = base.n_experts
    slot_row = store.slot_table.data_ptr() + layer * E * 4
    base_rows = base.rows.data_ptr() + layer * E * base.rows.shape[-1]
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    _prepare(index)
    try:
        _C.moe_decode(xc.data_ptr(), result.data_ptr(), _DTYPES[xc.dtype], ids.data_ptr(),
                      w.data_ptr(), T, k, slot_row, E, store.pool.shape[0], store.pool.data_ptr(),
                      store.pool.shape[1], base_rows, base.rows.shape[-1], H, I,
                      h.data_ptr(), y.data_ptr(), index, torch.cuda.current_stream(dev).cuda_stream)
    except ValueError as exc:           # std::invalid_argument from the argument checks
        raise ConfigError(str(exc)) from None
    if result.dtype == in_dtype:
        return result
    if out is not None:
        return out.copy_(result)
    return result.to(in_dtype)
