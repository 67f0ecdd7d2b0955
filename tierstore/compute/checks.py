"""Argument checks shared by the torch reference and the CUDA decode path of
``fused_moe``: shapes only, no host sync (safe inside CUDA-graph capture)."""

from __future__ import annotations

from tierstore.errors import ConfigError
from tierstore.format import layouts

DECODE_MAX_TOKENS = 16  # the v2 decode kernel's largest batch (the grouped kernels take any T)


def check_moe_args(x, topk_weights, topk_ids, layer, store, base) -> None:
    if x.dim() != 2 or x.shape[1] != base.H:
        raise ConfigError(f"fused_moe: x must be [T, H={base.H}], found {list(x.shape)}")
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        raise ConfigError(
            f"fused_moe: topk_ids {list(topk_ids.shape)} and topk_weights "
            f"{list(topk_weights.shape)} must both be [T={x.shape[0]}, k]"
        )
    if not 0 <= layer < base.n_layers or tuple(store.slot_table.shape) != (base.n_layers, base.n_experts):
        raise ConfigError(
            f"fused_moe: layer {layer} with slot_table {list(store.slot_table.shape)}; "
            f"base has [{base.n_layers}, {base.n_experts}]"
        )
    need = layouts.row_bytes("fp4", base.H, base.I)
    if store.slot_bytes < need:
        raise ConfigError(
            f"fused_moe: pool slot_bytes {store.slot_bytes} < fp4 row bytes {need} for H={base.H}, I={base.I}"
        )
