#!/usr/bin/env bash
# One measuring round on a CUDA machine (docs/PERFORMANCE.md, CUDA section), everything in one
# call: the CUDA kernel tests, the CPU-CUDA parity on the shipped trained model, then ds4-bench
# --cuda on the published Flash q2 layout (written to /dev/shm) at 2K under each variant, with
# the device's clocks before and after. Binaries come from BIN (and their .so files from LIB:
# bench/pack_binaries.sh packs both); a variant is a list of environment assignments ("-" for
# none) and ds4-bench flags written --flag=value (--gpus=0,0 --layer-split=21), optionally
# prefixed by "base:" to run BASE's ds4-bench instead (the build the round compares against). Logs, CSVs and a summary go to OUT. With -t "T1 T2 ...", the same model
# also runs on the CPU backend at those thread counts (a short prompt, DS4_CPU_PROFILE=1: the
# per-operation table in the log). With -s SHAPE (a shape JSON of ds4-mkmodel), that layout
# instead of the published one: bench/cuda/flash_64_experts.json is the Flash layout with 64
# routed experts a layer instead of 256 (about 26 GiB in q2), whose decode step runs every layer's
# attention and the same six experts' work as the full file's, resident on an 80 GB card (up to
# 4,096 tokens of context: a JSON shape keeps the tiny shape's context length).
#   bench/cuda/device_round.sh [-n TOKENS] [-r RUNS] [-c CTX] [-t THREADS] [-s SHAPE] VARIANT...
set -uo pipefail
gen=64 runs=2 ctx=2048 cpu_threads="" shape=flash
while getopts n:r:c:t:s: o; do
  case $o in
    n) gen=$OPTARG ;;
    r) runs=$OPTARG ;;
    c) ctx=$OPTARG ;;
    t) cpu_threads=$OPTARG ;;
    s) shape=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
BIN=${BIN:-$PWD/build/bin} BASE=${BASE:-} LIB=${LIB:-} OUT=${OUT:-/tmp/ds4-round}
[ -n "$LIB" ] && export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,temperature.gpu \
  --format=csv | tee "$OUT/device.txt"

t0=$(date +%s)
"$BIN/test_cuda" --gtest_brief=1 >"$OUT/test_cuda.log" 2>&1
note "test_cuda: rc $? in $(($(date +%s) - t0)) s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda.log" | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' "$OUT/test_cuda.log" | head -20 | tee -a "$summary"
"$BIN/ds4-test" --backend-parity -m models/promessi-mini-q8_0.gguf --cuda >"$OUT/parity.log" 2>&1
note "backend parity: rc $?: $(tail -n 3 "$OUT/parity.log" | tr '\n' ' ')"
# The same with the layers in two ranges on device 0 (docs/MULTI_GPU.md): the hand-over between
# them on the device.
"$BIN/ds4-test" --backend-parity -m models/promessi-mini-q8_0.gguf --gpus 0,0 --layer-split 2 \
  >"$OUT/parity-split.log" 2>&1
note "backend parity, layers split 0-1 / 2-3: rc $?: $(tail -n 3 "$OUT/parity-split.log" | tr '\n' ' ')"

model=/dev/shm/ds4-$(basename "$shape" .json)-q2.gguf
if [ ! -f "$model" ]; then
  t0=$(date +%s)
  "$BIN/ds4-mkmodel" --shape "$shape" --quant q2 --vocab models/ds4-vocab.gguf --out "$model" -q
  note "mkmodel $shape q2: rc $? in $(($(date +%s) - t0)) s"
fi

i=0
for v in "$@"; do
  i=$((i + 1))
  bench=$BIN/ds4-bench
  spec=$v
  if [ "${spec#base:}" != "$spec" ]; then
    bench=$BASE/ds4-bench
    spec=${spec#base:}
  fi
  [ "$spec" = "-" ] && spec=""
  # Words of the variant that start with -- are ds4-bench flags (--gpus=0,0), the others
  # environment assignments.
  envs="" flags=""
  for w in $spec; do
    if [ "${w#--}" != "$w" ]; then flags="$flags $w"; else envs="$envs $w"; fi
  done
  # shellcheck disable=SC2086
  env $envs "$bench" -m "$model" --cuda --prompt-file bench/data/promessi_sposi.txt \
    --ctx-start "$ctx" --ctx-max "$ctx" -n "$gen" --runs "$runs" --csv "$OUT/bench-$i.csv" \
    $flags >"$OUT/bench-$i.log" 2>&1
  note "variant $i [$v]: rc $?: $(tail -n 1 "$OUT/bench-$i.csv" 2>/dev/null)"
done
for t in $cpu_threads; do
  DS4_CPU_PROFILE=1 "$BIN/ds4-bench" -m "$model" --cpu -t "$t" \
    --prompt-file bench/data/promessi_sposi.txt --ctx-start 128 --ctx-max 128 -n 16 --runs 1 \
    --csv "$OUT/cpu-$t.csv" >"$OUT/cpu-$t.log" 2>&1
  note "cpu $t threads: rc $?: $(tail -n 1 "$OUT/cpu-$t.csv" 2>/dev/null)"
done
nvidia-smi --query-gpu=clocks.sm,temperature.gpu --format=csv,noheader | tee -a "$summary"
echo "--- csv header: $(head -n 1 "$OUT/bench-1.csv" 2>/dev/null)"
cat "$summary"
