#!/usr/bin/env bash
# One CPU measuring round on a many-core machine (docs/PERFORMANCE.md, "CPU at scale"), all in
# one call so that every ratio comes from one machine: the SIMD kernel tests (the AVX-512 ones
# skip on a machine without it), bench_matvec against a plain read, then the published Flash q2
# layout (written to /dev/shm), its read through the mapping (bench_disk_read --mode mapped: the
# roofline is that rate / 9.19 GB a token), and the model through ds4-bench --cpu for this
# build and, when BASE is set, the build it is compared with, and through llama.cpp's
# llama-bench when LLAMA_BENCH names one.
#
#   BIN=build/bin BASE=old/bin LLAMA_BENCH=llama-bench LLAMA_REPS=2 LIB=libdir OUT=out \
#     bench/cpu_round.sh [-t "THREADS ..."] [-c "PROMPT_TOKENS ..."] [-n GEN_TOKENS] [-k "CHUNKS ..."]
#
# Each prompt length L runs `ds4-bench --ctx-start L --ctx-max L` (an L-token prefill in chunks
# of 256, or of each size -k lists for this build, then GEN_TOKENS greedy tokens) and
# `llama-bench -p L -n GEN_TOKENS -r LLAMA_REPS`. This build's runs set DS4_CPU_PROFILE=1 (the
# per-operation table goes to its log). Logs, CSVs and a summary go to OUT.
set -uo pipefail
threads=16 lengths=128 gen=16 chunks=256
while getopts t:c:n:k: o; do
  case $o in
    t) threads=$OPTARG ;;
    c) lengths=$OPTARG ;;
    n) gen=$OPTARG ;;
    k) chunks=$OPTARG ;;
    *) exit 2 ;;
  esac
done
BIN=${BIN:-$PWD/build/bin} BASE=${BASE:-} LLAMA_BENCH=${LLAMA_BENCH:-} LIB=${LIB:-}
MATVEC=${MATVEC:-1}  # 0: no bench_matvec
LLAMA_REPS=${LLAMA_REPS:-2}  # llama-bench -r
OUT=${OUT:-/tmp/ds4-cpu-round}
[ -n "$LIB" ] && export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

lscpu >"$OUT/lscpu.txt"
note "cpu: $(grep -m1 'Model name' "$OUT/lscpu.txt" | sed 's/  */ /g'), $(nproc) cpus;" \
  "$(grep -o -w -E 'avx512(f|_vnni|vbmi|_bf16)|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"

for t in test_quant_simd test_quant_iq2_vbmi test_cpu; do
  [ -x "$BIN/$t" ] || { note "$t: not in $BIN"; continue; }
  "$BIN/$t" --gtest_brief=1 >"$OUT/$t.log" 2>&1
  note "$t: rc $?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')"
done

for b in "$BIN" ${BASE:+"$BASE"}; do
  [ "$MATVEC" = 0 ] && break
  tag=new
  [ "$b" = "$BASE" ] && tag=base
  DS4_BENCH_THREADS="$threads" "$b/bench_matvec" \
    --benchmark_filter="read_bandwidth/(${threads// /|}|1)/|matvec/(Q8_0|IQ2_XXS|Q2_K|F16)/(${threads// /|}|1)/" \
    --benchmark_min_time=0.2 >"$OUT/matvec-$tag.txt" 2>&1
  note "bench_matvec $tag: rc $?"
  grep -E '^(read|matvec)' "$OUT/matvec-$tag.txt" |
    awk '{printf "  %s", $1; for (i = 2; i <= NF; ++i) if ($i ~ /GB\/s=|x_read=/) printf " %s", $i; print ""}' |
    tee -a "$summary"
done

model=/dev/shm/ds4-flash-q2.gguf
if [ ! -f "$model" ]; then
  t0=$(date +%s)
  "$BIN/ds4-mkmodel" --shape flash --quant q2 --vocab models/ds4-vocab.gguf --out "$model" -q
  note "mkmodel flash q2: rc $? in $(($(date +%s) - t0)) s"
fi
# The roofline: the model's bytes read through its mapping (32 GB of it, the second pass).
for t in $threads; do
  note "$("$BIN/bench_disk_read" "$model" --mode mapped --threads "$t" --bytes 32000000000 2>&1)"
done

run_ds4() {  # TAG BINDIR THREADS LENGTH CHUNK [ENV...]
  local tag=$1 dir=$2 t=$3 len=$4 chunk=$5
  shift 5
  local log=$OUT/$tag-$t-$len-$chunk
  env "$@" "$dir/ds4-bench" -m "$model" --cpu -t "$t" --chunk "$chunk" \
    --prompt-file bench/data/promessi_sposi.txt --ctx-start "$len" --ctx-max "$len" -n "$gen" \
    --runs 1 --csv "$log.csv" >"$log.log" 2>&1
  note "ds4 $tag -t $t ctx $len chunk $chunk: rc $?: $(grep -o 'run 1/1.*' "$log.log" | tail -n 1)"
}
for len in $lengths; do
  for t in $threads; do
    [ -n "$BASE" ] && run_ds4 base "$BASE" "$t" "$len" 256
    for chunk in $chunks; do run_ds4 new "$BIN" "$t" "$len" "$chunk" DS4_CPU_PROFILE=1; done
    if [ -n "$LLAMA_BENCH" ]; then
      "$LLAMA_BENCH" -m "$model" -t "$t" -p "$len" -n "$gen" -r "$LLAMA_REPS" -o md \
        >"$OUT/llama-$t-$len.log" 2>&1
      note "llama.cpp -t $t ctx $len: rc $?"
      grep -E '^\|' "$OUT/llama-$t-$len.log" | tee -a "$summary"
    fi
  done
done
