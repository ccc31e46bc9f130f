#!/usr/bin/env bash
# SSD streaming benchmark (docs/SSD_STREAMING.md): a synthetic model with the published Flash widths
# and q2 expert types but fewer layers, whose routed experts exceed the machine's memory; decode and
# prefill speed, hit rate, bytes read per token and the read bandwidth during misses at cache
# budgets of a share of the experts, beside the raw sequential and random O_DIRECT read bandwidth
# of the same disk measured in the same run; then the same with a skewed router.
#
#   bench/ssd_streaming/run.sh [BUILD_DIR] [WORK_DIR]
# Environment: LAYERS (16), BUDGETS ("10% 25% 50%"), SKEW_BUDGETS ("10% 25%"; "" skips the skewed
# run), THREADS (all cores), GEN (16 decode tokens per frontier), KEEP_MODEL=1 keeps the model.
# Needs about 31 GB of free disk under WORK_DIR (default: build dir/ssd-bench).
set -euo pipefail
BUILD=${1:-build}
WORK=${2:-$BUILD/ssd-bench}
LAYERS=${LAYERS:-16}
BUDGETS=${BUDGETS:-"10% 25% 50%"}
SKEW_BUDGETS=${SKEW_BUDGETS-"10% 25%"}
THREADS=${THREADS:-0}
GEN=${GEN:-16}
BIN=$BUILD/bin
REPO=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$WORK"
MODEL=$WORK/flash${LAYERS}-q2.gguf
OUT=$WORK/results
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/run.log"; }

drop_cache() {  # the file's pages out of the page cache, so every run starts from the disk
    python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd); \
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)" "$1"
}

log "machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo) RAM," \
    "MemAvailable $(awk '/MemAvailable/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)," \
    "disk $(df -h "$WORK" | awk 'NR==2 {print $1, $2, "free", $4}')"
if [ ! -f "$MODEL" ]; then
    # The Flash dimensions (tools/mkmodel: JSON fields over the tiny preset), LAYERS layers.
    ratios=$(python3 -c "print(','.join(str(0 if i < 2 else (4 if i % 2 == 0 else 128)) for i in range($LAYERS)))")
    cat > "$WORK/shape.json" <<JSON
{"n_layer": $LAYERS, "n_embd": 4096, "n_head": 64, "head_dim": 512, "n_rot": 64, "q_lora_rank": 1024,
 "o_lora_rank": 1024, "n_out_group": 8, "n_expert": 256, "n_expert_used": 6, "n_ff_exp": 2048,
 "n_expert_shared": 1, "n_hash_layer": 3, "sliding_window": 128, "n_idx_head": 64, "idx_head_dim": 128,
 "idx_top_k": 512, "compress_ratio": [$ratios]}
JSON
    log "writing $MODEL"
    /usr/bin/time -f "%e s" "$BIN/ds4-mkmodel" --shape "$WORK/shape.json" --quant q2 --seed 1 --out "$MODEL" -q \
        --vocab "$REPO/models/ds4-vocab.gguf" 2>&1 | tee -a "$OUT/run.log"
fi
ls -l "$MODEL" | tee -a "$OUT/run.log"

log "raw disk bandwidth (O_DIRECT, 7 MiB reads)"
for mode_qd in "seq 1" "seq 8" "rand 1" "rand 8" "rand 16"; do
    set -- $mode_qd
    drop_cache "$MODEL"
    "$BIN/bench_disk_read" "$MODEL" --mode "$1" --threads "$2" --seconds 6 --bytes $((12 << 30)) | tee -a "$OUT/run.log"
done

bench() {  # tag, then ds4-bench flags
    local tag=$1; shift
    drop_cache "$MODEL"
    log "ds4-bench $tag: $*"
    "$BIN/ds4-bench" -m "$MODEL" -t "$THREADS" --prompt-file "$REPO/bench/data/promessi_sposi.txt" \
        --ctx-start 32 --ctx-max 64 --step-incr 32 -n "$GEN" --ssd-streaming --ssd-streaming-cold \
        --ssd-streaming-cache-dir "$WORK/cache" "$@" --csv "$OUT/$tag.csv" 2>&1 \
        | grep -E "SSD streaming|run 1/1" | tee -a "$OUT/run.log"
    cat "$OUT/$tag.csv" >> "$OUT/run.log"
}

for b in $BUDGETS; do bench "uniform-${b%\%}" --ssd-streaming-cache-experts "$b"; done
if [ -n "$SKEW_BUDGETS" ]; then
    "$BUILD/bin/bench_skew_router" "$MODEL" --hot 32 --bias 1.0 | tee -a "$OUT/run.log"
    for b in $SKEW_BUDGETS; do bench "skewed-${b%\%}" --ssd-streaming-cache-experts "$b"; done
fi
if [ "${KEEP_MODEL:-0}" != 1 ]; then rm -f "$MODEL"; log "removed $MODEL"; fi
log "results in $OUT"
