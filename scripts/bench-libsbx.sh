#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bench-libsbx (bench/bench_libsbx.c): pooled sandboxes created, exec'd and deleted through
# libsbx -> sbx-control -> sbx-node -> a pool host, beside the same through a pool host's agent
# directly and a bare spawn loop, in one run; and cold starts. As root: starts `sbx up` on a
# temporary state directory (SBX_HOME there too) and a pool-host sbx-server on loopback.
# Figures only: exits non-zero only on a functional failure.
#
#   scripts/bench-libsbx.sh [--quick] [--n N] [--threads T]
#
# SBX_BUILD: the build directory (default: build). Default image: host (no image to unpack).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${SBX_BUILD:-build}
case $BUILD in
/*) ;;
*) BUILD=$ROOT/$BUILD ;;
esac
if [ "$(id -u)" != 0 ]; then
    echo "bench-libsbx: needs root (sbx up starts a node; the direct pool host uses uids)" >&2
    exit 2
fi
if [ -z "${SBX_BENCH_NO_BUILD:-}" ]; then
    [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" "$ROOT" >/dev/null
    ninja -C "$BUILD" sbx sbx-control sbx-node sbx-server bench/bench-libsbx >/dev/null
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sbx-bench-libsbx.XXXXXX")
chmod 0711 "$WORK"
export SBX_HOME=$WORK/home
SPID=
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    "$BUILD/sbx" down --state "$WORK/state" >/dev/null 2>&1 || true
    if [ -n "$SPID" ]; then
        kill "$SPID" 2>/dev/null || true
        wait "$SPID" 2>/dev/null || true
    fi
    [ -n "${SBX_BENCH_KEEP:-}" ] && { echo "kept: $WORK" >&2; return; }
    rm -rf "$WORK"
}
trap cleanup EXIT

# three free ports: the control's P, the node's P+1 (sbx up), and the direct host's
read -r CPORT DPORT < <(python3 -c '
import socket
def free(p=0):
    s = socket.socket(); s.bind(("127.0.0.1", p)); return s
while True:
    a = free(); p = a.getsockname()[1]
    try:
        b = free(p + 1)
    except OSError:
        continue
    c = free(); print(p, c.getsockname()[1]); break')
TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')

echo "platform: sbx up --state $WORK/state --port $CPORT --default-image host"
"$BUILD/sbx" up --state "$WORK/state" --port "$CPORT" --default-image host \
    --images "$WORK/images" --id-range 2000000000:4194304 >/dev/null
echo "direct:   env -i SBX_HOST_MODE=1 SBX_TOKEN=<random> SBX_PORT=$DPORT" \
    "SBX_HOMES_DIR=$WORK/homes $BUILD/sbx-server   (as root)"
(cd "$WORK" && exec env -i PATH="$PATH" SBX_TOKEN="$TOKEN" SBX_PORT="$DPORT" SBX_HOST_MODE=1 \
    SBX_HOMES_DIR="$WORK/homes" SBX_POOL_UID_BASE=56000 "$BUILD/sbx-server") 2>"$WORK/direct.log" &
SPID=$!
for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$DPORT") 2>/dev/null && break
    kill -0 "$SPID" 2>/dev/null || { cat "$WORK/direct.log" >&2; exit 1; }
    sleep 0.05
done
nproc_=$(nproc)
echo "machine:  $nproc_ CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
SBX_BENCH_DIRECT_PORT=$DPORT SBX_BENCH_DIRECT_TOKEN=$TOKEN "$BUILD/bench/bench-libsbx" "$@"
