"""Diagnostics shared by the MoE GPU tests (tests/compute/test_moe_gpu.py,
tests/compute/test_moe_mma_gpu.py)."""

from __future__ import annotations

import torch


def diag(got: torch.Tensor, ref: torch.Tensor, label: str) -> tuple[float, str]:
    g, r = got.double().cpu(), ref.double().cpu()
    nan = int(torch.isnan(g).sum())
    diff = (g - r).nan_to_num(nan=float("inf")).abs()
    rel = float((g - r).norm() / r.norm()) if nan == 0 else float("nan")
    flat = int(diff.reshape(-1).argmax())
    t, c = divmod(flat, g.shape[1])
    per_tok = ((g - r).norm(dim=1) / r.norm(dim=1).clamp_min(1e-30)).tolist()
    msg = (
        f"{label}: rel={rel:.3e} nan={nan} worst at token {t} col {c}: got {float(g[t, c]):.6g} "
        f"ref {float(r[t, c]):.6g}; ref norm {float(r.norm()):.4g}; per-token rel "
        f"{[f'{e:.1e}' for e in per_tok]}"
    )
    print(msg)
    return rel, msg
