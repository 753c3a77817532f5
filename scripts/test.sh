#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# THE test command (CI runs it through .ci/run):
#
#   bash scripts/test.sh                 every stage below
#   bash scripts/test.sh unit format     only the named stages (they expect earlier outputs)
#
# Stages: setup, build (build/, static size), unit + integration against build/, the ASan+UBSan
# build (build-asan/) with unit + integration again, clang-format, banned functions, the error
# contract (check-errors.sh) and the layers' includes (check-layers.sh), the static
# binary, every libFuzzer harness for FUZZ_SECONDS (default 20; as many at once as there are
# CPUs) from a scratch copy of its corpus, and a fixed sample of security mutants (scripts/mutants.sh --quick).
#
# Setup runs first; then three lanes run at the same time, each its stages in order (a stage
# waits for the stages it needs, see STAGES):
#   plain:  build, image, unit, static, integration (build/), the bench smoke runs
#   asan:   asan_build, asan_unit, asan_integration (build-asan/; it needs build and image too)
#   checks: format, banned, fuzz_build, fuzz, mutants_quick (niced: it takes what CPU is left)
# So the two integration suites run at the same time: each test session takes ports, subordinate
# ids and pool uids from a share of its own (SBX_TEST_SLOT, tests/integration/conftest.py).
# Each stage runs under a time limit with its output in build-logs/<stage>.log. A line per stage
# (PASS/FAIL and seconds) is printed as it ends; a failed stage prints the end of its log. Then
# the table of every stage, and the last line is "N passed, M failed" (N + M = stages); the
# exit status is non-zero when any stage failed.
set -uo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/.." || exit 1

PY=/usr/bin/python3
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
LOG_DIR=build-logs
FUZZERS=(http_head request_decode cap_decode httpc_response relay_response libsbx_response
    envd_body)

# ---- stage bodies (each runs as `scripts/test.sh --stage NAME` under timeout) ---------------

stage_setup() { bash scripts/setup.sh; }

stage_build() { bash scripts/build.sh; }

# The platform's default image (Debian minbase + python3 from the Debian archive, as an OCI
# layout in /var/lib/sbx/images/debian); a no-op when it is there already.
stage_image() { bash scripts/build-image.sh; }

stage_unit() { meson test -C build --print-errorlogs; }

# The two integration stages run at the same time, each in a slot of its own (SBX_TEST_SLOT:
# ports, subordinate ids and pool uids of its own, see tests/integration/conftest.py); the
# mutants' test runs take slot 3.
integration() { # build dir, slot
    SBX_BUILD="$PWD/$1" SBX_TEST_SLOT=$2 PYTHONDONTWRITEBYTECODE=1 \
        "$PY" -m pytest -q -p no:cacheprovider --durations=15 tests/integration
}
stage_integration() { integration build 1; }

stage_asan_build() {
    # shellcheck disable=SC2054 # the commas belong to the option value
    local opts=(-Db_sanitize=address,undefined -Db_lundef=false -Dstatic_server=false
        "-Dc_args=-fno-sanitize-recover=all -fno-omit-frame-pointer")
    if [[ -f build-asan/build.ninja ]]; then
        meson setup --reconfigure build-asan "${opts[@]}" || return
    else
        meson setup build-asan "${opts[@]}" || return
    fi
    ninja -C build-asan
}

asan_env() {
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
}
stage_asan_unit() { asan_env && meson test -C build-asan --print-errorlogs; }
stage_asan_integration() { asan_env && integration build-asan 2; }

stage_format() { bash scripts/check-format.sh; }

stage_banned() {
    bash scripts/check-banned.sh && bash scripts/check-errors.sh && bash scripts/check-layers.sh
}

stage_static() { bash scripts/check-static.sh; }

stage_fuzz_build() {
    # The compiler is fixed when a build directory is first set up: start over if it is not clang.
    if [[ -f build-fuzz/build.ninja ]] &&
        ! grep -qE '^ command = clang ' build-fuzz/build.ninja; then
        rm -rf build-fuzz
    fi
    if [[ -f build-fuzz/build.ninja ]]; then
        CC=clang meson setup --reconfigure build-fuzz -Dfuzz=true -Dstatic_server=false || return
    else
        CC=clang meson setup build-fuzz -Dfuzz=true -Dstatic_server=false || return
    fi
    ninja -C build-fuzz "${FUZZERS[@]/#/fuzz/fuzz_}"
}

fuzz_one() { # corpus name
    local name=$1 work="build-fuzz/corpus-run/$1" art="build-fuzz/artifacts"
    rm -rf "$work" && mkdir -p "$work" "$art" || return
    cp fuzz/corpus/"$name"/* "$work"/ || return
    # the checked-in corpus is replayed first, then mutated for FUZZ_SECONDS
    if ! "build-fuzz/fuzz/fuzz_$name" -max_total_time="$FUZZ_SECONDS" -timeout=10 \
        -rss_limit_mb=2048 -dict=fuzz/http.dict -print_final_stats=1 \
        -artifact_prefix="$art/$name-" "$work"; then
        echo "fuzz_$name found a failure; the input is in $art/ (add it to fuzz/corpus/$name/" \
            "once fixed)"
        return 1
    fi
}
# Every harness for FUZZ_SECONDS, as many at once as there are CPUs (each one's output in
# build-logs/fuzz_<name>.log); fails when any of them found something.
stage_fuzz() {
    local jobs name failed=0 pids=() names=()
    jobs=$(nproc)
    for name in "${FUZZERS[@]}"; do
        while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
        fuzz_one "$name" >"$LOG_DIR/fuzz_$name.log" 2>&1 &
        pids+=($!) names+=("$name")
    done
    for i in "${!pids[@]}"; do
        if wait "${pids[$i]}"; then
            echo "fuzz_${names[$i]}: ok ($(grep -o 'stat::number_of_executed_units: *[0-9]*' \
                "$LOG_DIR/fuzz_${names[$i]}.log" | grep -o '[0-9]*$') runs)"
        else
            echo "fuzz_${names[$i]}: FAILED (build-logs/fuzz_${names[$i]}.log):"
            tail -n 20 "$LOG_DIR/fuzz_${names[$i]}.log"
            failed=1
        fi
    done
    return $failed
}

# A fixed sample of the security mutants (tests/mutants/mutants.toml, quick = true): each check
# broken in turn must be caught by its tests. The full set: bash scripts/mutants.sh.
stage_mutants_quick() { SBX_TEST_SLOT=3 bash scripts/mutants.sh --quick; }

# Benchmark smoke runs: small sizes, functional failures only (figures are printed, not judged).
stage_bench_smoke() { bash scripts/bench.sh --quick; }
stage_bench_pool_smoke() { bash scripts/bench-pool.sh --quick; }
stage_bench_platform_smoke() { bash scripts/bench-platform.sh --quick; }
stage_bench_boundary_smoke() { build/bench/bench-boundary --quick; }
stage_bench_libsbx_smoke() { bash scripts/bench-libsbx.sh --quick; }
stage_bench_e2b_smoke() { bash scripts/bench-e2b.sh --quick; }

# name : time limit (s) : stages it needs : lane. The lanes run at the same time, each its
# stages in this order; a stage whose needs are named in this run waits for them (and is not run
# when one failed). The "checks" lane runs niced: it takes the CPUs the other two leave. (The
# limits allow for the lanes sharing the CPUs.)
STAGES=(
    "setup:900::first"
    "build:600::plain"
    "image:900::plain"
    "unit:600:build:plain"
    "static:60:build:plain"
    "integration:2400:build,image:plain"
    "bench_smoke:300:build:plain"
    "bench_pool_smoke:300:build:plain"
    "bench_platform_smoke:300:build:plain"
    "bench_boundary_smoke:120:build:plain"
    "bench_libsbx_smoke:300:build:plain"
    "bench_e2b_smoke:300:build:plain"
    "asan_build:600::asan"
    "asan_unit:600:asan_build:asan"
    "asan_integration:3600:asan_build,build,image:asan"
    "format:60::checks"
    "banned:300::checks"
    "fuzz_build:600::checks"
    "fuzz:$((FUZZ_SECONDS * 6 + 120)):fuzz_build:checks"
    "mutants_quick:900:build:checks"
)
LANES=(plain asan checks)

if [[ "${1:-}" == --stage ]]; then
    "stage_$2"
    exit
fi

# ---- driver -------------------------------------------------------------------------------

want=" $* "
mkdir -p "$LOG_DIR"
# <stage>: "exit-status milliseconds note", written when the stage ends
STATUS=$(mktemp -d "$LOG_DIR/.status.XXXXXX") || exit 1
selected=()
for entry in "${STAGES[@]}"; do
    IFS=: read -r name _ <<<"$entry"
    if (($# == 0)) || [[ "$want" == *" $name "* ]]; then
        selected+=("$name")
    fi
done
is_selected() { [[ " ${selected[*]} " == *" $1 "* ]]; }

run_stage() { # name limit needs lane
    local name=$1 limit=$2 needs=$3 log="$LOG_DIR/$1.log" t0 rc note= n tpid nice=()
    [[ $4 == checks ]] && nice=(nice -n 10)
    for n in ${needs//,/ }; do # wait for the needs this run has
        is_selected "$n" || continue
        while [[ ! -f "$STATUS/$n" ]]; do sleep 1; done
    done
    t0=$(date +%s%N)
    for n in ${needs//,/ }; do
        if is_selected "$n" && [[ "$(cut -d' ' -f1 "$STATUS/$n")" != 0 ]]; then
            echo "skipped: $n failed" >"$log"
            echo "1 0 (not run: $n failed)" >"$STATUS/$name.tmp"
            mv "$STATUS/$name.tmp" "$STATUS/$name"
            return
        fi
    done
    "${nice[@]}" timeout -k 10 "$limit" bash "$SELF" --stage "$name" >"$log" 2>&1 &
    tpid=$!
    trap 'kill -TERM $tpid 2>/dev/null; wait $tpid; exit 1' TERM
    wait $tpid
    rc=$?
    trap - TERM
    ((rc == 124 || rc == 137)) && note="(timed out after ${limit}s)"
    echo "$rc $((($(date +%s%N) - t0) / 1000000)) $note" >"$STATUS/$name.tmp"
    mv "$STATUS/$name.tmp" "$STATUS/$name"
}

run_lane() { # lane
    local entry name limit needs lane
    for entry in "${STAGES[@]}"; do
        IFS=: read -r name limit needs lane <<<"$entry"
        [[ "$lane" == "$1" ]] && is_selected "$name" && run_stage "$name" "$limit" "$needs" "$lane"
    done
    return 0
}

secs_of() { printf '%d.%01d' $(($1 / 1000)) $(($1 % 1000 / 100)); }

declare -A result secs
passed=0 failed=0
reported=()
# Print each stage's line as it ends (in the order they end).
report_new() {
    local name rc ms note
    for name in "${selected[@]}"; do
        [[ -f "$STATUS/$name" && -z "${result[$name]:-}" ]] || continue
        read -r rc ms note <"$STATUS/$name"
        secs[$name]=$(secs_of "$ms")
        printf '==> %-20s ' "$name"
        if ((rc == 0)); then
            result[$name]=PASS
            passed=$((passed + 1))
            echo "PASS ${secs[$name]}s"
        else
            result[$name]=FAIL
            failed=$((failed + 1))
            echo "FAIL ${secs[$name]}s $note"
            echo "---- last lines of $LOG_DIR/$name.log (exit $rc) ----"
            tail -n 60 "$LOG_DIR/$name.log" | sed 's/^/    /'
            echo "----"
        fi
        reported+=("$name")
    done
}

any_alive() {
    local p
    for p; do kill -0 "$p" 2>/dev/null && return 0; done
    return 1
}

t_all=$(date +%s%N)
lane_pids=()
trap 'kill -TERM "${lane_pids[@]}" 2>/dev/null; wait; rm -rf "$STATUS"; exit 130' INT TERM
run_lane first # setup: before everything else
report_new
for lane in "${LANES[@]}"; do
    run_lane "$lane" &
    lane_pids+=($!)
done
while ((${#reported[@]} < ${#selected[@]})); do
    sleep 1
    report_new
    if ((${#reported[@]} < ${#selected[@]})) && ! any_alive "${lane_pids[@]}"; then
        sleep 1 # every lane ended: anything left unreported was never run
        report_new
        break
    fi
done
wait

rm -rf "$STATUS"
total_ms=$((($(date +%s%N) - t_all) / 1000000))
echo
echo "stage                 result  seconds"
for name in "${selected[@]}"; do
    printf '%-21s %-7s %7s\n' "$name" "${result[$name]:-FAIL}" "${secs[$name]:--}"
done
lost=$((${#selected[@]} - passed - failed)) # a lane that died before its stage ended
printf 'total %s; logs in %s/\n' "$(secs_of $total_ms)s" "$LOG_DIR"
echo "$passed passed, $((failed + lost)) failed"
((failed + lost == 0))
