#!/usr/bin/env bash
# One device round of whole-model CUDA benchmarks (docs/PERFORMANCE.md, "CUDA backend"): writes a
# synthetic model of the given shape to /dev/shm, then ds4-bench --cuda at the given frontiers,
# with nvidia-smi's view of the device. Binaries and their .so files come from BIN and LIB
# (carried to the device machine); logs and CSVs go to OUT.
#   bench/cuda/run_model_bench.sh SHAPE QUANT CTX_START CTX_MAX GEN_TOKENS [RUNS]
set -euo pipefail
shape=$1 quant=$2 ctx_start=$3 ctx_max=$4 gen=$5 runs=${6:-1}
BIN=${BIN:-$PWD/.devcarry/bin} LIB=${LIB:-$PWD/.devcarry/lib} OUT=${OUT:-/tmp/ds4-bench-out}
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
model=/dev/shm/ds4-$shape-$quant.gguf
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv | tee -a "$OUT/device.txt"
if [ ! -f "$model" ]; then
  t0=$(date +%s)
  "$BIN/ds4-mkmodel" --shape "$shape" --quant "$quant" --vocab models/ds4-vocab.gguf --out "$model" -q
  echo "mkmodel $shape $quant: $(( $(date +%s) - t0 )) s, $(stat -c %s "$model") bytes" | tee -a "$OUT/log.txt"
fi
"$BIN/ds4-bench" -m "$model" --cuda --prompt-file bench/data/promessi_sposi.txt \
  --ctx-start "$ctx_start" --ctx-max "$ctx_max" --step-mul 4 -n "$gen" --runs "$runs" \
  --csv "$OUT/bench-$shape-$quant.csv" 2>&1 | tee -a "$OUT/log.txt"
cat "$OUT/bench-$shape-$quant.csv"
