#!/bin/bash
# One call on the H200 device machine: carried wheels, build (sm_90 only), the engine
# tests, then the issue-3 benchmark with the checked-in config. Logs and JSON go to $OUT.
#   bash bench/io_h200_run.sh [SWEEP]        (SWEEP: THREADS:CHUNK_MIB[:noramp],...)
set -o pipefail
OUT=${OUT:-/tmp/io_out}; mkdir -p "$OUT"
SWEEP=${1:-16:4:noramp,16:2,16:8}
LIMIT=${LIMIT:-285}   # seconds for the whole script (the call's timeout_s is 300)
t0=$(date +%s); since() { echo $(( $(date +%s) - t0 )); }
date -u +"[run] start %FT%TZ"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
# Build first, without /tmp/site on the path (a pip build there once failed with
# "Cannot import 'scikit_build_core.build'"); if pip's build still fails, build the
# module with CMake directly and import tierstore from the tree.
if env -u PYTHONPATH CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 python3 -m pip install \
     --no-build-isolation --no-deps -e . -q >"$OUT/build.log" 2>&1; then
  export PYTHONPATH=/tmp/site
else
  tail -3 "$OUT/build.log"
  env -u PYTHONPATH python3 -c "import scikit_build_core.build" 2>&1 | tail -3
  echo "[run] pip build failed; building with cmake"
  cmake -S . -B /tmp/tsb -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DPython_EXECUTABLE="$(command -v python3)" >>"$OUT/build.log" 2>&1 &&
    cmake --build /tmp/tsb -j16 >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  cp /tmp/tsb/_C*.so tierstore/ && export PYTHONPATH="$PWD:/tmp/site"
fi
python3 -c "import tierstore; print('[run] cuda_available', tierstore.cuda_available())"
echo "[run] built at $(since) s"
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current \
  --format=csv,noheader | tee "$OUT/gpu.txt"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_engine*.py 2>&1 | tee "$OUT/pytest.log" | tail -6
echo "[run] tests done at $(since) s"
# SIGINT on overrun: bench io then writes what it measured (JSON with "incomplete").
PYTHONUNBUFFERED=1 timeout -s INT $(( LIMIT - $(since) )) python3 bench/bench_io.py \
  bench/configs/io_h200.json --pack /tmp/tierstore-bench-io.bin --sweep "$SWEEP" \
  --out "$OUT/io_h200.json" 2>&1 | tee "$OUT/bench.log" | tail -45
echo "[run] bench done at $(since) s"
