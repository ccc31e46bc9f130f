#!/usr/bin/env bash
# The CUDA streaming round (docs/SSD_STREAMING.md, on the CUDA backend), in one call on the
# device machine: the streaming tests (test_cuda CudaStreaming.*, the expert table and upload),
# the cache-pressure mode on the CUDA backend, then ds4-bench on the published Flash q2 layout
# (written to /dev/shm, as device_round.sh does): resident, then streaming with the device tier
# capped at DEVICE (a 24 GB card's 20GB by default) over each host tier of the list HOST ("auto
# 16GB" by default: what `auto` gives, then 16 GiB, so that more is read from the file). The
# streamed runs share one popularity folder, so each after the first starts from the last one's
# saved popularity. A host tier of every expert (74 GiB) does not fit beside the 81 GiB file in
# the box's 128 GiB when the file is in /dev/shm. The streamed runs must generate the resident
# run's tokens (tokens_sha256); the dev_* and ssd_* columns give each tier's hit rate and bytes
# per token. Note: the file sits in /dev/shm (the box's disk is smaller than the model), so
# "disk" reads come from tmpfs, buffered (tmpfs refuses O_DIRECT; the tools print that notice).
# Each ds4-bench run is stopped after -T seconds (300 by default; exit 124 in the summary). -x
# leaves out the tests and -r the resident run (a second call on a machine that ran them).
#   bench/cuda/streaming_round.sh [-x] [-r] [-n TOKENS] [-c CTX] [-d DEVICE] [-h "HOST ..."]
#                                 [-T SECONDS]
set -uo pipefail
gen=64 ctx=2048 device=20GB hosts="auto 16GB" limit=300 tests=1 resident=1
while getopts xrn:c:d:h:T: o; do
  case $o in
    n) gen=$OPTARG ;;
    c) ctx=$OPTARG ;;
    d) device=$OPTARG ;;
    h) hosts=$OPTARG ;;
    T) limit=$OPTARG ;;
    x) tests=0 ;;
    r) resident=0 ;;
    *) exit 2 ;;
  esac
done
BIN=${BIN:-$PWD/build/bin} LIB=${LIB:-} OUT=${OUT:-/tmp/ds4-streaming-round}
[ -n "$LIB" ] && export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

if [ "$tests" = 1 ]; then
  t0=$(date +%s)
  "$BIN/test_cuda" --gtest_filter='CudaStreaming.*:CudaExpertTable*:CudaHostUpload*' --gtest_brief=1 \
    >"$OUT/test_cuda_streaming.log" 2>&1
  note "test_cuda streaming: rc $? in $(($(date +%s) - t0)) s: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_streaming.log" | tr '\n' ' ')"
  t0=$(date +%s)
  "$BIN/ds4-test" --ssd-streaming-cache-pressure --cuda -t 8 >"$OUT/cache_pressure.log" 2>&1
  note "ds4-test --ssd-streaming-cache-pressure --cuda: rc $? in $(($(date +%s) - t0)) s: $(tail -n 1 "$OUT/cache_pressure.log")"
fi

model=/dev/shm/ds4-flash-q2.gguf
if [ ! -f "$model" ]; then
  t0=$(date +%s)
  "$BIN/ds4-mkmodel" --shape flash --quant q2 --vocab models/ds4-vocab.gguf --out "$model" -q
  note "mkmodel flash q2: rc $? in $(($(date +%s) - t0)) s"
fi
common=(-m "$model" --cuda --prompt-file bench/data/promessi_sposi.txt --ctx-start "$ctx" --ctx-max "$ctx"
  -n "$gen" --runs 1)
run() {  # name, extra flags...
  local name=$1
  shift
  t0=$(date +%s)
  timeout -k 10 "$limit" "$BIN/ds4-bench" "${common[@]}" "$@" --csv "$OUT/$name.csv" >"$OUT/$name.log" 2>&1
  note "$name: rc $? in $(($(date +%s) - t0)) s: $(tail -n 1 "$OUT/$name.csv" 2>/dev/null)"
  grep -E 'device tier|host tier|SSD streaming.*stats' "$OUT/$name.log" | tee -a "$summary"
}
[ "$resident" = 1 ] && run resident
for host in $hosts; do
  run "stream-host-$host" --ssd-streaming --ssd-streaming-cache-dir "$OUT/pop" \
    --ssd-streaming-cache-experts "$device" --ssd-streaming-host-cache "$host"
done
first_csv=$(find "$OUT" -maxdepth 1 -name 'stream-host-*.csv' | sort | head -n 1)
echo "--- csv header: $(head -n 1 "$first_csv" 2>/dev/null)"
cat "$summary"
