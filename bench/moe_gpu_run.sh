#!/bin/bash
# One device call for the MoE kernels: the extension (a carried cp312 sm_90 build when it
# imports there, else built there with cmake), the MoE GPU tests, the benchmark with its
# baselines (JSON + log to $OUT) and an opcode histogram of the grouped kernels' SASS.
# Usage, from the tree's root on the device: bash bench/moe_gpu_run.sh /path/to/.whl
set -u
WHL=${1:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
if ! python3 -c "from tierstore import _C; assert _C.built_with_cuda() and hasattr(_C, 'moe_mma')" 2>/dev/null; then
  t0=$(date +%s)
  rm -f tierstore/_C*.so
  { cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(which python3) \
      -DCMAKE_CUDA_ARCHITECTURES=90 && cmake --build build/dev -j16; } > $OUT/build.log 2>&1 \
    || { tail -40 $OUT/build.log; exit 1; }
  cp build/dev/_C*.so tierstore/
  echo "built there: $(( $(date +%s) - t0 )) s"
else
  echo "carried extension imports"
fi
timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_moe_mma_gpu.py tests/test_moe_gpu.py \
  tests/test_adapter_moet_gpu.py 2>&1 | tee $OUT/gpu_tests.log | tail -30
timeout 180 python3 bench/bench_moe.py --baseline --max-check-T 16 --json $OUT/moe.json > $OUT/bench.log 2>&1
echo "bench rc=$?"; grep -E "^copy|T=  1 |T=512" $OUT/bench.log | cut -c1-150
so=$(ls tierstore/_C*.so | head -1)
command -v cuobjdump >/dev/null && timeout 30 python3 bench/moe_sass_hist.py "$so" moe_mma_kernelILb1ELi1ELi1ELi2E \
  moe_mma_kernelILb0ELi2ELi1ELi1E > $OUT/sass.txt 2>&1; head -c 1500 $OUT/sass.txt
