#!/bin/bash
# One device call: build the tree from .gpusrc/moe.tar in /tmp/ts, run the MoE GPU tests,
# the full kernel bench (JSON to $OUT/moe.json) with a per-kernel split, then a short
# repeat of the all-resident bf16 rows (timing spread) and an opcode histogram of the kernels' SASS.
# Usage (repo root on the device): bash bench/moe_gpu_run.sh   [needs .gpusrc and .whl carried]
set -u
R=$PWD
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $R/.whl/msgspec-*.whl || exit 1
mkdir -p /tmp/ts && tar -xf .gpusrc/moe.tar -C /tmp/ts && cd /tmp/ts || exit 1
t0=$(date +%s)
CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 python3 -m pip install --no-build-isolation --no-deps -e . -q \
  > $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
timeout 60 python3 -m pytest -q -x tests/test_moe_gpu.py 2>&1 | tee $OUT/gpu_tests.log | tail -15
timeout 70 python3 bench/bench_moe.py --kernel-split --json $OUT/moe.json 2>&1 | tee $OUT/bench.log
echo "--- repeat (spread): all resident, bf16, default settings"
timeout 25 python3 bench/bench_moe.py --resident all --dtypes bfloat16 --json $OUT/moe_repeat.json 2>&1 \
  | tee -a $OUT/bench.log | grep resident=
so=$(ls tierstore/_C*.so build/*/_C*.so 2>/dev/null | head -1)
command -v cuobjdump >/dev/null && [ -n "$so" ] && timeout 30 python3 bench/moe_sass_hist.py "$so" 2>&1 | tee $OUT/sass.txt
