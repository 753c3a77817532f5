#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Check build/sbx-server-static (BUILD_DIR overrides build): a static ELF (no interpreter, no
# dynamic section), stripped size within 1.5 MiB, and it starts and answers GET /health with a
# scrubbed environment. The dynamic build/sbx-server is the positive control for the ELF check.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
bin="$BUILD_DIR/sbx-server-static"
MAX_STATIC=1572864

fail() {
    echo "check-static: $*" >&2
    exit 1
}

[[ -x "$bin" ]] || fail "$bin missing"
headers=$(readelf -lW "$bin")
grep -qE '^\s+INTERP\b' <<<"$headers" && fail "$bin has a program interpreter (dynamic)"
grep -qE '^\s+DYNAMIC\b' <<<"$headers" && fail "$bin has a dynamic section"
# positive control: the same test does see the ordinary build as dynamic
if [[ -x "$BUILD_DIR/sbx-server" ]]; then
    readelf -lW "$BUILD_DIR/sbx-server" | grep -qE '^\s+INTERP\b' ||
        fail "control failed: $BUILD_DIR/sbx-server shows no INTERP either"
fi

tmp=$(mktemp -d)
pid=
cleanup() {
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

strip -o "$tmp/stripped" "$bin"
size=$(stat -c %s "$tmp/stripped")
((size <= MAX_STATIC)) || fail "stripped size $size > $MAX_STATIC"

version=$("$bin" --version)
[[ "$version" == "sbx-server "* ]] || fail "--version printed '$version'"

port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
env -i SBX_TOKEN=static-check SBX_PORT="$port" "$bin" 2>"$tmp/stderr" &
pid=$!
body=
for _ in $(seq 1 100); do
    if body=$(curl -fsS --max-time 2 "http://127.0.0.1:$port/health" 2>/dev/null); then
        break
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$tmp/stderr" >&2; fail "server exited"; }
    sleep 0.05
done
[[ "$body" == *'"status"'*'"ok"'* ]] || { cat "$tmp/stderr" >&2; fail "GET /health said '$body'"; }
echo "check-static: $bin static, $size bytes stripped, serves /health ($body)"
