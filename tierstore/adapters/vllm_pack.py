"""First boot under upstream vLLM: the checkpoint's routed experts, as vLLM's own loader
delivers them, become a tierstore ``fp4`` pack (and its 2-bit ``base`` twin).

vLLM's ``RoutedExperts.load_weights`` hands every expert matrix to
``param.weight_loader(param, loaded_weight, weight_name, shard_id, expert_id, ...)``
(shard_id ``w1`` gate, ``w3`` up, ``w2`` down). Our placeholder parameters carry
:meth:`ExpertCapture.loader`, which keeps the parts of each (layer, expert) until the
expert is complete, decodes them to float32 (bf16/fp16/fp32 as they are; FP8 with a
per-tensor, per-channel or 128x128-block scale; MXFP4 uint8 nibbles + e8m0 scales;
NVFP4 nibbles + fp8 block scales + fp32 global scale), encodes the expert's two rows
and, once all experts of a layer are in, writes that layer through
:class:`~tierstore.format.writer.PackWriter` (crash-safe, resumable: a boot
interrupted half-way keeps the layers already listed and writes the rest next time).

Layers are keyed by MoE-layer order (the index the quant config gives each
``RoutedExperts`` in construction order), never by the transformer index.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import torch
import xxhash

from tierstore.errors import ConfigError, FormatError
from tierstore.format import fp4, layouts
from tierstore.format.build import quantizer_abi
from tierstore.format.layouts import expert_layout
from tierstore.format.writer import PackWriter

TAGS = ("fp4", "base")
_SHARDS = ("w1", "w3", "w2")
FP8_BLOCK = 128


SAMPLES = 16  # evenly spaced 64 KiB samples of each large weight file
SAMPLE_BYTES = 64 << 10
WHOLE_BELOW = 64 << 20  # files up to this size are hashed whole


def _file_fingerprint(h, path: str) -> None:
    """Name, size, modification time, and the contents: whole up to WHOLE_BELOW, else
    the safetensors header (every tensor's name, dtype, shape, offsets) and SAMPLES
    slices spread over the file (~1 MiB of reads per file on every boot). Weights
    replaced in place at the same sizes change the mtime and the samples."""
    st = os.stat(path)
    size = st.st_size
    h.update(f"{os.path.basename(path)}\0{size}\0{st.st_mtime_ns}\0".encode())
    with open(path, "rb") as f:
        if size <= WHOLE_BELOW:
            h.update(f.read())
            return
        if path.endswith(".safetensors") and size >= 8:
            n = int.from_bytes(f.read(8), "little")
            if 0 < n <= min(size - 8, 100 << 20):
                h.update(f.read(n))
        for i in range(SAMPLES):
            f.seek(max(0, (size - SAMPLE_BYTES) * i // max(1, SAMPLES - 1)))
            h.update(f.read(SAMPLE_BYTES))


def checkpoint_identity(model: str, revision: str | None = None) -> str:
    """Identity of a checkpoint, cheap enough for every boot: xxh3_128 over the model
    name, revision, ``config.json`` bytes and each weight file's fingerprint (name,
    size, mtime, contents or header + 16 spread samples) for a local directory; a hub
    name is identified by name and revision. Hashing every byte, as ``tierstore pack``
    does, would cost minutes per boot on large models."""
    h = xxhash.xxh3_128()
    h.update(f"{model}\0{revision or ''}\0".encode())
    if os.path.isdir(model):
        for name in sorted(os.listdir(model)):
            path = os.path.join(model, name)
            if name == "config.json":
                with open(path, "rb") as f:
                    h.update(f.read(1 << 20))
            elif name.endswith((".safetensors", ".bin", ".pt")):
                _file_fingerprint(h, path)
    return f"vllm-ckpt-xxh3_128:{h.hexdigest()}"


def _expand_blocks(scale: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """A [ceil(n/b), ceil(k/b)] block scale -> [n, k]."""
    bn, bk = -(-n // scale.shape[0]), -(-k // scale.shape[1])
    return scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[:n, :k]


def decode_part(parts: dict[str, torch.Tensor], where: str) -> torch.Tensor:
    """One checkpoint matrix [N, K] as float32, whatever vLLM's loader handed over:
    ``parts`` maps the parameter suffix (``weight``, ``weight_scale``,
    ``weight_scale_inv``, ``weight_scale_2``) to the tensor loaded into it."""
    w = parts.get("weight")
    if w is None:
        raise FormatError(f"{where}: no weight tensor among {sorted(parts)}")
    if w.dtype in (torch.bfloat16, torch.float16, torch.float32):
        return w.float()
    scale = parts.get("weight_scale", parts.get("weight_scale_inv"))
    if w.dtype == torch.float8_e4m3fn:
        if scale is None:
            raise FormatError(f"{where}: FP8 weight without weight_scale / weight_scale_inv")
        s = scale.float()
        n, k = w.shape
        if s.numel() == 1:
            s = s.reshape(1, 1)
        elif s.dim() == 1 or (s.dim() == 2 and s.shape[1] == 1):
            s = s.reshape(n, 1)  # per output channel
        else:
            s = _expand_blocks(s, n, k)  # 128x128 (DeepSeek) or any block grid
        return w.float() * s
    if w.dtype == torch.uint8:
        if scale is None:
            raise FormatError(f"{where}: uint8 (FP4) weight without weight_scale")
        if scale.dtype == torch.uint8:  # MXFP4: e8m0 per 32 elements
            return fp4.dequantize_mxfp4(w, scale).float()
        if scale.dtype == torch.float8_e4m3fn:  # NVFP4: fp8 per 16 + fp32 global
            g = parts.get("weight_scale_2")
            if g is None:
                raise FormatError(f"{where}: NVFP4 weight without weight_scale_2")
            return fp4.dequantize_nvfp4(w, scale, float(g.float().reshape(-1)[0])).float()
        raise FormatError(
            f"{where}: FP4 weight with a {scale.dtype} scale (expected uint8 "
            "e8m0 for MXFP4 or float8_e4m3fn for NVFP4)"
        )
    raise FormatError(f"{where}: weight dtype {w.dtype} is not bf16/fp16/fp32/FP8/FP4")


def suffix_of(param_name: str) -> tuple[str, str]:
    """``w13_weight_scale`` -> (``w13``, ``weight_scale``)."""
    head, _, tail = param_name.partition("_")
    if head not in ("w13", "w2") or not tail:
        raise ConfigError(f"expert parameter {param_name!r}: expected w13_* or w2_*")
    return head, tail


class ExpertCapture:
    """Collects one checkpoint's routed experts from vLLM's loader into two packs.

    ``n_layers`` is an upper bound on the MoE layers (the transformer's layer count):
    rows beyond the last MoE layer stay unwritten, which the store allows."""

    def __init__(
        self,
        pack_dir: str,
        *,
        ckpt_id: str,
        n_layers: int,
        n_experts: int,
        H: int,
        I: int,
        source: str = "checkpoint",
    ):
        self.pack_dir, self.ckpt_id = pack_dir, ckpt_id
        self.n_layers, self.E, self.H, self.I = int(n_layers), int(n_experts), int(H), int(I)
        self.source = source
        self._lock = threading.Lock()
        self._parts: dict[tuple[int, int], dict] = {}
        self._rows: dict[tuple[str, int], np.ndarray] = {}
        self._done: dict[int, set[int]] = {}
        self._writers: dict[str, PackWriter] | None = None

    # -- packs ----------------------------------------------------------------------
    def writers(self) -> dict[str, PackWriter]:
        """Open (or resume) both packs; holding them keeps other processes out."""
        if self._writers is None:
            os.makedirs(self.pack_dir, exist_ok=True)
            ws = {}
            try:
                for tag in TAGS:
                    layout = expert_layout(tag, self.H, self.I)
                    ws[tag] = PackWriter(
                        self.pack_dir,
                        tag=tag,
                        n_layers=self.n_layers,
                        n_experts=self.E,
                        slot_bytes=layouts.row_bytes(tag, self.H, self.I),
                        ckpt_id=self.ckpt_id,
                        quantizer_abi=quantizer_abi(self.source_format(), tag),
                        layout=layout,
                    )
            except BaseException:
                for w in ws.values():
                    w.close()
                raise
            self._writers = ws
        return self._writers

    def source_format(self) -> str:
        return "nvfp4" if self.source == "nvfp4" else "mxfp4"

    def is_written(self, layer: int) -> bool:
        return all(w.is_written(layer) for w in self.writers().values())

    def paths(self) -> dict[str, str]:
        return {tag: w.path for tag, w in self.writers().items()}

    def close(self) -> None:
        if self._writers is not None:
            for w in self._writers.values():
                w.close()
            self._writers = None

    # -- the loader -------------------------------------------------------------------
    def loader(self, layer: int, param_name: str):
        """A ``weight_loader`` for placeholder parameter ``param_name`` of MoE layer
        ``layer``: keeps the tensor for the pack instead of a GPU parameter."""
        matrix, kind = suffix_of(param_name)

        def weight_loader(
            param=None,
            loaded_weight=None,
            weight_name=None,
            shard_id=None,
            expert_id=None,
            return_success: bool = False,
        ):
            self.take(layer, matrix, kind, loaded_weight, shard_id, expert_id, weight_name)
            return True if return_success else None

        return weight_loader

    def take(
        self,
        layer: int,
        matrix: str,
        kind: str,
        tensor: torch.Tensor,
        shard_id: str | None,
        expert_id: int | None,
        weight_name: str | None = None,
    ) -> None:
        where = f"MoE layer {layer} expert {expert_id} ({weight_name or matrix + '_' + kind})"
        if expert_id is None or shard_id not in _SHARDS:
            raise ConfigError(
                f"{where}: tierstore's first boot needs per-expert tensors "
                f"(shard w1/w3/w2, an expert id); got shard {shard_id!r}"
            )
        if self.is_written(layer):
            return  # resumed boot: this layer is already in the packs
        e = int(expert_id)
        if not 0 <= e < self.E:
            raise ConfigError(
                f"{where}: expert id outside 0..{self.E - 1} (expert parallel "
                "first boots are not supported: build the packs at EP=1)"
            )
        with self._lock:
            parts = self._parts.setdefault((layer, e), {})
            parts.setdefault(shard_id, {})[kind] = tensor.detach().to("cpu", copy=True)
            if not self._complete(parts):
                return
            del self._parts[layer, e]
        self._encode(layer, e, parts, where)

    @staticmethod
    def _complete(parts: dict) -> bool:
        def ready(p):
            w = p.get("weight")
            if w is None:
                return False
            if w.dtype in (torch.bfloat16, torch.float16, torch.float32):
                return True
            have = set(p) - {"weight"}
            if (
                w.dtype == torch.uint8
                and p.get("weight_scale") is not None
                and p["weight_scale"].dtype == torch.float8_e4m3fn
            ):
                return {"weight_scale", "weight_scale_2"} <= have
            return bool(have & {"weight_scale", "weight_scale_inv"})

        return all(s in parts and ready(parts[s]) for s in _SHARDS)

    def _encode(self, layer: int, e: int, parts: dict, where: str) -> None:
        gate, up, down = (decode_part(parts[s], f"{where} {s}") for s in _SHARDS)
        w13 = torch.cat([gate, up], dim=0)
        if tuple(w13.shape) != (2 * self.I, self.H) or tuple(down.shape) != (self.H, self.I):
            raise FormatError(
                f"{where}: w13 {list(w13.shape)}, w2 {list(down.shape)}; expected "
                f"[{2 * self.I}, {self.H}] and [{self.H}, {self.I}] (tensor "
                "parallel first boots are not supported: build at TP=1)"
            )
        encoded = {tag: layouts.encode_expert(w13, down, tag) for tag in TAGS}
        with self._lock:
            for tag, row in encoded.items():
                buf = self._rows.get((tag, layer))
                if buf is None:
                    buf = self._rows[tag, layer] = np.zeros((self.E, row.size), np.uint8)
                buf[e] = row
            done = self._done.setdefault(layer, set())
            done.add(e)
            if len(done) < self.E:
                return
            rows = {tag: self._rows.pop((tag, layer)) for tag in TAGS}
            del self._done[layer]
            for tag, w in self.writers().items():  # base last: a layer counts once both are in
                if not w.is_written(layer):
                    w.write_layer(layer, rows[tag])

    def pending(self) -> dict[int, int]:
        """{MoE layer: experts still missing} for layers that started but did not finish."""
        with self._lock:
            out = {l: self.E - len(d) for l, d in self._done.items()}
            for l, _ in self._parts:
                out.setdefault(l, self.E)
            return out
