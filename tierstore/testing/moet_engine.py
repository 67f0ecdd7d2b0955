"""A replay of vLLM-Moet's calls into its FP4 tier module, for conformance tests and demos.

``MoetEngine`` drives a ``moe_w2_delta``-shaped module (``tierstore.adapters.vllm_moet``)
exactly as vLLM-Moet's glue, gate, V1 runner, V2 runner and worker do:

boot  1. ``get_tier(n_experts=E, dev=, w13_bytes=, w2_bytes=)`` (keywords, first call wins)
      2. per layer ``tier.add_layer_host_planes(key, w13_gpu, w2_gpu)`` (every boot; the
         store skips layers its pack already holds)
      3. V1 only: ``check_pool_floor(top_k, n_spec, max_num_seqs)`` (ValueError re-raised)
      4. an eager profile forward (V2: after ``wait_manager_idle``): ``mark_seen`` per layer,
         reading ``slot_table[key]`` even when ``n_slots == 0``
      5. worker: ``tier.finalize_auto()``; an exception is only a warning
      6. capture: the forward under ``torch.cuda.graph(..., capture_error_mode="global")``
         on CUDA (``notify_capture`` while capturing; ``slot_table`` rows and
         ``pool.data_ptr()`` are baked), on the CPU the same calls eagerly
step  ``wait_manager_idle()`` -> forward (replay) -> gate: on a fire, ``budget =
      step_promote_budget()``, up to ``fire_fp_max()`` rounds of ``n =
      force_promote_step(max_promote=budget)``, ``budget -= n``, stop when ``n == 0``,
      else replay -> ``step_end()`` (errors swallowed)
end   ``shutdown()``

The forward is tiny but real: per layer it marks the routed experts and sums one
byte lane of each routed expert's row, from the pool where ``slot_table`` maps
it and from the resident planes otherwise, so it reads the tier's tensors the
way the descriptor kernels do. ``check()`` compares every mapped pool slot with
the pack (or the planes) byte for byte.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch


class MoetEngine:
    def __init__(
        self,
        module,
        planes: dict[int, tuple[torch.Tensor, torch.Tensor]],
        *,
        n_experts: int,
        dev,
        top_k: int = 2,
        tokens: int = 1,
        runner: str = "v1",
        graphs: bool = False,
        n_spec: int = 0,
        max_num_seqs: int = 1,
        seed: int = 0,
        free_bytes: int | None = None,
    ):
        self.free_bytes = free_bytes  # finalize_auto's memory (None: what the device says)
        self.m, self.planes, self.E, self.dev = module, planes, int(n_experts), torch.device(dev)
        self.top_k, self.tokens, self.runner = int(top_k), int(tokens), runner
        self.graphs = bool(graphs) and self.dev.type == "cuda"
        self.n_spec, self.max_num_seqs = n_spec, max_num_seqs
        self.layers = sorted(planes)
        self.gen = torch.Generator().manual_seed(seed)
        self.ids = torch.zeros(len(self.layers), tokens * top_k, dtype=torch.long, device=self.dev)
        self.out = torch.zeros((), dtype=torch.int64, device=self.dev)
        self.graph = None
        self.tier = None
        w13, w2 = planes[self.layers[0]]
        self.w13_bytes, self.w2_bytes = int(w13.shape[1]), int(w2.shape[1])
        # the resident "base": here the same bytes, so any forward is checkable
        self.base = {k: torch.cat([a, b], 1).to(self.dev) for k, (a, b) in planes.items()}
        self.history: list[dict] = []

    # -- boot -----------------------------------------------------------------------------
    def boot(self) -> MoetEngine:
        m = self.m
        tier = self.tier = m.get_tier(
            n_experts=self.E, dev=self.dev, w13_bytes=self.w13_bytes, w2_bytes=self.w2_bytes
        )
        if tier is not None:
            for key in self.layers:
                w13, w2 = self.planes[key]
                tier.add_layer_host_planes(key, w13.to(self.dev), w2.to(self.dev))
            if self.runner == "v1":
                m.check_pool_floor(self.top_k, self.n_spec, self.max_num_seqs)
        self._wait_idle()
        self._route()
        self._forward()  # the profile run: eager
        if tier is not None:
            try:
                if self.free_bytes is None:
                    tier.finalize_auto()
                else:
                    tier.finalize_auto(free_bytes=self.free_bytes)
            except Exception as exc:  # noqa: BLE001 - vLLM-Moet's worker only warns
                warnings.warn(f"finalize_auto failed: {exc}", RuntimeWarning, stacklevel=2)
        self._capture()
        return self

    def _capture(self) -> None:
        if not self.graphs:
            if self.tier is not None:
                self.tier.notify_capture()  # the glue's call, here without a capture
            return
        side = torch.cuda.Stream(self.dev)
        side.wait_stream(torch.cuda.current_stream(self.dev))
        with torch.cuda.stream(side):  # warm up on a side stream, as torch asks
            self._forward()
        torch.cuda.current_stream(self.dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="global"):
            self._forward()

    # -- one forward: what the glue does per MoE layer ----------------------------------------
    def _forward(self) -> None:
        tier = self.m._TIER
        self.out.zero_()
        for row, key in enumerate(self.layers):
            ids = self.ids[row]
            if tier is not None:
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    tier.notify_capture()
                self.m.mark_seen(tier.seen[key], ids.view(-1).long())
                slots = tier.slot_table[key].index_select(0, ids).long()
                lane = self.base[key][ids, 0].long()
                if tier.n_slots > 0:  # a host decision, fixed per capture
                    from_pool = tier.pool[slots.clamp(min=0), 0].long()
                    lane = torch.where(slots >= 0, from_pool, lane)
            else:
                lane = self.base[key][ids, 0].long()
            self.out.add_(lane.sum())

    def _run(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._forward()

    def _route(self) -> None:
        host = torch.stack(
            [torch.randperm(self.E, generator=self.gen)[: self.top_k * self.tokens] for _ in self.layers]
        )
        self.ids.copy_(host.to(self.dev))

    def _wait_idle(self) -> None:
        for t in (getattr(self.m, "_BASE_TIER", None), self.m._TIER):
            if t is not None:
                t.wait_manager_idle()

    # -- steps -------------------------------------------------------------------------------
    def step(self, fire: bool = True, on_step=None) -> dict:
        m = self.m
        self._route()
        self._wait_idle()
        if on_step is not None:
            on_step("idle")
        self._run()
        promoted, rounds = 0, 0
        if fire and m._TIER is not None and m.env().gate:
            budget = m.step_promote_budget()
            while rounds < m.fire_fp_max():
                try:
                    n = m.force_promote_step(max_promote=budget)
                except Exception as exc:  # noqa: BLE001 - the runner logs and skips the replay
                    warnings.warn(f"gate promotion failed: {exc}", RuntimeWarning, stacklevel=2)
                    break
                if budget is not None:
                    budget = max(budget - n, 0)
                promoted += n
                if not (n > 0 and m.env().gate_reforward):
                    break
                rounds += 1
                self._run()
                if on_step is not None:
                    on_step("replay")
        for t in (getattr(m, "_BASE_TIER", None), m._TIER):
            if t is not None:
                try:
                    t.step_end()
                except Exception:  # noqa: BLE001 - the runners swallow step_end errors
                    pass
        if on_step is not None:
            on_step("end")
        rec = {"promoted": promoted, "rounds": rounds, "out": int(self.out.item())}
        self.history.append(rec)
        return rec

    def expected_out(self) -> int:
        """The forward's value from the planes alone (pool rows hold the same bytes)."""
        ids = self.ids.cpu()
        return int(
            sum(self.base[k][ids[r].to(self.dev), 0].long().sum().item() for r, k in enumerate(self.layers))
        )

    def shutdown(self) -> None:
        self.m.shutdown()

    # -- checking ---------------------------------------------------------------------------
    def check(self, reference=None) -> int:
        """Every mapped slot holds its expert's row (from ``reference(layer, expert)``, or
        the planes); no slot is mapped twice. Returns the number of mapped experts."""
        tier = self.m._TIER
        if tier is None:
            return 0
        if self.dev.type == "cuda":
            torch.cuda.synchronize(self.dev)
        table = tier.slot_table.cpu().numpy().reshape(-1)
        mapped = np.flatnonzero(table >= 0)
        slots = table[mapped]
        assert len(set(slots.tolist())) == len(slots), "a pool slot is mapped twice"
        assert np.all(slots < tier.n_slots), "slot_table points past the pool"
        if tier.expert_store is not None:  # its bookkeeping agrees with the device table
            tier.expert_store.check_invariants()
        for key, slot in zip(mapped.tolist(), slots.tolist()):
            layer, expert = divmod(key, tier.E)
            want = reference(layer, expert) if reference is not None else self.base[layer][expert].cpu()
            got = tier.pool[slot].cpu()
            assert torch.equal(got, torch.as_tensor(want)), (
                f"pool slot {slot} (layer {layer} expert {expert}) differs from the pack"
            )
        return len(mapped)
