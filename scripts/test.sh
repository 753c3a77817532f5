#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# THE test command (CI runs it through .ci/run):
#
#   bash scripts/test.sh                 every stage below, in order
#   bash scripts/test.sh unit format     only the named stages (they expect earlier outputs)
#
# Stages: setup, build (build/, static size), unit + integration against build/, the ASan+UBSan
# build (build-asan/) with unit + integration again, clang-format, banned functions, the static
# binary, every libFuzzer harness for FUZZ_SECONDS (default 20; as many at once as there are
# CPUs) from a scratch copy of its corpus, and a fixed sample of security mutants (scripts/mutants.sh --quick). Each stage runs
# under a time limit with its output in build-logs/<stage>.log; a failed stage prints the end
# of its log. The last line is "N passed, M failed" (N + M = stages); the
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

integration() { # build dir
    SBX_BUILD="$PWD/$1" PYTHONDONTWRITEBYTECODE=1 \
        "$PY" -m pytest -q -p no:cacheprovider tests/integration
}
stage_integration() { integration build; }

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
stage_asan_integration() { asan_env && integration build-asan; }

stage_format() { bash scripts/check-format.sh; }

stage_banned() { bash scripts/check-banned.sh; }

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
stage_mutants_quick() { bash scripts/mutants.sh --quick; }

# Benchmark smoke runs: small sizes, functional failures only (figures are printed, not judged).
stage_bench_smoke() { bash scripts/bench.sh --quick; }
stage_bench_pool_smoke() { bash scripts/bench-pool.sh --quick; }
stage_bench_platform_smoke() { bash scripts/bench-platform.sh --quick; }
stage_bench_boundary_smoke() { build/bench/bench-boundary --quick; }
stage_bench_libsbx_smoke() { bash scripts/bench-libsbx.sh --quick; }

# name : time limit (s) : stage it needs
STAGES=(
    "setup:900:"
    "build:600:"
    "image:900:"
    "unit:180:build"
    "integration:1800:build"
    "asan_build:600:"
    "asan_unit:240:asan_build"
    "asan_integration:2400:asan_build"
    "format:60:"
    "banned:60:"
    "static:60:build"
    "fuzz_build:600:"
    "fuzz:$((FUZZ_SECONDS * 6 + 120)):fuzz_build"
    "mutants_quick:900:build"
    "bench_smoke:300:build"
    "bench_pool_smoke:300:build"
    "bench_platform_smoke:300:build"
    "bench_boundary_smoke:120:build"
    "bench_libsbx_smoke:300:build"
)

if [[ "${1:-}" == --stage ]]; then
    "stage_$2"
    exit
fi

# ---- driver -------------------------------------------------------------------------------

want=" $* "
mkdir -p "$LOG_DIR"
declare -A result
names=() results=() times=()
passed=0 failed=0
t_all=$(date +%s%N)

for entry in "${STAGES[@]}"; do
    IFS=: read -r name limit needs <<<"$entry"
    if (($# > 0)) && [[ "$want" != *" $name "* ]]; then
        continue
    fi
    log="$LOG_DIR/$name.log"
    t0=$(date +%s%N)
    printf '==> %-20s ' "$name"
    if [[ -n "$needs" && "${result[$needs]:-}" == FAIL ]]; then
        echo "skipped: $needs failed" >"$log"
        rc=1
        note="(not run: $needs failed)"
    else
        timeout -k 10 "$limit" bash "$SELF" --stage "$name" >"$log" 2>&1
        rc=$?
        note=
        ((rc == 124 || rc == 137)) && note="(timed out after ${limit}s)"
    fi
    ms=$((($(date +%s%N) - t0) / 1000000))
    secs=$(printf '%d.%01d' $((ms / 1000)) $((ms % 1000 / 100)))
    if ((rc == 0)); then
        result[$name]=PASS
        passed=$((passed + 1))
        echo "PASS ${secs}s"
    else
        result[$name]=FAIL
        failed=$((failed + 1))
        echo "FAIL ${secs}s $note"
        echo "---- last lines of $log (exit $rc) ----"
        tail -n 60 "$log" | sed 's/^/    /'
        echo "----"
    fi
    names+=("$name") results+=("${result[$name]}") times+=("$secs")
done

total_ms=$((($(date +%s%N) - t_all) / 1000000))
echo
echo "stage                 result  seconds"
for i in "${!names[@]}"; do
    printf '%-21s %-7s %7s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
done
printf 'total %d.%01ds; logs in %s/\n' $((total_ms / 1000)) $((total_ms % 1000 / 100)) "$LOG_DIR"
echo "$passed passed, $failed failed"
((failed == 0))
