"""Concurrent OpenAI-client requests to a running ``vllm serve``; prints one JSON line:
the greedy completion text of every prompt, in prompt order.

    python client.py BASE_URL MODEL N_PROMPTS MAX_TOKENS
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import checkpoints  # noqa: E402


def main() -> None:
    from openai import OpenAI

    base, model, n, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    client = OpenAI(base_url=base, api_key="none")
    prompts = checkpoints.prompts(n=n, seed=1)

    def one(p: str) -> str:
        r = client.completions.create(model=model, prompt=p, max_tokens=max_tokens, temperature=0.0)
        return r.choices[0].text

    with ThreadPoolExecutor(max_workers=n) as pool:
        texts = list(pool.map(one, prompts))
    print("RESULT " + json.dumps(texts), flush=True)


if __name__ == "__main__":
    main()
