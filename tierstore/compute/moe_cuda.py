"""CUDA paths of ``tierstore.compute.moe.fused_moe``: argument checks that need no host
sync, scratch allocation on torch's current stream, and the launches of

* ``tierstore._C.moe_mma`` (csrc/kernels/src/moe_mma.cuh): the tensor-core grouped path,
  any T: pairs sorted by expert on the device into fixed-size worst-case buffers, one
  tile per <= 8..32 pairs of an expert, mma.sync bf16 with in-register dequantisation;
* ``tierstore._C.moe_decode`` (csrc/kernels/src/moe_gemv.cuh): the v2 FFMA decode GEMV,
  T <= 16, kept as the comparison point of bench/bench_moe.py.

Both read the slot table on the device and are capturable in a CUDA graph (every shape
is fixed by T, k and the model; nothing is read back to the host)."""

from __future__ import annotations

import torch

from tierstore.compute.checks import DECODE_MAX_TOKENS, check_moe_args
from tierstore.errors import ConfigError

_prepared: set[tuple[str, int]] = set()
_DTYPES = {torch.float32: 0, torch.bfloat16: 1}


def _prepare(kind: str, device_index: int) -> None:
    # Module load must not happen inside graph capture; do it on the first eager call.
    if (kind, device_index) in _prepared or torch.cuda.is_current_stream_capturing():
        return
    from tierstore import _C

    (_C.moe_mma_prepare if kind == "mma" else _C.moe_decode_prepare)(device_index)
    _prepared.add((kind, device_index))


def _same_device(name: str, t: torch.Tensor, dev: torch.device) -> None:
    if t.device != dev:
        raise ConfigError(f"fused_moe (cuda): {name} is on {t.device}, x is on {dev}")


def _common(x, topk_weights, topk_ids, layer, store, base, out):
    """Checks shared by both kernels; returns the launch arguments they have in common."""
    check_moe_args(x, topk_weights, topk_ids, layer, store, base)
    dev = x.device
    for name, t in (
        ("slot_table", store.slot_table),
        ("pool", store.pool),
        ("base.rows", base.rows),
        ("topk_ids", topk_ids),
        ("topk_weights", topk_weights),
    ):
        _same_device(name, t, dev)
    if store.slot_table.dtype != torch.int32 or not store.slot_table.is_contiguous():
        raise ConfigError(
            f"fused_moe (cuda): slot_table must be contiguous int32, found {store.slot_table.dtype}"
        )
    if store.pool.dtype != torch.uint8 or not store.pool.is_contiguous():
        raise ConfigError("fused_moe (cuda): pool must be a contiguous uint8 tensor")
    in_dtype = x.dtype
    xc = x if in_dtype in _DTYPES else x.float()
    xc = xc.contiguous()
    if xc.data_ptr() % 16:  # the kernels read x with 16/8-byte vector loads
        xc = xc.clone()
    ids = topk_ids.to(torch.int32).contiguous()  # device ops: no host sync
    w = topk_weights.to(torch.float32).contiguous()
    if out is not None and (
        out.shape != x.shape or out.dtype != in_dtype or out.device != dev or not out.is_contiguous()
    ):
        raise ConfigError(
            f"fused_moe (cuda): out must be contiguous {in_dtype} {list(x.shape)} "
            f"on {dev}, found {out.dtype} {list(out.shape)} on {out.device}"
        )
    result = out if out is not None and out.dtype == xc.dtype else torch.empty_like(xc)
    E = base.n_experts
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    head = (
        xc.data_ptr(),
        result.data_ptr(),
        _DTYPES[xc.dtype],
        ids.data_ptr(),
        w.data_ptr(),
        topk_ids.shape[0],
        topk_ids.shape[1],
        store.slot_table.data_ptr() + layer * E * 4,
        E,
        store.pool.shape[0],
        store.pool.data_ptr(),
        store.pool.shape[1],
        base.rows.data_ptr() + layer * E * base.rows.shape[-1],
        base.rows.shape[-1],
        base.H,
        base.I,
    )
    keep = (xc, ids, w)  # alive until the launch has been queued
    return head, result, index, keep


def _finish(result, x, out):
    if result.dtype == x.dtype:
        return result
    if out is not None:
        return out.copy_(result)
    return result.to(x.dtype)


def decode_workspace(T: int, k: int, H: int, I: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Scratch for one v2 decode call: (h float32 [T*k, I], y float32 [T*k, H])."""
    return (
        torch.empty(T * k, I, dtype=torch.float32, device=device),
        torch.empty(T * k, H, dtype=torch.float32, device=device),
    )


def mma_workspace(T: int, k: int, E: int, H: int, I: int, dtype, device) -> torch.Tensor:
    """Scratch for one grouped call: uint8 [bytes], fixed by the shapes (capturable)."""
    from tierstore import _C

    code = _DTYPES.get(dtype, 0)
    return torch.empty(_C.moe_mma_workspace_bytes(T, k, E, H, I, code), dtype=torch.uint8, device=device)


def fused_moe_mma(
    x, topk_weights, topk_ids, layer: int, store, base, *, out=None, workspace=None
) -> torch.Tensor:
    """The tensor-core grouped kernels, any T. Same contract as ``fused_moe``; fp16 runs
    in fp32. ``out`` and ``workspace`` (from ``mma_workspace``) may be given to keep every
    address fixed across CUDA-graph replays."""
    from tierstore import _C

    head, result, index, keep = _common(x, topk_weights, topk_ids, layer, store, base, out)
    T, k = topk_ids.shape
    ws = (
        workspace
        if workspace is not None
        else mma_workspace(T, k, base.n_experts, base.H, base.I, result.dtype, x.device)
    )
    if ws.dtype != torch.uint8 or ws.device != x.device or not ws.is_contiguous():
        raise ConfigError(
            f"fused_moe (cuda): workspace must be a contiguous uint8 tensor on "
            f"{x.device} (from mma_workspace)"
        )
    _prepare("mma", index)
    try:
        _C.moe_mma(*head, ws.data_ptr(), ws.numel(), index, torch.cuda.current_stream(x.device).cuda_stream)
    except ValueError as exc:  # std::invalid_argument from the argument checks
        raise ConfigError(f"fused_moe (cuda): {exc}") from None
    del keep
    return _finish(result, x, out)


def fused_moe_decode(
    x, topk_weights, topk_ids, layer: int, store, base, *, out=None, workspace=None
) -> torch.Tensor:
    """The v2 decode kernel (T <= 16, k <= 16). Same contract as ``fused_moe``."""
    from tierstore import _C

    T, k = topk_ids.shape[0], topk_ids.shape[-1]
    if T > DECODE_MAX_TOKENS or k > 16:
        raise ConfigError(
            f"fused_moe (cuda): T={T}, k={k}; the decode kernel takes T <= {DECODE_MAX_TOKENS} and k <= 16"
        )
    head, result, index, keep = _common(x, topk_weights, topk_ids, layer, store, base, out)
    h, y = workspace if workspace is not None else decode_workspace(T, k, base.H, base.I, x.device)
    if (
        h.shape != (T * k, base.I)
        or y.shape != (T * k, base.H)
        or h.dtype != torch.float32
        or y.dtype != torch.float32
        or h.device != x.device
        or y.device != x.device
    ):
        raise ConfigError(
            f"fused_moe (cuda): workspace must be float32 [{T * k}, {base.I}] and "
            f"[{T * k}, {base.H}] on {x.device}"
        )
    _prepare("decode", index)
    try:
        _C.moe_decode(
            *head, h.data_ptr(), y.data_ptr(), index, torch.cuda.current_stream(x.device).cuda_stream
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    del keep
    return _finish(result, x, out)
