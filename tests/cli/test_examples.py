"""The runnable examples run (subprocess, small sizes, CPU) and say what they claim."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"
)


def run_example(name: str, *args: str) -> str:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    env = {k: v for k, v in env.items() if not k.startswith("VLLM_MOE_W2_")}
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, name), "--device", "cpu", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, f"{name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_basic_store_shows_fp4_promotion_beats_the_base():
    out = run_example("basic_store.py", "--layers", "2", "--experts", "8")
    m = re.search(r"2-bit base ([\d.]+), with FP4 promotions ([\d.]+)", out)
    assert m and float(m.group(2)) < float(m.group(1))
    assert re.search(r"fire: promoted \d+ experts", out)


def test_vllm_moet_dropin_replays_the_engine_sequence():
    out = run_example("vllm_moet_dropin.py", "--steps", "6", "--layers", "2", "--experts", "8")
    assert len(re.findall(r"^step \d+: promoted \d+ .* pool == pack$", out, re.M)) == 12
    assert re.search(r"^boot 2: pack \S+ holds 2/2 layers", out, re.M)  # found, layers skipped
    assert "moe_w2_delta._TIER is None" in out


def test_vllm_quant_method_runs_the_hook_logic_without_vllm():
    out = run_example("vllm_quant_method.py", "--experts", "8")
    errs = [float(e) for e in re.findall(r"^decode \d: rel\. error per layer ([\d.]+)", out, re.M)]
    assert len(errs) == 4 and max(errs[2:]) < min(errs[:2])  # warm pool beats the cold base
    if "vLLM installed: False" in out:
        assert "install vllm==" in out


@pytest.mark.parametrize("name", ["basic_store.py", "vllm_moet_dropin.py", "vllm_quant_method.py"])
def test_every_example_documents_itself(name):
    with open(os.path.join(EXAMPLES, name)) as fh:
        text = fh.read()
    doc = text.split('"""')[1]
    assert f"python examples/{name}" in doc and len(doc.splitlines()) >= 10
