#!/usr/bin/env bash
# ncu's detailed sections (speed of light, memory, warp stalls, occupancy, launch, scheduler)
# for the kernels of one replayed decode step whose names match REGEX, on a synthetic model of
# the published widths (docs/PERFORMANCE.md, CUDA section). Each kernel runs alone under ncu
# with its own caches, so durations are upper bounds of what it takes inside the graph; the
# stall reasons and achieved occupancy are what this is for. With -p, the first COUNT matching
# launches of a 1,024-token prefill instead (its batched kernels: the grouped routed products,
# the tensor-core products). Binaries from BIN (and LIB), the report into OUT.
#   bench/cuda/ncu_kernels.sh [-s SHAPE] [-c COUNT] [-p] REGEX
set -uo pipefail
shape=small count=8 prefill=0
while getopts s:c:p o; do
  case $o in
    s) shape=$OPTARG ;;
    c) count=$OPTARG ;;
    p) prefill=1 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
regex=${1:?kernel name regex}
BIN=${BIN:-$PWD/build/bin} LIB=${LIB:-} OUT=${OUT:-/tmp/ds4-ncu}
[ -n "$LIB" ] && export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
[ -x "$ncu" ] || { echo "ncu not found" >&2; exit 1; }
model=/dev/shm/ds4-$(basename "$shape" .json)-q2.gguf
[ -f "$model" ] || "$BIN/ds4-mkmodel" --shape "$shape" --quant q2 --vocab models/ds4-vocab.gguf \
  --out "$model" -q || exit 1
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
  --section Occupancy --section LaunchStats --section SchedulerStats --section SourceCounters"
if [ "$prefill" = 1 ]; then
  # shellcheck disable=SC2086
  "$ncu" --clock-control none -k "regex:$regex" -c "$count" $sections \
    "$BIN/ds4-bench" -m "$model" --cuda --prompt-file bench/data/promessi_sposi.txt \
    --ctx-start 1024 --ctx-max 1024 -n 1 >"$OUT/ncu-report.txt" 2>&1
else
  # The 4th replayed step (DS4_CUDA_PROFILER_REPLAY) only: warm weights, the graph's launches.
  # shellcheck disable=SC2086
  DS4_CUDA_PROFILER_REPLAY=4 "$ncu" --clock-control none --profile-from-start off \
    -k "regex:$regex" -c "$count" $sections \
    "$BIN/ds4-bench" -m "$model" --cuda --prompt-file bench/data/promessi_sposi.txt \
    --ctx-start 256 --ctx-max 256 -n 8 >"$OUT/ncu-report.txt" 2>&1
fi
echo "ncu rc $?"
grep -E "^  [a-z_].*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit|Stall|Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued" "$OUT/ncu-report.txt" | head -150
