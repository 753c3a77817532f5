#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build bench-platform and run it against a platform started here, on loopback, in a temporary
# directory: one sbx-control (embedded SQLite store), one sbx-node registered with it, and a
# bare sbx-server on a unix socket as the direct baseline (the node's agent binary, the same
# random token, no namespaces). The bench creates one job and times exec of `true` direct,
# through the node and through control -> node, plus the node's capability check in process.
# Everything is stopped and removed at the end. Prints figures; exits non-zero only on a
# functional failure (a refused request, a stream without its exit event), never on timings.
#
#   scripts/bench-platform.sh [--quick] [bench-platform options: --rounds N --per-round N ...]
#
# --quick: a few rounds of a few requests, the whole run in a few seconds (a CI smoke run).
# Needs root (sbx-node starts runs in namespaces and cgroups).
# SBX_BUILD: the build directory (default: build).
# Also: `ninja -C build bench-platform` or `ninja -C build bench-platform-quick`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
INVOKED="$0${*:+ $*}"
BUILD=${SBX_BUILD:-build}
case $BUILD in
/*) ;;
*) BUILD=$ROOT/$BUILD ;;
esac
if [ "$(id -u)" != 0 ]; then
    echo "bench-platform: sbx-node needs root (namespaces, mounts, cgroups)" >&2
    exit 2
fi

if [ -z "${SBX_BENCH_NO_BUILD:-}" ]; then # the meson run_target has built them already
    [ -f "$BUILD/build.ninja" ] || meson setup "$BUILD" "$ROOT" >/dev/null
    TARGETS=(sbx-control sbx-node sbx-server bench/bench-platform)
    # the static agent exists only with -Dstatic_server=true (the default)
    if ninja -C "$BUILD" -t query sbx-server-static >/dev/null 2>&1; then
        TARGETS+=(sbx-server-static)
    fi
    ninja -C "$BUILD" "${TARGETS[@]}" >/dev/null
fi
CONTROL=$BUILD/sbx-control
NODE=$BUILD/sbx-node
BENCH=$BUILD/bench/bench-platform
# The agent every run starts (and the direct baseline): the static server when it was built.
AGENT=$BUILD/sbx-server-static
[ -x "$AGENT" ] || AGENT=$BUILD/sbx-server

WORK=$(mktemp -d "${TMPDIR:-/tmp}/sbx-bench-platform.XXXXXX")
mkdir -p "$WORK/control" "$WORK/node" "$WORK/home" "$WORK/direct"
TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
CPORT=$("$BENCH" --free-port)
NPORT=$("$BENCH" --free-port)
while [ "$NPORT" = "$CPORT" ]; do NPORT=$("$BENCH" --free-port); done
CPID=
NPID=
DPID=
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
    # the node first: it stops its runs as it goes down
    for p in $NPID $CPID $DPID; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

# Wait (10 s at most) until the command after $1 (pid) and $2 (its log) succeeds, while the
# process is alive.
wait_for() {
    local pid=$1 log=$2
    shift 2
    for _ in $(seq 200); do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "bench-platform: a process exited at start; its log:" >&2
            cat "$log" >&2
            exit 1
        fi
        "$@" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "bench-platform: timed out waiting for: $*; log:" >&2
    cat "$log" >&2
    exit 1
}
# shellcheck disable=SC2317  # called through wait_for
control_ready() {
    (exec 3<>"/dev/tcp/127.0.0.1/$CPORT") && [ -s "$WORK/control/node-join.token" ] &&
        [ -s "$WORK/home/token" ]
}
# shellcheck disable=SC2317  # called through wait_for
node_registered() { grep -q 'registered with the control plane' "$WORK/node.log"; }

echo "command: $INVOKED"
# TLS as in production (the bench trusts the CA the control plane makes); SBX_BENCH_PLAIN=1
# runs the platform with --insecure-plain-http instead, for a comparison.
PLAIN=()
[ -n "${SBX_BENCH_PLAIN:-}" ] && PLAIN=(--insecure-plain-http)
echo "control: env -i PATH=\$PATH SBX_HOME=$WORK/home $CONTROL --state $WORK/control" \
    "--listen 127.0.0.1:$CPORT ${PLAIN[*]}"
(cd "$WORK" && exec env -i PATH="$PATH" SBX_HOME="$WORK/home" "$CONTROL" \
    --state "$WORK/control" --listen "127.0.0.1:$CPORT" "${PLAIN[@]}") \
    2>"$WORK/control.log" &
CPID=$!
wait_for "$CPID" "$WORK/control.log" control_ready

echo "node:    env -i PATH=\$PATH $NODE --state $WORK/node --listen 127.0.0.1:$NPORT" \
    "--control 127.0.0.1:$CPORT --join-token-file $WORK/control/node-join.token --agent $AGENT" \
    "--id-range 2010000000:67108864" \
    "${PLAIN[*]}"
(cd "$WORK" && exec env -i PATH="$PATH" "$NODE" --state "$WORK/node" \
    --listen "127.0.0.1:$NPORT" --control "127.0.0.1:$CPORT" \
    --join-token-file "$WORK/control/node-join.token" --agent "$AGENT" \
    --id-range 2010000000:67108864 "${PLAIN[@]}") \
    2>"$WORK/node.log" &
NPID=$!
wait_for "$NPID" "$WORK/node.log" node_registered

SOCK=$WORK/direct/a.sock
echo "direct:  env -i PATH=\$PATH HOME=/root SBX_LISTEN=unix:$SOCK SBX_TOKEN=<random 64 hex>" \
    "$AGENT   (cwd $WORK/direct)"
(cd "$WORK/direct" && exec env -i PATH="$PATH" HOME=/root SBX_LISTEN="unix:$SOCK" \
    SBX_TOKEN="$TOKEN" "$AGENT") 2>"$WORK/direct.log" &
DPID=$!
wait_for "$DPID" "$WORK/direct.log" test -S "$SOCK"

ARGS=(--control-port "$CPORT" --node-port "$NPORT" --control-state "$WORK/control"
    --node-state "$WORK/node" --admin-token-file "$WORK/home/token" --direct "$SOCK"
    --control-pid "$CPID" --node-pid "$NPID" --direct-pid "$DPID")
echo "bench:   SBX_BENCH_TOKEN=<same> $BENCH ${ARGS[*]} $*"
set +e
SBX_BENCH_TOKEN=$TOKEN "$BENCH" "${ARGS[@]}" "$@"
RC=$?
set -e
for p in "$CPID:control" "$NPID:node" "$DPID:direct"; do
    if ! kill -0 "${p%%:*}" 2>/dev/null; then
        echo "bench-platform: the ${p#*:} process died during the benchmark" >&2
        RC=1
    fi
done
if [ "$RC" != 0 ]; then
    for l in control node direct; do
        echo "--- $l log (last 20 lines) ---" >&2
        tail -n 20 "$WORK/$l.log" >&2
    done
fi
exit "$RC"
