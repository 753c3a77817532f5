#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The product surface in one go, as a new user would run it: install what is missing, build,
# `sbx up` (a local platform on loopback), a dedicated sandbox with streamed output, a pool of
# 100 sandboxes each running a command, then everything removed and `sbx down`.
# The platform's state and the client configuration live in a temporary directory (removed at
# the end; SBX_DEMO_KEEP=1 keeps it), so nothing of a running `sbx up` is touched.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh >/dev/null
# the default image (Debian minbase + python3) is built by `sbx up` when it is missing

SBX=$PWD/build/sbx
PORT=${SBX_DEMO_CONTROL_PORT:-49970}
WORK=$(mktemp -d /tmp/sbx-demo.XXXXXX)
export SBX_HOME=$WORK/home
cleanup() {
    "$SBX" down --state "$WORK/state" >/dev/null 2>&1 || true
    [ -n "${SBX_DEMO_KEEP:-}" ] && echo "kept $WORK" >&2 && return
    rm -rf "$WORK"
}
trap cleanup EXIT
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "sbx up: sbx-control + sbx-node on 127.0.0.1:$PORT, state in $WORK/state"
"$SBX" up --state "$WORK/state" --port "$PORT"
"$SBX" status --state "$WORK/state"

say "a dedicated sandbox (a job of its own: user, network and other namespaces, own root)"
ID=$("$SBX" create)
echo "$ID"
"$SBX" exec -c "$ID" -- 'for i in 1 2 3; do echo step $i; sleep 0.3; done; id; grep PRETTY /etc/os-release; python3 -V'
echo 'print("hello from a file")' >"$WORK/hello.py"
"$SBX" cp "$WORK/hello.py" "$ID:/root/hello.py"
"$SBX" exec "$ID" -- python3 /root/hello.py
set +e
"$SBX" exec -c "$ID" -- 'echo failing on purpose >&2; exit 3'
echo "exit code $?"
set -e

say "a pool: 100 sandboxes packed into pool hosts by the control plane"
"$SBX" pool create demo --per-host 50 --max-hosts 2
"$SBX" create --pool demo --count 100 >"$WORK/pooled"
wc -l <"$WORK/pooled"
say "each of the 100 runs a command, 10 at a time; their output streams as it comes"
xargs -P 10 -I{} "$SBX" exec -c {} -- \
    'echo "sandbox $SBX_SANDBOX_ID: uid $(id -u) in $PWD"' <"$WORK/pooled" | tee "$WORK/out"
echo "($(wc -l <"$WORK/out") lines, one from each sandbox)"
"$SBX" pool inspect demo | python3 -c 'import json,sys; p=json.load(sys.stdin)
print("hosts:", [(h["job"], h["used"], h["capacity"]) for h in p["hosts"]], "sandboxes:", p["sandboxes"])'

say "list, then remove everything"
"$SBX" ls >"$WORK/ls"
head -n 4 "$WORK/ls"
"$SBX" kill "$ID" >/dev/null
"$SBX" pool rm demo
"$SBX" down --state "$WORK/state"
say "demo finished"
