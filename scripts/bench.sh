#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build bench-server and run it against a freshly started sbx-server (random token, free
# loopback port, raised fd limit and connection cap). Prints figures beside same-run baselines;
# exits non-zero only on a functional failure (wrong bytes, a failed request), never on timings.
#
#   scripts/bench.sh [--quick] [--only exec,stream,files,idle,concurrent]
#
# --quick: small sizes, the whole run in well under 30 s (a CI smoke run).
# SBX_BUILD: the build directory (default: build). Also: `ninja -C build bench|bench-quick`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
INVOKED="$0${*:+ $*}"
BUILD=${SBX_BUILD:-build}
case $BUILD in
/*) ;;
*) BUILD=$ROOT/$BUILD ;;
esac
QUICK=0
for a in "$@"; do
    [ "$a" = --quick ] && QUICK=1
done

if [ -z "${SBX_BENCH_NO_BUILD:-}" ]; then # the meson run_target has built both already
    [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" "$ROOT" >/dev/null
    ninja -C "$BUILD" sbx-server bench/bench-server >/dev/null
fi
SERVER=$BUILD/sbx-server
BENCH=$BUILD/bench/bench-server

# 10,000 idle connections need 10,000 descriptors on each side (the server raises its own soft
# limit to the hard one; the bench inherits ours).
if [ "$QUICK" = 1 ]; then CONNS=1000; else CONNS=10000; fi
NEED=$((CONNS + 256))
HARD=$(ulimit -Hn)
if [ "$HARD" != unlimited ] && [ "$HARD" -lt "$NEED" ]; then
    echo "warning: hard fd limit $HARD < $NEED; the idle-connection test will report n/a" >&2
    ulimit -n "$HARD"
elif [ "$(ulimit -Sn)" != unlimited ] && [ "$(ulimit -Sn)" -lt "$NEED" ]; then
    ulimit -n "$NEED"
fi
MAXCONN=$((CONNS + 2000))

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sbx-bench.XXXXXX")
mkdir "$WORK/files"
TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
PORT=$("$BENCH" --free-port)
SPID=
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    if [ -n "$SPID" ]; then
        kill "$SPID" 2>/dev/null || true
        wait "$SPID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT

echo "command: $INVOKED"
echo "server:  env -i PATH=\$PATH SBX_TOKEN=<random 64 hex> SBX_PORT=$PORT" \
    "SBX_MAX_CONNECTIONS=$MAXCONN $SERVER   (cwd $WORK, ulimit -n $(ulimit -n))"
(cd "$WORK" && exec env -i PATH="$PATH" SBX_TOKEN="$TOKEN" SBX_PORT="$PORT" \
    SBX_MAX_CONNECTIONS="$MAXCONN" "$SERVER") 2>"$WORK/server.log" &
SPID=$!

for _ in $(seq 200); do
    if ! kill -0 "$SPID" 2>/dev/null; then
        echo "sbx-server exited at start:" >&2
        cat "$WORK/server.log" >&2
        exit 1
    fi
    (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
    sleep 0.05
done

echo "bench:   SBX_BENCH_TOKEN=<same> $BENCH --port $PORT --pid $SPID --dir $WORK/files $*"
set +e
SBX_BENCH_TOKEN=$TOKEN "$BENCH" --port "$PORT" --pid "$SPID" --dir "$WORK/files" "$@"
RC=$?
set -e
if ! kill -0 "$SPID" 2>/dev/null; then
    echo "sbx-server died during the benchmark; its log:" >&2
    RC=1
fi
if [ "$RC" != 0 ]; then
    echo "--- sbx-server log (last 20 lines) ---" >&2
    tail -n 20 "$WORK/server.log" >&2
fi
exit "$RC"
