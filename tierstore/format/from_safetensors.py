"""Build a pack from a directory of .safetensors expert weights.

Accepted tensor names (any prefix before ``layers.``; FORMAT.md, "Building"):

    ...layers.{l}.experts.{e}.w13[.weight]                 fused gate+up [2I, H]
    ...layers.{l}.experts.{e}.w2[.weight]                  down [H, I]
    ...layers.{l}.mlp.experts.{e}.gate_proj|up_proj|down_proj.weight   (DeepSeek / HF)
    ...layers.{l}.experts.{e}.w1|w3[.weight]               gate / up (Mixtral style)

Float tensors (bf16, fp16, fp32) are quantised to MXFP4. NVFP4 tensors (ModelOpt
style: ``weight`` uint8 [N, K/2] + ``weight_scale`` float8_e4m3fn [N, K/16] +
``weight_scale_2`` float32 global) are dequantised and re-quantised to MXFP4.
Pack layer i is the i-th MoE layer in ascending checkpoint layer number.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable

import numpy as np
import xxhash

from tierstore.errors import ConfigError, FormatError
from tierstore.files.untrusted import open_regular
from tierstore.format import layouts
from tierstore.format.build import FORMATS, quantizer_abi
from tierstore.format.layouts import expert_layout
from tierstore.format.writer import PackWriter

_NAME = re.compile(
    r"(?:^|\.)layers\.(\d+)\.(?:mlp\.)?experts\.(\d+)\."
    r"(w13|w2|w1|w3|gate_proj|up_proj|down_proj)"
    r"(\.weight|\.weight_scale|\.weight_scale_2)?$"
)
_PART = {
    "w13": "w13",
    "w2": "w2",
    "w1": "gate",
    "gate_proj": "gate",
    "w3": "up",
    "up_proj": "up",
    "down_proj": "w2",
}
_FLOAT = {"BF16", "F16", "F32"}


def _scan(src: str) -> tuple[dict, list[str]]:
    """(layer, expert) -> {part: {"weight"|"weight_scale"|"weight_scale_2": (file, key)}}."""
    from safetensors import safe_open

    files = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    if not files:
        raise FormatError(f"{src}: no .safetensors files")
    found: dict = defaultdict(lambda: defaultdict(dict))
    for name in files:
        path = os.path.join(src, name)
        # safe_open blocks forever in open() on a FIFO and maps a device: regular files only
        os.close(open_regular(path, "safetensors file"))
        try:
            with safe_open(path, framework="pt") as f:
                keys = list(f.keys())
        except Exception as exc:  # safetensors raises its own error types
            raise FormatError(f"{path}: not a readable safetensors file: {exc}") from None
        for key in keys:
            m = _NAME.search(key)
            if m:
                kind = (m[4] or ".weight")[1:]
                found[int(m[1]), int(m[2])][_PART[m[3]]][kind] = (path, key)
    if not found:
        raise FormatError(
            f"{src}: no expert weights found; accepted names are "
            "layers.{l}.experts.{e}.w13/.w2 or "
            "layers.{l}.mlp.experts.{e}.{gate,up,down}_proj.weight"
        )
    return found, files


def _load(entry: dict, where: str):
    """One matrix as float32 torch; NVFP4 triples are decoded first."""
    import torch
    from safetensors import safe_open

    from tierstore.format import fp4

    path, key = entry["weight"]
    with safe_open(path, framework="pt") as f:
        t = f.get_tensor(key)
        if t.dtype == torch.uint8:
            if "weight_scale" not in entry or "weight_scale_2" not in entry:
                raise FormatError(
                    f"{path}: {key}: uint8 weight without weight_scale and "
                    f"weight_scale_2 (NVFP4 needs all three) for {where}"
                )
            sp, sk = entry["weight_scale"]
            gp, gk = entry["weight_scale_2"]
            with safe_open(sp, framework="pt") as fs, safe_open(gp, framework="pt") as fg:
                s, g = fs.get_tensor(sk), fg.get_tensor(gk)
            if s.dtype != torch.float8_e4m3fn or s.shape != (t.shape[0], t.shape[1] // 8):
                raise FormatError(
                    f"{sp}: {sk}: {s.dtype} {list(s.shape)}, expected "
                    f"float8_e4m3fn [{t.shape[0]}, {t.shape[1] // 8}]"
                )
            return fp4.dequantize_nvfp4(t, s, float(g.float().reshape(-1)[0])), True
        if t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise FormatError(f"{path}: {key}: dtype {t.dtype}, expected bf16, fp16, fp32 or NVFP4 uint8")
        return t.float(), False


def _expert_mats(parts: dict, where: str, fmt: str):
    """(w13 [2I, H], w2 [H, I]) float32. Float input with fmt "nvfp4" goes through an
    NVFP4 round trip (as if the checkpoint had been NVFP4)."""
    import torch

    from tierstore.format.build import through_nvfp4

    if "w2" not in parts:
        raise FormatError(f"{where}: missing w2 (down_proj)")
    if "w13" in parts:
        mats = [_load(parts["w13"], where)]
    elif "gate" in parts and "up" in parts:
        mats = [_load(parts["gate"], where), _load(parts["up"], where)]
    else:
        raise FormatError(f"{where}: missing w13 (or gate_proj + up_proj)")
    mats.append(_load(parts["w2"], where))
    out = []
    for t, was_nvfp4 in mats:
        if was_nvfp4 and fmt == "mxfp4":
            raise FormatError(f"{where}: NVFP4 tensors found but --format mxfp4 was given")
        out.append(through_nvfp4(t) if fmt == "nvfp4" and not was_nvfp4 else t)
    w13 = out[0] if len(out) == 2 else torch.cat(out[:2], dim=0)
    return w13, out[-1]


def _source_format(parts: dict) -> str:
    from safetensors import safe_open

    path, key = next(iter(parts.values()))["weight"]
    with safe_open(path, framework="pt") as f:
        return "nvfp4" if f.get_slice(key).get_dtype() == "U8" else "mxfp4"


def checkpoint_id(src: str, files: list[str]) -> str:
    """xxh3_128 over every file's name and bytes: another checkpoint gets another id."""
    h = xxhash.xxh3_128()
    for name in files:
        h.update(name.encode() + b"\0")
        with open(os.path.join(src, name), "rb") as f:
            while chunk := f.read(16 << 20):
                h.update(chunk)
    return f"safetensors-xxh3_128:{h.hexdigest()}"


def build_from_safetensors(
    out: str,
    src: str,
    *,
    tag: str = "fp4",
    fmt: str | None = None,
    order: str = "linear",
    ckpt_id: str | None = None,
    on_layer: Callable[[int, int], None] | None = None,
    discard_on_error: bool = False,
    check_space: bool = False,
) -> tuple[str, object]:
    """Quantise every expert into ``tag`` rows. ``fmt`` = the source number format
    (None: detected; NVFP4 when weights are uint8). Returns (path, layout).
    ``discard_on_error`` / ``check_space``: as PackWriter's."""
    found, files = _scan(src)
    ckpt_layers = sorted({l for l, _ in found})
    experts = {l: sorted(e for ll, e in found if ll == l) for l in ckpt_layers}
    E = len(experts[ckpt_layers[0]])
    for l in ckpt_layers:
        if experts[l] != list(range(E)):
            missing = sorted(set(range(max(E, max(experts[l]) + 1))) - set(experts[l]))
            raise FormatError(
                f"{src}: layer {l}: experts {missing[:8]} missing "
                f"(expected 0..{E - 1} like layer {ckpt_layers[0]})"
            )
    first = found[ckpt_layers[0], 0]
    fmt = fmt or _source_format(first)
    if fmt not in FORMATS:
        raise ConfigError(f"--format {fmt!r}: expected one of {FORMATS}")
    w13, w2 = _expert_mats(first, f"{src}: layer {ckpt_layers[0]} expert 0", fmt)
    I, H = w13.shape[0] // 2, w13.shape[1]
    layout = expert_layout(tag, H, I, order)
    slot = layout.sections[-1].offset + layout.sections[-1].bytes
    with PackWriter(
        out,
        tag=tag,
        n_layers=len(ckpt_layers),
        n_experts=E,
        slot_bytes=slot,
        ckpt_id=ckpt_id or checkpoint_id(src, files),
        quantizer_abi=quantizer_abi(fmt, tag, order),
        layout=layout,
        discard_on_error=discard_on_error,
        check_space=check_space,
    ) as w:
        for li, l in enumerate(ckpt_layers):
            if w.is_written(li):
                continue
            import torch

            a = torch.empty(E, 2 * I, H)
            b = torch.empty(E, H, I)
            for e in range(E):
                where = f"{src}: layer {l} expert {e}"
                m13, m2 = _expert_mats(found[l, e], where, fmt)
                if tuple(m13.shape) != (2 * I, H) or tuple(m2.shape) != (H, I):
                    raise FormatError(
                        f"{where}: w13 {list(m13.shape)}, w2 {list(m2.shape)}; "
                        f"expected [{2 * I}, {H}] and [{H}, {I}]"
                    )
                a[e], b[e] = m13, m2
            w.write_layer(li, np.ascontiguousarray(layouts.encode_experts(a, b, tag, order)))
            if on_layer:
                on_layer(li + 1, len(ckpt_layers))
        return w.path, layout
