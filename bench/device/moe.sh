#!/usr/bin/env bash
# One device call for the MoE kernels: build sm_90, the MoE GPU tests, the kernel benchmark
# with its baselines (JSON + log to $OUT) and an opcode histogram of the grouped kernels'
# SASS (bench/device/sass_hist.py, where cuobjdump exists).
#   bash bench/device/moe.sh
STAMP=moe TEST_TIMEOUT=150
GPU_TESTS="-m gpu tests/compute/test_moe_mma_gpu.py tests/compute/test_moe_gpu.py tests/adapters/test_adapter_moet_gpu.py"
source "$(dirname "$0")/prelude.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader
stamp "bench moe"
timeout 180 python3 bench/bench_moe.py --baseline --max-check-T 16 --json "$OUT/moe.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"; grep -E "^copy|T=  1 |T=512" "$OUT/bench.log" | cut -c1-150
so=$(ls tierstore/_C*.so | head -1)
command -v cuobjdump >/dev/null && timeout 30 python3 bench/device/sass_hist.py "$so" \
  moe_mma_kernelILb1ELi1ELi1ELi2E moe_mma_kernelILb0ELi2ELi1ELi1E > "$OUT/sass.txt" 2>&1
[ -f "$OUT/sass.txt" ] && head -c 1500 "$OUT/sass.txt"
stamp done
