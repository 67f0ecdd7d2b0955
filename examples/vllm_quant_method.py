"""tierstore under a stock vLLM 0.34: ``--quantization tierstore`` serves routed experts.

    python examples/vllm_quant_method.py [--device cpu|cuda]

Integration 2 of 2 (the other: examples/vllm_moet_dropin.py, the vLLM-Moet fork).
What a user types (docs/VLLM.md)::

    pip install tierstore vllm==0.34.0
    vllm serve MODEL --quantization tierstore \\
        --worker-cls tierstore.adapters.vllm_worker.TierstoreWorker

tierstore's ``vllm.general_plugins`` entry point registers the ``tierstore``
quantization config in every vLLM process (API server, EngineCore, workers); the
config hands every ``RoutedExperts`` layer a ``TierstoreVllmMoEMethod`` and every
other layer the checkpoint's own method. The first boot writes the routed experts
into packs from vLLM's own weight loader; later boots skip loading them. The worker
class sizes the pool after the KV cache, keeps the store quiet during CUDA-graph
capture and calls ``step_end`` after every step.

This script runs the same method logic (``TierstoreMethodMixin``: the class vLLM's
base is mixed into) on plain modules, without vLLM: a first boot that writes the
packs from checkpoint tensors handed to the placeholders' weight loaders as vLLM's
``RoutedExperts.load_weights`` does, a second boot that skips them, then decode steps
around a prefill, showing the MoE error (vs full precision) falling once the pool
holds the routed experts.
"""

from __future__ import annotations

import argparse
import tempfile

import torch

from tierstore.adapters import vllm as ts_vllm
from tierstore.adapters import vllm_quant
from tierstore.compute.moe import dense_moe
from tierstore.format import layouts
from tierstore.testing.model import make_moe_model


def boot(model, pack_dir: str, device: str, slots: int):
    """One vLLM boot's worth of calls: create_weights, load, process_weights_after_loading."""
    env = {
        "dir": None,
        "ram_gb": 0.0,
        "prefill_tokens": 16,
        "vram_gb": slots * layouts.row_bytes("fp4", model.H, model.I) / 2**30,
    }
    rt = vllm_quant.Runtime(
        pack_dir=pack_dir, ckpt_id="example-checkpoint", n_layers=model.n_layers + 1, device=device, env=env
    )
    layers, skipped = [], 0
    for i in range(model.n_layers):
        index = rt.moe_index(f"model.layers.{i + 1}.mlp.experts")  # layer 0 is dense
        method = vllm_quant.TierstoreMethodMixin(rt, index, ["w13_weight", "w2_weight"])
        layer = torch.nn.Module()
        method.create_weights(layer, model.n_experts, model.H, model.I, torch.float32)
        skipped += layer.w13_weight.weight_loader.__name__ == "_drop"
        for e in range(model.n_experts):  # what RoutedExperts.load_weights does
            w13 = model.w13[i][e]
            for shard, param, w in (
                ("w1", layer.w13_weight, w13[: model.I]),
                ("w3", layer.w13_weight, w13[model.I :]),
                ("w2", layer.w2_weight, model.w2[i][e]),
            ):
                param.weight_loader(
                    param=param,
                    loaded_weight=w,
                    weight_name="",
                    shard_id=shard,
                    expert_id=e,
                    return_success=True,
                )
        layers.append((layer, method))
    for layer, method in layers:
        method.process_weights_after_loading(layer)
    return rt, layers, skipped


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add overhead
    print(f"vLLM installed: {ts_vllm.vllm_available()} (hook targets {ts_vllm.VLLM_VERSION})")

    with tempfile.TemporaryDirectory() as d:
        model = make_moe_model(args.layers, args.experts, H=128, I=128, seed=0)
        rt, _, skipped = boot(model, d, args.device, slots=32)
        print(f"first boot: packs written {sorted(rt.tier.packs)}; {skipped} layers skipped")
        rt.tier.shutdown()
        rt, layers, skipped = boot(model, d, args.device, slots=4 * args.experts)
        print(f"second boot: {skipped} of {args.layers} layers skipped loading (served from the packs)")
        tier = rt.tier
        tier.finalize()  # what TierstoreWorker does after KV allocation

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
            tier.step_end()  # what TierstoreWorker does after each step
            tier.store.wait_idle(5.0)
            print(
                f"decode {step}: rel. error per layer "
                + ", ".join(f"{e:.3f}" for e in errs)
                + f"; pool {int((tier.store.slot_table >= 0).sum())}/{tier.store.n_slots} slots used"
            )

        decode(0)  # cold pool: the 2-bit base answers
        decode(1)
        prefill = run(model.tokens(32, seed=1).to(args.device))
        tier.step_end()
        print(
            "prefill (experts made resident first): rel. error per layer "
            + ", ".join(f"{e:.3f}" for e in prefill)
        )
        decode(2)  # warm pool: FP4 rows answer
        decode(3)
        tier.shutdown()
        if not ts_vllm.vllm_available():
            try:
                vllm_quant.config_class()
            except Exception as exc:  # the clear error a user without vLLM sees
                print(f"without vLLM, --quantization tierstore says: {exc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
