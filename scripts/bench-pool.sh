#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build bench-pool and run it against a freshly started pool-host sbx-server (SBX_HOST_MODE=1,
# as root: every sandbox is a uid) with a random host token, a free loopback port and a
# temporary SBX_HOMES_DIR. Prints figures beside same-run baselines; exits non-zero only on a
# functional failure (a refused request, a wrong answer, something left over), never on timings.
#
#   scripts/bench-pool.sh [--quick] [--awake] [--only trio,cost,exec,idle,scale]
#
# --quick: small sizes, the whole run in well under 20 s (a CI smoke run).
# --awake: a busy loop per CPU at SCHED_IDLE for the whole run, so no CPU halts while it waits
# (on a VM, waking a halted virtual CPU is dear): a diagnosis of where latency goes, not a
# figure to quote.
# SBX_BUILD: the build directory (default: build).
# Also: `ninja -C build bench-pool` or `ninja -C build bench-pool-quick`.
# TMPDIR: where the homes go (default /tmp). Create and delete cost what the filesystem's four
# mkdirs and rmdirs cost, so the bench prints that floor beside them; TMPDIR=/dev/shm (tmpfs)
# takes the disk out of the figures.
# The pool hosts' uids are 56000..64999 (SBX_POOL_UID_BASE; the second host, for section 5,
# has the top 80): the integration tests, which may run at the same time (scripts/test.sh),
# take theirs below. That is 9,000 sandboxes at most;
# SBX_BENCH_UID_BASE=20000 gives section 5 its 10,000 (only where no test session runs: those
# are the tests' uids).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
INVOKED="$0${*:+ $*}"
BUILD=${SBX_BUILD:-build}
case $BUILD in
/*) ;;
*) BUILD=$ROOT/$BUILD ;;
esac
QUICK=0
prev=
for a in "$@"; do
    case $a in
    --quick) QUICK=1 ;;
    --awake | --only) ;;
    *)
        if [ "$prev" != --only ]; then
            echo "usage: $0 [--quick] [--awake] [--only trio,cost,exec,idle,scale]" >&2
            exit 2
        fi
        ;;
    esac
    prev=$a
done
if [ "$(id -u)" != 0 ]; then
    echo "bench-pool: host mode needs root (each sandbox runs as its own uid)" >&2
    exit 2
fi

if [ -z "${SBX_BENCH_NO_BUILD:-}" ]; then # the meson run_target has built both already
    [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" "$ROOT" >/dev/null
    ninja -C "$BUILD" sbx-server bench/bench-pool >/dev/null
fi
SERVER=$BUILD/sbx-server
BENCH=$BUILD/bench/bench-pool

# An idle sandbox holds one descriptor (its network namespace); the 1,024 used last (one per
# 32 of the table) hold up to six (home, Landlock ruleset, cgroups): NEED covers both.
if [ "$QUICK" = 1 ]; then CAPACITY=1600; else CAPACITY=10400; fi
need() { echo $(($1 + 6 * 1024 + 256)); }
NEED=$(need "$CAPACITY")
HARD=$(ulimit -Hn)
if [ "$HARD" != unlimited ] && [ "$HARD" -lt "$NEED" ]; then
    ulimit -Hn "$NEED" 2>/dev/null || true # root may raise it (up to fs.nr_open)
    HARD=$(ulimit -Hn)
fi
SCALE=()
if [ "$QUICK" = 0 ] && [ "$HARD" != unlimited ] && [ "$HARD" -lt "$NEED" ]; then
    # section 5 wants 10,000 live sandboxes; a lower hard limit gets as many as it allows, and
    # says so in the section's title
    CAPACITY=$((HARD - 6 * 1024 - 256))
    NEED=$(need "$CAPACITY")
    SCALE=(--scale $((CAPACITY - 400)))
    echo "bench-pool: the hard descriptor limit ($HARD) allows $CAPACITY sandboxes, not 10400"
fi
if [ "$HARD" != unlimited ] && [ "$HARD" -lt "$NEED" ]; then
    echo "bench-pool: hard fd limit $HARD < $NEED (1 per sandbox + 6 per handle kept); raise it" >&2
    exit 2
fi
UID_BASE=${SBX_BENCH_UID_BASE:-56000}
if [ "$UID_BASE" -lt 20000 ] || [ "$UID_BASE" -gt 64000 ]; then
    echo "bench-pool: SBX_BENCH_UID_BASE must be 20000..64000" >&2
    exit 2
fi
# 64 uids spare: homes are made ahead for uids no create can then lack (docs/protocol.md);
# SMALL_UIDS above them for the second host (section 5 compares the two)
SMALL_CAPACITY=16
SMALL_UIDS=$((SMALL_CAPACITY + 64))
if [ "$CAPACITY" -gt $((65000 - UID_BASE - 64 - SMALL_UIDS)) ]; then
    CAPACITY=$((65000 - UID_BASE - 64 - SMALL_UIDS))
    SCALE=(--scale $((CAPACITY - 400)))
    echo "bench-pool: uids $UID_BASE..64999 allow $CAPACITY sandboxes and the homes made ahead (SBX_BENCH_UID_BASE=20000: 10400)"
fi
SMALL_UID_BASE=$((UID_BASE + CAPACITY + 64))
if [ "$(ulimit -Sn)" != unlimited ] && [ "$(ulimit -Sn)" -lt "$NEED" ]; then
    ulimit -Sn "$NEED"
fi

# The homes directory must be traversable by the sandbox uids (0711), like /sbx/homes.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/sbx-bench-pool.XXXXXX")
chmod 0711 "$WORK"
HOMES=$WORK/homes
mkdir "$WORK/dedicated" "$WORK/small"
TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
PORT=$("$BENCH" --free-port)
DPORT=$("$BENCH" --free-port)
SMPORT=$("$BENCH" --free-port)
SPID=
DPID=
SMPID=
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    for p in $SPID $DPID $SMPID; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# Wait until the server with pid $1 listens on port $2 (its log: $3).
wait_listening() {
    for _ in $(seq 200); do
        if ! kill -0 "$1" 2>/dev/null; then
            echo "sbx-server exited at start:" >&2
            cat "$3" >&2
            exit 1
        fi
        (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null && return 0
        sleep 0.05
    done
}

echo "command: $INVOKED"
echo "server:  env -i PATH=\$PATH SBX_TOKEN=<random 64 hex> SBX_PORT=$PORT SBX_HOST_MODE=1" \
    "SBX_HOMES_DIR=$HOMES SBX_CAPACITY=$CAPACITY SBX_POOL_UID_BASE=$UID_BASE" \
    "SBX_POOL_UID_COUNT=$((CAPACITY + 64)) $SERVER" \
    "  (as root, cwd $WORK)"
(cd "$WORK" && exec env -i PATH="$PATH" SBX_TOKEN="$TOKEN" SBX_PORT="$PORT" SBX_HOST_MODE=1 \
    SBX_HOMES_DIR="$HOMES" SBX_CAPACITY="$CAPACITY" SBX_POOL_UID_BASE="$UID_BASE" \
    SBX_POOL_UID_COUNT=$((CAPACITY + 64)) "$SERVER") 2>"$WORK/server.log" &
SPID=$!
# A second pool host with a few sandboxes: section 5 takes turns between the two.
echo "second host: env -i PATH=\$PATH SBX_TOKEN=<same> SBX_PORT=$SMPORT SBX_HOST_MODE=1" \
    "SBX_HOMES_DIR=$WORK/small/homes SBX_CAPACITY=$SMALL_CAPACITY" \
    "SBX_POOL_UID_BASE=$SMALL_UID_BASE SBX_POOL_UID_COUNT=$SMALL_UIDS $SERVER"
(cd "$WORK/small" && exec env -i PATH="$PATH" SBX_TOKEN="$TOKEN" SBX_PORT="$SMPORT" \
    SBX_HOST_MODE=1 SBX_HOMES_DIR="$WORK/small/homes" SBX_CAPACITY="$SMALL_CAPACITY" \
    SBX_POOL_UID_BASE="$SMALL_UID_BASE" SBX_POOL_UID_COUNT="$SMALL_UIDS" "$SERVER") \
    2>"$WORK/small.log" &
SMPID=$!
# The baseline: a dedicated-mode server (one sandbox = the whole server, no confinement).
echo "baseline: env -i PATH=\$PATH SBX_TOKEN=<same> SBX_PORT=$DPORT $SERVER   (cwd $WORK/dedicated)"
(cd "$WORK/dedicated" && exec env -i PATH="$PATH" SBX_TOKEN="$TOKEN" SBX_PORT="$DPORT" \
    "$SERVER") 2>"$WORK/dedicated.log" &
DPID=$!
wait_listening "$SPID" "$PORT" "$WORK/server.log"
wait_listening "$DPID" "$DPORT" "$WORK/dedicated.log"
wait_listening "$SMPID" "$SMPORT" "$WORK/small.log"

ARGS=(--port "$PORT" --pid "$SPID" --homes "$HOMES"
    --dedicated-port "$DPORT" --dedicated-pid "$DPID" --small-port "$SMPORT" --small-pid "$SMPID")
echo "bench:   SBX_BENCH_TOKEN=<same> $BENCH ${ARGS[*]} $*"
set +e
SBX_BENCH_TOKEN=$TOKEN "$BENCH" "${ARGS[@]}" "${SCALE[@]}" "$@"
RC=$?
set -e
if ! kill -0 "$SPID" 2>/dev/null || ! kill -0 "$SMPID" 2>/dev/null; then
    echo "a pool host died during the benchmark; its log:" >&2
    RC=1
fi
if [ "$RC" != 0 ]; then
    echo "--- sbx-server log (last 20 lines) ---" >&2
    tail -n 20 "$WORK/server.log" >&2
fi
exit "$RC"
