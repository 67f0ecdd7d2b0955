"""tierstore under a stock vLLM build: a fused-MoE quant method that reads the pool.

    python examples/vllm_quant_method.py [--device cpu|cuda]

Integration 2 of 2 (the other: examples/vllm_moet_dropin.py, the vLLM-Moet fork).

With vLLM installed (the hook targets vllm==0.34.0, ``tierstore.adapters.vllm.
VLLM_VERSION``; tests/test_adapter_vllm_contract.py checks the signatures it uses)::

    from vllm import LLM
    from tierstore.adapters import vllm as ts_vllm
    from tierstore.adapters.vllm_moet import MoetTier

    llm = LLM(model=..., enforce_eager=False)
    model = llm.llm_engine.model_executor.driver_worker.model_runner.model  # your worker's model
    tier = MoetTier.from_env(device="cuda")          # VLLM_MOE_W2_* as for the fork
    tier.finalize_auto(); tier.check_pool_floor(top_k=8); tier.preload_pool()
    ts_vllm.install(model, tier)   # every RoutedExperts layer -> TierstoreFusedMoEMethod;
                                   # frees its own expert weights (the packs serve them)
    # after each engine step (e.g. from a custom worker's execute_model wrapper):
    tier.step_end()

``install`` swaps the quant method of each ``RoutedExperts`` (``_replace_quant_method``)
for ``TierstoreFusedMoEMethod``, a ``FusedMoEMethodBase`` whose ``apply(layer, x,
topk_weights, topk_ids, shared_experts, shared_experts_input)``:

1. maps global expert ids to this rank's with the layer's ``expert_map`` (pairs of
   other ranks get weight 0: shapes stay fixed, capturable);
2. marks the routed experts in ``tier.seen`` (device ops, works inside CUDA graphs);
3. on a prefill-sized batch outside capture, makes them resident first
   (``ensure_resident``: eager, scan-resistant);
4. returns ``tier.moe_w2_forward(...)``: FP4 rows from the pool where the slot
   table says so, 2-bit base rows otherwise. Shared experts stay with vLLM's runner.

Without vLLM (as here) the same logic (``TierstoreMoEMethodLogic``) runs on a
plain ``torch.nn.Module`` standing in for the layer: this script calls
``create_weights`` and ``apply`` exactly as vLLM's ``RoutedExperts`` does, for a
few decode steps around a prefill, and shows the MoE error (vs full precision)
falling once the pool holds the routed experts.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch

from tierstore.adapters import vllm as ts_vllm
from tierstore.adapters.moet_config import config_from_env
from tierstore.adapters.vllm_moet import MoetTier
from tierstore.testing.model import make_moe_model, write_model_packs
from tierstore.compute.moe import dense_moe


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)          # tiny tensors: intra-op threads only add overhead
    print(f"vLLM installed: {ts_vllm.vllm_available()} (hook targets {ts_vllm.VLLM_VERSION})")

    with tempfile.TemporaryDirectory() as d:
        model = make_moe_model(args.layers, args.experts, H=128, I=128, seed=0)
        write_model_packs(model, d)
        cfg = config_from_env({"VLLM_MOE_W2_STORE_DIR": d,
                               "VLLM_MOE_W2_DELTA_GB": repr(32 * model.fp4_bytes / 2**30),
                               "VLLM_MOE_W2_BASE_RAM_GB": "0.01", "VLLM_MOE_W2_POOL_HEAT": "0"})
        with MoetTier(cfg, device=args.device) as tier:
            layers = []
            for index in range(args.layers):      # what vLLM does when it builds the model
                layer = torch.nn.Module()
                method = ts_vllm.TierstoreMoEMethodLogic(tier, index)
                method.create_weights(layer, args.experts, model.H, model.I, torch.float32)
                layers.append((layer, method))
            print(f"{len(layers)} layers hooked; expert parameters are placeholders of "
                  f"{layers[0][0].w13_weight.numel()} elements")

            def run(x):
                """One forward through the MoE layers: vLLM routes, then calls apply."""
                h, errs = x, []
                for index, (layer, method) in enumerate(layers):
                    w, ids = model.route(h.cpu(), index, args.top_k)
                    w, ids = w.to(args.device), ids.to(args.device)
                    out = method.apply(layer, h, w, ids, None, None)
                    ref = dense_moe(h.cpu(), w.cpu(), ids.cpu(), model.w13[index], model.w2[index])
                    errs.append(float((out.cpu().double() - ref).norm() / ref.norm()))
                    h = h + out
                return errs

            def decode(step):
                errs = run(model.tokens(1, seed=50 + step).to(args.device))
                tier.step_end()                   # heat -> lazy promotions for later steps
                tier.wait_manager_idle(5.0)
                print(f"decode {step}: rel. error per layer " + ", ".join(f"{e:.3f}" for e in errs)
                      + f"; pool {int((tier.slot_table >= 0).sum())}/{tier.n_slots} slots used")

            decode(0)                             # cold pool: the 2-bit base answers
            decode(1)
            prefill = run(model.tokens(32, seed=1).to(args.device))
            tier.step_end()
            print("prefill (experts made resident first): rel. error per layer "
                  + ", ".join(f"{e:.3f}" for e in prefill))
            decode(2)                             # warm pool: FP4 rows answer
            decode(3)
            if not ts_vllm.vllm_available():
                try:
                    ts_vllm.method_class()
                except Exception as exc:          # the clear error a user without vLLM sees
                    print(f"without vLLM, install() says: {exc}")
        assert os.path.isdir(d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
