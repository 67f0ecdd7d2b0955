#!/usr/bin/env bash
# One device-machine call: build, GPU tests + the whole suite, kernel / preheat benches, demo.
# Usage (device tool, carry .whl):  bash bench/gpu_suite.sh [tests|bench|all]
# Logs and JSON land in $OUT (default ./gpu-out).
set -uo pipefail
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
what=${1:-all}
export PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "[gpu_suite +$(( $(date +%s) - t0 ))s] $*"; }

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/msgspec-*.whl && export PYTHONPATH=/tmp/site || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/machine.txt"
uname -r >> "$OUT/machine.txt"; nproc >> "$OUT/machine.txt"
stamp build
CMAKE_ARGS="-DCMAKE_CUDA_ARCHITECTURES=90" python3 -m pip install --no-build-isolation --no-deps -e . -q \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
python3 -c "import tierstore as t; print('cuda_available', t.cuda_available())" | tee -a "$OUT/machine.txt"

if [[ $what == tests || $what == all ]]; then
  stamp "gpu tests"
  python3 -m pytest -q -m gpu tests -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | tail -25
  stamp "full suite"
  timeout 170 python3 -m pytest -q -n 12 tests -p no:cacheprovider 2>&1 | tee "$OUT/all_tests.log" | tail -8
fi
if [[ $what == bench || $what == all ]]; then
  stamp "moe kernel bench"
  timeout 90 python3 bench/bench_moe.py --json "$OUT/moe.json" 2>&1 | tail -20
  stamp "preheat bench"
  timeout 110 python3 bench/bench_warm.py --preheat --device cuda --pool-gb 6 --json 2>&1 | tee "$OUT/preheat.json" | tail -20
  stamp "demo"
  timeout 90 tierstore demo --device cuda 2>&1 | tee "$OUT/demo.txt" | tail -22
fi
stamp done
