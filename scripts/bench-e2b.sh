#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bench-e2b (tests/e2b/bench.mjs): create -> run `echo` -> kill through E2B's own SDK (npm
# `e2b`, unmodified) beside the same through sbx's HTTP API directly, for a dedicated and a
# pooled template, one after another and 8 at once, in one run. As root: starts `sbx up` on a
# temporary state directory (default image: host). Figures only: exits non-zero only on a
# functional failure.
#
#   scripts/bench-e2b.sh [--quick]
#
# SBX_BUILD: the build directory (default: build). Needs Node.js and tests/e2b/node_modules
# (scripts/setup.sh installs both).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${SBX_BUILD:-build}
case $BUILD in
/*) ;;
*) BUILD=$ROOT/$BUILD ;;
esac
N=10
[ "${1:-}" = --quick ] && N=2
if [ "$(id -u)" != 0 ]; then
    echo "bench-e2b: needs root (sbx up starts a node)" >&2
    exit 2
fi
if [ ! -f "$ROOT/tests/e2b/node_modules/e2b/package.json" ]; then
    echo "bench-e2b: E2B's SDK is not installed (bash scripts/setup.sh installs it)" >&2
    exit 2
fi
if [ -z "${SBX_BENCH_NO_BUILD:-}" ]; then
    [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" "$ROOT" >/dev/null
    ninja -C "$BUILD" sbx sbx-control sbx-node sbx-server >/dev/null
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sbx-bench-e2b.XXXXXX")
chmod 0711 "$WORK"
export SBX_HOME=$WORK/home
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    "$BUILD/sbx" down --state "$WORK/state" >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# two free ports in a row: the control's P and the node's P+1 (sbx up)
CPORT=$(python3 -c '
import socket
while True:
    a = socket.socket(); a.bind(("127.0.0.1", 0)); p = a.getsockname()[1]
    b = socket.socket()
    try:
        b.bind(("127.0.0.1", p + 1))
    except OSError:
        continue
    print(p); break')
"$BUILD/sbx" up --state "$WORK/state" --port "$CPORT" --default-image host \
    --images "$WORK/images" --id-range 2050000000:4194304 >/dev/null
echo "platform: sbx up --state $WORK/state --port $CPORT --default-image host"
echo "machine:  $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); Node.js $(node --version)"
cd "$ROOT/tests/e2b"
E2B_API_URL="https://127.0.0.1:$CPORT" E2B_SANDBOX_URL="https://127.0.0.1:$CPORT" \
    E2B_API_KEY="$(cat "$SBX_HOME/token")" NODE_EXTRA_CA_CERTS="$SBX_HOME/ca.crt" \
    SBX_BENCH_N=$N node bench.mjs
