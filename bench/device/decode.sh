#!/usr/bin/env bash
# One device call for issue 43 (decode tokens/s; device-side residency): the sm_90 build, the
# residency GPU tests and the engine / store GPU tests the mapped arena registration touches,
# then `tierstore bench decode` at DeepSeek-V4-Flash depth and row size (43 layers x 32
# experts of 12.75 MiB FP4 rows, top-6, batch 1: an 18.4 GB pack and arena) with the pools
# that put the synthetic router's misses at ~0 / 11 / 14 / 68 / 100 %.
# Usage (device tool, carry [".whl"]): bash bench/device/decode.sh
#   DECODE_ARGS     more arguments for bench decode (e.g. "--experts 64 --steps 32")
#   GPU_TESTS       pytest arguments of the test step (prelude.sh; "none" skips it)
#   DECODE_TIMEOUT  seconds for the bench (default 420)
# Logs, decode.json and decode.png land in $OUT (default /tmp/out).
STAMP=decode
GPU_TESTS=${GPU_TESTS:-"tests/store/test_residency_gpu.py tests/store/test_store_gpu.py tests/io/test_engine_gpu.py"}
TEST_TIMEOUT=${TEST_TIMEOUT:-150}
source "$(dirname "${BASH_SOURCE[0]}")/prelude.sh"
stamp "bench decode"
timeout "${DECODE_TIMEOUT:-420}" python3 -m tierstore bench decode --dir /tmp/benchdecode --device cuda \
  --layers 43 --experts 32 --pools 100,60,50,20,10 --steps 48 --warmup 12 \
  --modes device,host_planned,uva_static,device_hits_first --out "$OUT/decode.json" --png "$OUT/decode.png" \
  ${DECODE_ARGS:-} > "$OUT/decode.log" 2> "$OUT/decode.err"
echo "bench decode rc=$?"; cat "$OUT/decode.log"; tail -30 "$OUT/decode.err"
stamp done
