#!/usr/bin/env bash
# The full test run (what CI runs after scripts/setup.sh):
#   1. release build, every CTest test, the Python oracle tests (gguf-py, HF tokenizers, ...)
#   2. ASan + UBSan build, the unit tests (label "unit")
#   3. the GGUF parser fuzzer for DS4_FUZZ_SECONDS (default 60) from the committed seed corpus
# Environment: JOBS (parallel build/test jobs, default nproc), DS4_FUZZ_SECONDS (0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${DS4_FUZZ_SECONDS:-60}
step() { printf '\n== %s\n' "$*"; }

step "release build"
cmake --preset release >/dev/null
cmake --build build -j"$JOBS"
step "unit and integration tests (release)"
ctest --test-dir build --output-on-failure -j"$JOBS"
step "oracle tests (pytest)"
DS4_BUILD_DIR=build DS4_BIN_DIR=build/bin python3 -m pytest -q tests

step "ASan + UBSan build"
cmake --preset asan >/dev/null
cmake --build build-asan -j"$JOBS"
step "unit tests under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -L unit --output-on-failure -j"$JOBS"

if [ "$FUZZ_SECONDS" -gt 0 ]; then
    step "GGUF parser fuzzer (${FUZZ_SECONDS}s)"
    cmake --preset fuzz >/dev/null
    cmake --build build-fuzz -j"$JOBS" --target fuzz_gguf
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    build-fuzz/bin/fuzz_gguf -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 "$work" tests/fuzz/corpus/gguf tests/gguf/malformed 2>&1 | tail -n 12
fi
step "all tests passed"
