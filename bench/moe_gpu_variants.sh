#!/bin/bash
# Device call for the decode-tile preload variants of the grouped kernels
# (TS_MOE_PRELOAD = 1: one-chunk prefetch, 2, 4: chunks loaded at once), each a cp312
# sm_90 extension built beforehand into variants/pN/: the grouped GPU tests and the
# kernel bench for each in the same run (+ the v2 GEMV once). JSON per variant and one
# log to $OUT.   Usage, from the tree's root: bash bench/moe_gpu_variants.sh /path/to/.whl
set -u
WHL=${1:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/*.whl || exit 1
export PYTHONUNBUFFERED=1
LOG=$OUT/variants.log
for V in 1 2 4; do
  D=/tmp/v$V
  rm -rf $D && mkdir -p $D && cp -r tierstore tests bench pyproject.toml $D/ && rm -f $D/tierstore/_C*.so \
    && cp variants/p$V/_C*.so $D/tierstore/ || exit 1
  cd $D
  echo "== TS_MOE_PRELOAD=$V" | tee -a $LOG
  PYTHONPATH=/tmp/site:$D timeout 60 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_moe_mma_gpu.py 2>&1 \
    | tail -2 | tee -a $LOG
  PYTHONPATH=/tmp/site:$D timeout 70 python3 bench/bench_moe.py --kernels mma --T 1,4,16,64,256 --max-check-T 1 \
    --json $OUT/moe_p$V.json >> $LOG 2>&1
  echo "bench rc=$?" | tee -a $LOG
  cd - > /dev/null
done
cd /tmp/v1 && PYTHONPATH=/tmp/site:/tmp/v1 timeout 40 python3 bench/bench_moe.py --kernels gemv --T 1,4,16 \
  --max-check-T 1 --json $OUT/moe_gemv.json >> $LOG 2>&1
grep -E "^==|passed|failed|^copy|T=  1 " $LOG | cut -c1-120
