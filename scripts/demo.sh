#!/usr/bin/env bash
# The main job, on the embedded default: install what is missing, build, start sbx-server on
# loopback and drive a sandbox through its HTTP API (streamed exec, files, a background process).
# Until the platform (sbx-control + sbx-node) lands, the demo talks to sbx-server directly.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh >/dev/null

PORT=${SBX_DEMO_PORT:-49983}
TOKEN=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
WORK=$(mktemp -d /tmp/sbx-demo.XXXXXX)
SBX_TOKEN=$TOKEN SBX_PORT=$PORT ./build/sbx-server 2>"$WORK/server.log" &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$WORK"' EXIT

for _ in $(seq 100); do
    curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    sleep 0.05
done

api() { curl -fsS -H "X-Sandbox-Token: $TOKEN" "$@"; }
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "health (with the token: version, mode, features)"
api "http://127.0.0.1:$PORT/health"; echo

say "exec with live NDJSON output (start -> stdout/stderr -> exit)"
api -N "http://127.0.0.1:$PORT/v1/exec" \
    -d '{"cmd":"for i in 1 2 3; do echo step $i; sleep 0.3; done; echo done >&2; uname -sr"}'

say "exec of an argv array with env and cwd"
api -N "http://127.0.0.1:$PORT/v1/exec" \
    -d "{\"cmd\":[\"sh\",\"-c\",\"echo \$GREETING from \$(pwd)\"],\"env\":{\"GREETING\":\"hello\"},\"cwd\":\"$WORK\"}"

say "binary output is delivered exactly (encoding base64)"
api -N "http://127.0.0.1:$PORT/v1/exec" -d '{"cmd":"printf \"\\377\\376ok\"","encoding":"base64"}'

say "files: write, read back, list"
printf 'hello from the demo\n' | api -X PUT --data-binary @- "http://127.0.0.1:$PORT/v1/files/write?path=$WORK/hello.txt"; echo
api "http://127.0.0.1:$PORT/v1/files/read?path=$WORK/hello.txt"
api "http://127.0.0.1:$PORT/v1/files/list?path=$WORK"; echo

say "a background process, its output re-attached, then stopped"
P=$(api "http://127.0.0.1:$PORT/v1/processes" -d '{"cmd":"i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.2; done","tag":"ticker"}')
echo "$P"
ID=$(printf '%s' "$P" | sed -n 's/.*"id":"\(p-[0-9]*\)".*/\1/p')
sleep 0.7
api "http://127.0.0.1:$PORT/v1/processes/$ID/output?follow=false"
api -X DELETE "http://127.0.0.1:$PORT/v1/processes/$ID"; echo
api "http://127.0.0.1:$PORT/v1/processes"; echo

say "a wrong token is refused"
curl -sS -H "X-Sandbox-Token: wrong" "http://127.0.0.1:$PORT/v1/exec" -d '{"cmd":"id"}'; echo
say "demo finished"
