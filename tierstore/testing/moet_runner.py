"""A small replay of vLLM-Moet's model runner, driving a :class:`MoetTier`.

It makes exactly the calls the engine makes, in the same order, on a tiny
generated model (``tierstore.model.MoEModel`` layers with a residual stream and
a random LM head), so the tier surface can be tested and demonstrated without
vLLM:

* prefill: per layer ``ensure_resident`` (eager) -> ``mark_seen`` -> forward;
  then ``step_end``;
* decode: ``wait_manager_idle`` -> ``step_begin`` -> forward (each layer
  ``mark_seen`` + ``moe_w2_forward``, captured in a CUDA graph when asked) ->
  gate decision -> on a fire ``force_promote`` + replay, up to ``max_rounds`` ->
  ``step_end``.

The forward never syncs the host on the CUDA decode path, so it is capturable;
the pool and slot table are allocated before capture and only their contents
change between replays.
"""
from __future__ import annotations

import time

import msgspec
import torch

from tierstore.compute.gate import UncertaintyGate


class DecodeStats(msgspec.Struct, frozen=True):
    """One decode step: fired, re-runs made, experts promoted, min confidence per run."""
    fired: bool
    rounds: int
    promoted: int
    confidence: tuple[float, ...]
    seconds: float


class TinyDecoder:
    """Residual stack of the model's MoE layers + an LM head. Weights live on ``device``."""

    def __init__(self, model, top_k: int, vocab: int = 64, device="cpu", seed: int = 0,
                 logit_std: float = 8.0):
        self.top_k, self.n_layers = int(top_k), model.n_layers
        g = torch.Generator().manual_seed(seed + 1)
        self.router = model.router.to(device)                       # [L, H, E]
        # logits of std ~logit_std over 64 words: some rows sure, some not (the gate's range)
        scale = logit_std / model.H ** 0.5
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


class EngineReplay:
    """Drives a tier like vLLM-Moet's runner does. ``graph=True`` (CUDA only):
    the decode forward is captured once for the static batch shape of the first
    decode call and replayed from then on."""

    def __init__(self, tier, decoder: TinyDecoder, gate: UncertaintyGate | None = None,
                 max_rounds: int = 3, graph: bool = False, idle_timeout: float = 5.0):
        self.tier, self.decoder = tier, decoder
        self.gate = gate or UncertaintyGate()
        self.max_rounds, self.graph, self.idle_timeout = int(max_rounds), bool(graph), idle_timeout
        self._graph = None
        self._static_x = self._static_out = None
        self.history: list[DecodeStats] = []

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        self.tier.step_begin()
        out = self.decoder.forward(self.tier, x, prefill=True)
        self.tier.step_end()
        return out

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.graph:
            return self.decoder.forward(self.tier, x)
        if self._graph is None:
            self._capture(x)
        self._static_x.copy_(x)
        self._graph.replay()
        return self._static_out.clone()

    def _capture(self, x: torch.Tensor) -> None:
        self._static_x = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):       # warm-up outside capture (allocator, kernels)
            self.decoder.forward(self.tier, self._static_x)
        torch.cuda.current_stream().wait_stream(side)
        self.tier.seen.zero_()              # warm-up marks are not a step's routing
        self._graph = torch.cuda.CUDAGraph()
        # thread_local: the store's worker thread may touch CUDA (lazy promotions)
        # while this thread captures; that must not invalidate the capture
        with torch.cuda.graph(self._graph, capture_error_mode="thread_local"):
            self._static_out = self.decoder.forward(self.tier, self._static_x)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        t0 = time.perf_counter()
        tier = self.tier
        tier.wait_manager_idle(self.idle_timeout)
        tier.step_begin()
        logits = self._forward(x)
        confidence = [float(self.gate.confidence(logits).min())]
        fired = not (confidence[0] > self.gate.tau)
        rounds = promoted = 0
        while tier.config.gate and not (confidence[-1] > self.gate.tau) and rounds < self.max_rounds:
            result = tier.force_promote()
            n_new = _count(result)
            if n_new == 0:
                break              # everything routed is already FP4: a replay changes nothing
            promoted += n_new
            rounds += 1
            logits = self._forward(x)
            confidence.append(float(self.gate.confidence(logits).min()))
        tier.step_end()
        self.gate.note_step(fired and tier.config.gate, rounds, promoted,
                            fired and not (confidence[-1] > self.gate.tau))
        self.history.append(DecodeStats(fired, rounds, promoted, tuple(confidence),
                                        time.perf_counter() - t0))
        return logits


def _count(result) -> int:
    from tierstore.compute.gate import promoted_count
    return promoted_count(result)
