"""Exact mode of ``--quantization tierstore``: vLLM's own fused-MoE method computes over
expert bytes that tierstore keeps in its tiers, so greedy output is the stock model's.

How a layer runs (docs/VLLM.md):

* **The checkpoint's own method** (``inner``: vLLM's ``UnquantizedFusedMoEMethod``, or
  the quantized checkpoint's MoE method) creates, loads and processes the expert
  parameters exactly as without tierstore (CPU prepacking, padding, shuffles), so the
  bytes in the pack are the bytes vLLM's kernel reads.
* **First boot**: after ``inner.process_weights_after_loading``, every parameter whose
  first dimension is the expert count is a *plane*; expert e's row in the pack is its
  slice of every plane, back to back (64-byte aligned), written through PackWriter
  (crash-safe, resumable). The full parameters are then dropped.
* **Later boots**: the pack holds the layer, so vLLM's loader drops its expert tensors
  (loader-skip) and ``inner`` builds its kernel over a 1-expert placeholder.
* **Serving**: one ExpertStore over the pack for the whole model, its pool at least one
  layer's experts (the floor: one batch may route to every expert of a layer). Per
  layer call: the routed experts are fired (made resident and pinned), their pool rows
  are gathered plane by plane into one scratch set shared by every layer (the kernel
  needs each plane contiguous), the routed ids are renumbered to scratch positions in
  ascending expert order (so the kernel groups tokens exactly as stock does), and
  ``inner.apply`` runs. The fire is released after the kernel.

The call is the custom op ``tierstore::routed_experts`` (opaque to torch.compile, which
vLLM's CPU platform runs by default); inside it the host reads the routed ids (eager).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import threading
from typing import NamedTuple

import numpy as np
import torch

from tierstore.errors import ConfigError, TierstoreError

log = logging.getLogger("vllm.tierstore")

TAG = "exact"
PLANE_ALIGN = 64
# torch dtype -> the pack's dtype names (format/sidecar.py DTYPE_BYTES)
DTYPE_NAMES = {
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int32: "int32",
    torch.float8_e4m3fn: "float8_e4m3fn",
}
DTYPES = {v: k for k, v in DTYPE_NAMES.items()}


class Plane(NamedTuple):
    """One per-expert parameter of a processed layer, as it sits in a pack row."""

    name: str
    offset: int
    nbytes: int
    dtype: str
    shape: tuple


def expert_planes(
    layer: torch.nn.Module, n_experts: int, where: str, own: set[str] | None = None
) -> list[tuple[str, torch.Tensor]]:
    """The MoE method's parameters (``own``: the names its create_weights registered; a
    processing step may replace a parameter under the same name) whose first dimension
    is ``n_experts``, by name. Any other of its parameters that holds data would not
    survive a later boot: refused, naming it."""
    planes = []
    for name, p in sorted(layer.named_parameters(recurse=False)):
        if own is not None and name not in own:
            continue
        if p.dim() >= 1 and p.shape[0] == n_experts and p.numel():
            if p.dtype not in DTYPE_NAMES:
                raise ConfigError(
                    f"{where}: expert parameter {name} has dtype {p.dtype}, which "
                    f"the exact pack cannot hold ({sorted(DTYPES)})"
                )
            planes.append((name, p))
        elif p.numel() > 1:
            raise ConfigError(
                f"{where}: parameter {name} {tuple(p.shape)} is not per expert "
                f"after vLLM's processing; exact mode cannot serve this "
                f"checkpoint's MoE method yet (use TIERSTORE_VLLM_MODE=tiered)"
            )
    if not planes:
        raise ConfigError(f"{where}: vLLM's MoE method left no per-expert parameter")
    return planes


def plane_layout(planes: list[tuple[str, torch.Tensor]]) -> list[Plane]:
    out, off = [], 0
    for name, p in planes:
        nbytes = p[0].numel() * p.element_size()
        out.append(Plane(name, off, nbytes, DTYPE_NAMES[p.dtype], tuple(p.shape[1:])))
        off += -(-nbytes // PLANE_ALIGN) * PLANE_ALIGN
    return out


def row_bytes_of(layout: list[Plane]) -> int:
    last = layout[-1]
    return -(-(last.offset + last.nbytes) // PLANE_ALIGN) * PLANE_ALIGN


def rows_of(planes: list[tuple[str, torch.Tensor]], layout: list[Plane]) -> np.ndarray:
    """[E, row_bytes] uint8: expert e's slice of every plane at its offset."""
    E = planes[0][1].shape[0]
    rows = np.zeros((E, row_bytes_of(layout)), dtype=np.uint8)
    for (_name, p), plane in zip(planes, layout):
        flat = p.detach().to("cpu").contiguous().view(E, -1).view(torch.uint8)
        rows[:, plane.offset : plane.offset + plane.nbytes] = flat.numpy()
    return rows


def layout_sections(layout: list[Plane]):
    from tierstore.format.sidecar import RowLayout, RowSection

    return RowLayout(
        kind=TAG,
        sections=[RowSection(p.name, p.offset, p.nbytes, p.dtype, list(p.shape), "raw") for p in layout],
    )


def layout_from_pack(pack) -> list[Plane]:
    sections = pack.sidecar.layout.sections if pack.sidecar.layout else []
    return [Plane(s.name, s.offset, s.bytes, s.dtype, tuple(s.shape)) for s in sections]


# -- the tier: one ExpertStore + the shared scratch planes --------------------------------
class ExactTier:
    """One model load's store over the exact pack and the scratch planes every MoE layer's
    parameters point at. ``slots``: pool size in experts (>= one layer's experts)."""

    def __init__(self, pack_path: str, *, slots: int, device, ram_gb: float = 0.0, policy: str | None = None):
        from tierstore.format.pack import Pack
        from tierstore.store.expert_store import ExpertStore

        pack = Pack.open(pack_path)
        self.pack_path = pack_path
        self.layout = layout_from_pack(pack)
        self.n_layers, self.n_experts = int(pack.n_layers), int(pack.n_experts)
        self.device = torch.device(device)
        if slots < self.n_experts:
            raise ConfigError(
                f"tierstore exact mode: a pool of {slots} experts is under the "
                f"floor of {self.n_experts} (one layer's experts: a batch may "
                f"route to all of them); raise TIERSTORE_VLLM_SLOTS"
            )
        options = {"ram_gb": ram_gb}
        if slots < 2 * self.n_experts:
            # under two layers' experts the next layer call needs (nearly) every slot: a
            # background promotion could only evict what is about to be fired
            options["lazy_per_step"] = 0
        if policy:
            options["policy"] = policy
        self.store = ExpertStore(pack, vram_slots=int(slots), device=str(self.device), **options)
        self.slots = int(slots)
        from tierstore import metrics

        rank, world = parallel_rank()
        metrics.register_store(self.store, metric_labels("exact", rank))
        self.capture = routing_capture("exact", self.n_experts, rank, world)
        self._last_layer = -1
        self.scratch = {
            p.name: torch.empty((self.n_experts, *p.shape), dtype=DTYPES[p.dtype], device=self.device)
            for p in self.layout
        }
        # the same scratch as bytes, [E, plane bytes]: the gather's destinations
        self._scratch_bytes = [
            self.scratch[p.name].view(torch.uint8).view(self.n_experts, -1) for p in self.layout
        ]
        self._lock = threading.Lock()  # one layer call at a time: the scratch is shared
        self.expert_maps: dict[int, np.ndarray] = {}

    def adopt(self, layer: torch.nn.Module, where: str, expert_map=None) -> None:
        """Point the layer's plane parameters at the shared scratch (their storage was a
        placeholder or the full first-boot tensors, freed here). ``expert_map``: vLLM's
        global -> local map of this rank (expert parallelism), kept for the calls."""
        if expert_map is not None:
            self.expert_maps[id(layer)] = expert_map.to(torch.int64).numpy()
        for p in self.layout:
            param = getattr(layer, p.name, None)
            if param is None or param.dtype != DTYPES[p.dtype] or tuple(param.shape[1:]) != p.shape:
                got = None if param is None else (param.dtype, tuple(param.shape[1:]))
                raise ConfigError(
                    f"{where}: the exact pack {self.pack_path} has plane {p.name} "
                    f"{p.dtype}{list(p.shape)} per expert, vLLM's method built "
                    f"{got}; the pack is from another vLLM or checkpoint format: "
                    f"delete it and boot again"
                )
            param.data = self.scratch[p.name]

    def forward(
        self,
        layer_index: int,
        layer,
        inner,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
    ) -> torch.Tensor:
        ids = topk_ids.to("cpu").numpy()
        emap = self.expert_maps.get(id(layer))
        # expert parallelism: ids are global; this rank's experts are emap[id] >= 0
        local_ids = ids if emap is None else emap[ids]
        experts = np.unique(local_ids)
        experts = experts[experts >= 0] if emap is not None else experts
        if len(experts) and (experts[0] < 0 or experts[-1] >= self.n_experts):
            raise TierstoreError(f"MoE layer {layer_index}: routed expert ids outside [0, {self.n_experts})")
        with self._lock:
            if self.capture is not None:  # TIERSTORE_CAPTURE: the routing, step by step
                if layer_index <= self._last_layer:
                    self.capture.step()
                self.capture.record(layer_index, local_ids)
                self._last_layer = layer_index
            # the routing is folded before the fire, so hits and misses count what was
            # resident when the layer was called (and heat drives background promotions):
            # one store step per MoE layer call
            routed = local_ids if emap is None else local_ids[local_ids >= 0]
            self.store.record(layer_index, routed.astype(np.int64, copy=False))
            self.store.step()
            keys = np.stack([np.full(len(experts), layer_index), experts], 1)
            fired = self.store.fire(keys, max_promote=len(experts))
            try:
                slots = self.store.slot_table[layer_index][torch.from_numpy(experts).to(self.device)].long()
                if bool((slots < 0).any()):
                    # slots held by background promotions still loading: let them land,
                    # then fire again (a pool at the floor needs every slot)
                    self.store.release(fired)
                    fired = None
                    self.store.wait_idle()
                    fired = self.store.fire(keys, max_promote=len(experts))
                    slots = self.store.slot_table[layer_index][
                        torch.from_numpy(experts).to(self.device)
                    ].long()
                if bool((slots < 0).any()):
                    raise TierstoreError(
                        f"MoE layer {layer_index}: {int((slots < 0).sum())} routed experts could "
                        f"not be made resident in a pool of {self.slots} (every slot pinned)"
                    )
                n = len(experts)
                # whole rows first (a contiguous gather), then each plane's bytes: an
                # index_select over a strided plane view is ~50x slower on the CPU
                rows = self.store.pool.index_select(0, slots)
                for plane, dst in zip(self.layout, self._scratch_bytes):
                    dst[:n].copy_(rows[:, plane.offset : plane.offset + plane.nbytes])
                if emap is None:
                    local = torch.from_numpy(np.searchsorted(experts, ids)).to(
                        device=topk_ids.device, dtype=topk_ids.dtype
                    )
                    return inner.apply(layer, x, topk_weights, local, None, None)
                # EP: stock's kernel maps global ids through layer.expert_map (-1: another
                # rank's expert, skipped); for this call the map points at scratch rows
                return self._apply_mapped(layer, inner, x, topk_weights, topk_ids, emap, experts)
            finally:
                if fired is not None:
                    self.store.release(fired)

    @staticmethod
    def call_map(emap: np.ndarray, experts: np.ndarray) -> np.ndarray:
        """global id -> scratch row of its local expert for this call (ascending local
        order, as ``experts``), -1 for experts of other ranks or not routed."""
        out = np.full(len(emap), -1, dtype=np.int64)
        here = np.flatnonzero(emap >= 0)
        pos = np.searchsorted(experts, emap[here])
        ok = (pos < len(experts)) & (experts[np.minimum(pos, len(experts) - 1)] == emap[here])
        out[here[ok]] = pos[ok]
        return out

    def _apply_mapped(self, layer, inner, x, topk_weights, topk_ids, emap, experts):
        table = layer.expert_map
        saved = table.clone()
        table.copy_(torch.from_numpy(self.call_map(emap, experts)).to(table.dtype))
        try:
            return inner.apply(layer, x, topk_weights, topk_ids, None, None)
        finally:
            table.copy_(saved)

    def close(self) -> None:
        from tierstore import metrics

        if self.capture is not None:
            self.capture.close()
        metrics.unregister_store(self.store)
        self.store.close()


_STORES = itertools.count()


def metric_labels(mode: str, rank: int) -> dict:
    """Labels of a face's store metrics: the mode, the TP rank, and the store's number in
    this process (several models, or a test's several engines, in one process)."""
    return {"mode": mode, "rank": str(rank), "store": str(next(_STORES))}


def routing_capture(mode: str, n_experts: int, rank: int, world: int):
    """The face's RoutingCapture when TIERSTORE_CAPTURE names a file (per rank when
    ``world`` > 1: ``x.rank1of2.npy``), else None."""
    from tierstore import settings
    from tierstore.sim.capture import RoutingCapture

    path = settings.get("capture")
    if not path:
        return None
    if world > 1:
        path = f"{str(path)[: -len('.npy')]}.rank{rank}of{world}.npy" if str(path).endswith(".npy") else path
    return RoutingCapture.from_settings(
        path=path,
        meta={"engine": "vllm", "mode": mode, "num_experts": int(n_experts), "rank": rank, "world": world},
    )


def pool_slots(setting, *, n_moe_layers: int, n_experts: int, slot_bytes: int, device) -> int:
    """TIERSTORE_VLLM_SLOTS -> a slot count: ``all`` (every expert of every MoE layer),
    ``floor`` (one layer's experts), ``N%`` of all, an int, or ``auto``: all on the CPU;
    on a GPU, all if they fit in half the free memory, else what does (at least the
    floor)."""
    total = n_moe_layers * n_experts
    if setting in (None, "auto"):
        if torch.device(device).type != "cuda":
            return total
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return max(n_experts, min(total, int(free * 0.5) // max(1, slot_bytes)))
    if setting == "all":
        return total
    if setting == "floor":
        return n_experts
    if isinstance(setting, str) and setting.endswith("%"):
        return max(1, math.ceil(total * float(setting[:-1]) / 100.0))
    return int(setting)


# -- the custom op: opaque to torch.compile --------------------------------------------
CALLS: dict[str, object] = {}


def register_call(key: str, fn) -> None:
    CALLS[key] = fn


@functools.lru_cache(maxsize=1)
def routed_experts_op():
    """``torch.ops.tierstore.routed_experts(x, topk_weights, topk_ids, key)``: runs the
    callable registered under ``key`` (one per MoE layer). torch.compile sees an opaque
    op with a fake implementation, so it never traces the store's host-side work."""

    @torch.library.custom_op("tierstore::routed_experts", mutates_args=())
    def routed_experts(
        x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, key: str
    ) -> torch.Tensor:
        return CALLS[key](x, topk_weights, topk_ids)

    @routed_experts.register_fake
    def _(x, topk_weights, topk_ids, key):
        return torch.empty_like(x)

    return routed_experts


# -- the pack of one model load: found, resumed or written ---------------------------------
def exact_abi(inner, dtype: torch.dtype) -> str:
    """What makes the processed bytes what they are: vLLM's version, the MoE method and
    kernel it chose on this platform, the parameter dtype. Part of the pack identity."""
    import vllm

    backend = getattr(inner, "unquantized_backend", None)
    experts = getattr(inner, "experts_cls", None)
    parts = [
        f"vllm-{vllm.__version__}",
        type(inner).__name__,
        str(backend or "-"),
        getattr(experts, "__name__", "-"),
        str(dtype).replace("torch.", ""),
    ]
    return "vllm-exact:" + ":".join(parts)


def parallel_rank() -> tuple[int, int]:
    """(tensor-parallel rank, world) of this vLLM worker; (0, 1) outside vLLM."""
    try:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return int(get_tensor_model_parallel_rank()), int(get_tensor_model_parallel_world_size())
    except Exception:  # no parallel state (a unit test building layers by hand)
        return 0, 1


class ExactPacks:
    """Finds this rank's complete pack (read-only, shared with any other engine), or
    resumes / writes it through PackWriter at first boot."""

    def __init__(self, pack_dir: str, *, ckpt_id: str, n_layers: int):
        self.pack_dir, self.ckpt_id, self.n_layers = pack_dir, ckpt_id, int(n_layers)
        self.rank, self.world = parallel_rank()
        self.abi: str | None = None
        self.found = None  # (path, Sidecar) of an existing pack of this identity
        self.layout: list[Plane] | None = None
        self.writer = None
        self.wrote: list[int] = []
        self._lock = threading.Lock()

    def _find(self) -> None:
        import glob
        import os

        from tierstore.format.sidecar import load_sidecar, sidecar_path_of

        pattern = os.path.join(self.pack_dir, f"{TAG}.v2.*.rank{self.rank}of{self.world}.pack")
        for path in sorted(glob.glob(pattern)):
            try:
                sc, _ = load_sidecar(sidecar_path_of(path), key20_in_name=True)
            except Exception as exc:  # another identity's damaged pack: not ours
                log.warning("tierstore: skipping %s (%s)", path, exc)
                continue
            if sc.ckpt_id == self.ckpt_id and sc.quantizer_abi == self.abi:
                self.found = (path, sc)
                if sc.layout is not None:
                    self.layout = [
                        Plane(x.name, x.offset, x.bytes, x.dtype, tuple(x.shape)) for x in sc.layout.sections
                    ]
                return

    def has_layer(self, layer: int, inner, dtype: torch.dtype) -> bool:
        with self._lock:
            abi = exact_abi(inner, dtype)
            if self.abi is None:
                self.abi = abi
                self._find()
            elif abi != self.abi:
                raise ConfigError(
                    f"MoE layer {layer}: vLLM chose {abi}, earlier layers "
                    f"{self.abi}; exact mode needs one method for all layers"
                )
            return self.found is not None and layer in self.found[1].layers

    def write(self, layer: int, planes, where: str) -> None:
        from tierstore.format.writer import PackWriter

        layout = plane_layout(planes)
        with self._lock:
            if self.layout is not None and layout != self.layout:
                raise ConfigError(
                    f"{where}: its expert planes {layout} differ from the other layers' {self.layout}"
                )
            self.layout = layout
            if self.writer is None:
                log.info(
                    "tierstore: first boot, writing MoE layers into %s (rank %d of %d)",
                    self.pack_dir,
                    self.rank,
                    self.world,
                )
                self.writer = PackWriter(
                    self.pack_dir,
                    tag=TAG,
                    n_layers=self.n_layers,
                    n_experts=planes[0][1].shape[0],
                    slot_bytes=row_bytes_of(layout),
                    ckpt_id=self.ckpt_id,
                    quantizer_abi=self.abi,
                    layout=layout_sections(layout),
                    rank=self.rank,
                    world=self.world,
                )
            self.writer.write_layer(layer, rows_of(planes, layout))
            self.wrote.append(layer)

    def finish(self, n_moe_layers: int) -> str:
        """Close the writer; the path of the complete pack. ConfigError when a MoE layer
        has no rows (the checkpoint did not deliver it)."""
        from tierstore.format.pack import Pack

        with self._lock:
            if self.writer is not None:
                path = self.writer.path
                self.writer.close()
                self.writer = None
            elif self.found is not None:
                path = self.found[0]
            else:
                raise ConfigError(
                    f"tierstore exact mode: no MoE layer was loaded or found in {self.pack_dir}"
                )
        pack = Pack.open(path)
        try:
            missing = [l for l in range(n_moe_layers) if l not in set(pack.layers)]
        finally:
            pack.close()
        if missing:
            raise ConfigError(
                f"{path}: MoE layers {missing[:8]} have no rows; the checkpoint "
                "did not deliver every routed expert"
            )
        return path
