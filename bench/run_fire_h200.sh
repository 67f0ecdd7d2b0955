#!/usr/bin/env bash
# One device call for issue 13 (H200 machine): build sm_90, run the fire-path GPU
# tests, then `tierstore bench fire` (JSON, PNG, log under $OUT).
# Run from the worktree copy: cd .dev/perf && bash bench/run_fire_h200.sh
# Needs .whl (msgspec) and .whl-kvikio (kvikio-cu13, libkvikio-cu13, rapids-logger;
# installed --no-deps: cupy-cuda13x, cuda-pathfinder, cuda-toolkit, nvidia-cufile,
# numpy and packaging are already in the image).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=${WHEELS:-../..}
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$W"/.whl/*.whl "$W"/.whl-kvikio/*.whl \
  > "$OUT/pip.log" 2>&1 || echo "pip failed (see pip.log)"
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import kvikio; print('kvikio', kvikio.__version__)" >> "$OUT/pip.log" 2>&1
t0=$(date +%s)
cmake -S . -B build/dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE=$(which python3) \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$OUT/build.log" 2>&1 && cmake --build build/dev -j16 >> "$OUT/build.log" 2>&1 \
  && cp build/dev/_C*.so tierstore/ || { echo "BUILD FAILED"; tail -30 "$OUT/build.log"; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_fire_pipelined.py tests/test_store_gpu.py \
  tests/test_bench_fire.py tests/test_store_faults.py > "$OUT/gpu_tests.log" 2>&1
echo "tests rc=$? $(tail -1 "$OUT/gpu_tests.log")"
nproc; free -g | head -2; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout ${BENCH_TIMEOUT:-330} python3 -m tierstore bench fire --dir /tmp/benchfire --device cuda \
  --drop-caches --out "$OUT/fire_h200.json" --png "$OUT/fire_h200.png" ${BENCH_ARGS:-} > "$OUT/bench_fire.log" 2> "$OUT/bench_fire.err"
echo "bench rc=$?"
cat "$OUT/bench_fire.log"; tail -5 "$OUT/bench_fire.err"
P=$(ls /tmp/benchfire/*.pack | head -1)
[ -n "$P" ] && timeout 60 python3 bench/fire_split.py "$P" cuda > "$OUT/fire_split.log" 2>&1; cat "$OUT/fire_split.log" | tail -4
