"""``--worker-cls tierstore.adapters.vllm_worker.TierstoreWorker`` (tiered mode only;
exact mode needs no worker): vLLM has no per-step callback, so a subclass of the
platform's worker (CPU or GPU) supplies the three moments the tiered tier needs.

* ``initialize_from_config`` (KV cache allocated, nothing real captured yet): every
  serving tier of the model is finalized: the ExpertStore opens and sizes its pool
  from the memory the KV cache left. vLLM's throwaway capture before KV allocation
  ran on the unsized tier (base rows only) and its graphs are discarded.
* ``determine_available_memory`` and ``compile_or_warm_up_model`` (profile run, the
  throwaway capture, warm-up, the real captures) run with every tier quiet: the
  store's worker thread is drained and steps queue nothing, so no other thread
  touches CUDA while a graph is captured (capture_error_mode "global").
* ``execute_model`` / ``sample_tokens``: after the step's forward, ``step_end`` folds
  heat and queues lazy promotions (off the forward thread's critical path).

``TierstoreWorker`` is built on first attribute access (module ``__getattr__``), so
importing this module never imports vLLM by itself.
"""

from __future__ import annotations

import functools

from tierstore.adapters.vllm import require_vllm


def model_tiers(model) -> list:
    """The distinct serving tiers (one per --quantization tierstore model) of ``model``."""
    out, seen = [], set()
    for module in model.modules():
        runtime = getattr(getattr(module, "quant_method", None), "runtime", None)
        tier = getattr(runtime, "tier", None)
        if tier is not None and id(tier) not in seen:
            seen.add(id(tier))
            out.append(tier)
    return out


class TierHooks:
    """The worker-side calls, separate from vLLM's Worker so they are testable alone."""

    def tiers(self) -> list:
        models = [self.get_model()]
        draft = self.get_draft_model() if hasattr(self, "get_draft_model") else None
        if draft is not None:
            models.append(draft)
        return [t for m in models for t in model_tiers(m)]

    def finalize_tiers(self) -> None:
        for tier in self.tiers():
            tier.finalize()

    def step_end_tiers(self) -> None:
        for tier in self.tiers():
            tier.step_end()


def _quiet_all(tiers):
    import contextlib

    stack = contextlib.ExitStack()
    for tier in tiers:
        stack.enter_context(tier.quiet())
    return stack


@functools.lru_cache(maxsize=1)
def worker_class() -> type:
    require_vllm("--worker-cls tierstore.adapters.vllm_worker.TierstoreWorker")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():  # vLLM's CPU platform has its own worker
        from vllm.v1.worker.cpu_worker import CPUWorker as Worker
    else:
        from vllm.v1.worker.gpu_worker import Worker

    class TierstoreWorker(TierHooks, Worker):
        def determine_available_memory(self) -> int:
            with _quiet_all(self.tiers()):
                return super().determine_available_memory()

        def initialize_from_config(self, kv_cache_config) -> None:
            super().initialize_from_config(kv_cache_config)
            self.finalize_tiers()  # pool + slot table: once, before real captures

        def compile_or_warm_up_model(self):
            self.finalize_tiers()  # idempotent; covers executors that skip the above
            with _quiet_all(self.tiers()):
                return super().compile_or_warm_up_model()

        def execute_model(self, scheduler_output):
            out = super().execute_model(scheduler_output)
            self.step_end_tiers()
            return out

        def shutdown(self) -> None:
            for tier in self.tiers():
                tier.shutdown()
            super().shutdown()

    return TierstoreWorker


def __getattr__(name: str):
    if name == "TierstoreWorker":
        return worker_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
