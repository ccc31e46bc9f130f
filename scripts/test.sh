#!/usr/bin/env bash
# The full test run (what CI runs after scripts/setup.sh):
#   1. release build, every CTest test, the Python oracle tests (gguf-py, HF tokenizers, llama.cpp, ...)
#   2. ASan + UBSan build, the unit tests (label "unit"), the hostile-argument CLI test
#   3. the GGUF parser fuzzer, the server request fuzzer and the KV checkpoint fuzzer for
#      DS4_FUZZ_SECONDS each (default 60) from the committed seed corpora
# A test that skips for a reason not allowed by tests/skip_allowlist.txt fails the run (pytest: the
# plugin tests/skip_allowlist.py; CTest: its JUnit file, checked by the same script). Every stage's
# time and counts are printed at the end (docs/TESTING.md).
# Environment: JOBS (parallel build/test jobs, default nproc), DS4_FUZZ_SECONDS (0 skips fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${DS4_FUZZ_SECONDS:-60}
work=$(mktemp -d)
STAGES=()
T_ALL=$(date +%s)

summary() {
    local rc=$?
    printf '\n== stages (%s)\n' "$([ "$rc" -eq 0 ] && echo "all passed" || echo "FAILED, exit $rc")"
    local s
    for s in "${STAGES[@]}"; do printf '  %s\n' "$s"; done
    [ -n "${STAGE:-}" ] && printf '  %-44s FAILED after %ss\n' "$STAGE" "$(( $(date +%s) - T0 ))"
    printf '  %-44s %ss\n' "total" "$(( $(date +%s) - T_ALL ))"
    rm -rf "$work"
}
trap summary EXIT

begin() { STAGE="$1"; T0=$(date +%s); printf '\n== %s\n' "$1"; }
end() {  # end [counts]
    local t=$(( $(date +%s) - T0 ))
    STAGES+=("$(printf '%-44s %4ss  %s' "$STAGE" "$t" "${1:-}")")
    STAGE=""
}

# ctest with a JUnit file; every skip is checked against the allowlist. Prints "N tests, S skipped".
run_ctest() {  # run_ctest BUILD_DIR [ctest args...]
    local dir=$1; shift
    local junit="$work/ctest-$(basename "$dir").xml"
    ctest --test-dir "$dir" --output-on-failure -j"$JOBS" --output-junit "$junit" "$@"
    python3 tests/skip_allowlist.py ctest "$junit" | tee "$work/ctest-skips.txt"
    CTEST_COUNTS=$(tail -n 1 "$work/ctest-skips.txt" | sed -E 's/^ctest: ([0-9]+) tests, ([0-9]+) skipped.*/\1 tests, \2 skipped (allowed)/')
}

# pytest with skip reasons (-rs); prints pytest's own summary line
run_pytest() {  # run_pytest BUILD_DIR pytest-args...
    local dir=$1; shift
    local log="$work/pytest.log"
    DS4_BUILD_DIR=$dir DS4_BIN_DIR=$dir/bin python3 -m pytest -q -rs "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    PYTEST_COUNTS=$(grep -E '^=*[ ]*[0-9]+ (passed|failed|skipped|error)' "$log" | tail -n 1 | sed -E 's/^=+ //; s/ in [0-9.]+s.*//; s/ =+$//' || true)
    return "$rc"
}

begin "release build"
cmake --preset release >/dev/null
cmake --build build -j"$JOBS"
end

begin "CTest (release): units and integration"
run_ctest build
end "$CTEST_COUNTS"

begin "pytest oracle tests (release)"
run_pytest build tests
end "$PYTEST_COUNTS"

begin "ASan + UBSan build"
cmake --preset asan >/dev/null
cmake --build build-asan -j"$JOBS"
end

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
begin "CTest unit tests under ASan + UBSan"
run_ctest build-asan -L unit
end "$CTEST_COUNTS"

begin "hostile CLI arguments under ASan + UBSan"
run_pytest build-asan tests/cli/test_hostile_args.py
end "$PYTEST_COUNTS"
unset ASAN_OPTIONS UBSAN_OPTIONS

# run_fuzzer LABEL TARGET CORPUS...: builds a libFuzzer target of the fuzz preset, runs it for
# FUZZ_SECONDS from a fresh folder and the committed corpora (a crash fails the run), and reports
# how many inputs ran.
run_fuzzer() {
    local label=$1 target=$2
    shift 2
    begin "$label (${FUZZ_SECONDS}s)"
    cmake --preset fuzz >/dev/null
    cmake --build build-fuzz -j"$JOBS" --target "$target"
    mkdir -p "$work/$target"
    "build-fuzz/bin/$target" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 "$work/$target" "$@" 2>&1 | tee "$work/$target.log" | tail -n 12
    end "$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+).*/\1 inputs run/p' "$work/$target.log")"
}

if [ "$FUZZ_SECONDS" -gt 0 ]; then
    run_fuzzer "GGUF parser fuzzer" fuzz_gguf tests/fuzz/corpus/gguf tests/gguf/malformed
    run_fuzzer "server request fuzzer" fuzz_server_request tests/fuzz/corpus/server
    run_fuzzer "KV checkpoint fuzzer" fuzz_kv_checkpoint tests/fuzz/corpus/kv
fi
printf '\n== all tests passed\n'
