#!/usr/bin/env bash
# The main job, on the embedded default: install what is missing, build, start the platform on
# loopback (one sbx-control on its SQLite store, one sbx-node) and drive it through the edge
# proxy as a client would: a dedicated sandbox and a pool host with sandboxes, each running
# commands with streamed output; then pause and resume (a new generation, files kept).
# SBX_DEMO_KEEP=1 keeps the temporary directory (logs, state) for a look afterwards.
# The client here is curl (+ python3 for JSON fields) until the CLI issue brings `sbx`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
bash scripts/build.sh >/dev/null
# the default image every sandbox runs (Debian minbase + python3; built once, ~2 minutes)
bash scripts/build-image.sh

CPORT=${SBX_DEMO_CONTROL_PORT:-49980}
NPORT=${SBX_DEMO_NODE_PORT:-49981}
WORK=$(mktemp -d /tmp/sbx-demo.XXXXXX)
export SBX_HOME=$WORK/home # where sbx-control writes the admin token (a client reads it there)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    [ -n "${SBX_DEMO_KEEP:-}" ] && echo "kept $WORK" >&2 && return
    rm -rf "$WORK"
}
trap cleanup EXIT

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
field() { python3 -c 'import json,sys; v=json.load(sys.stdin)
for k in sys.argv[1].split("."): v=v[int(k)] if isinstance(v,list) else v[k]
print(v)' "$1"; }

say "start sbx-control (store: $WORK/control/store.db) and one sbx-node"
./build/sbx-control --state "$WORK/control" --listen 127.0.0.1:$CPORT 2>"$WORK/control.log" &
PIDS+=($!)
for _ in $(seq 100); do [ -s "$WORK/control/node-join.token" ] && break; sleep 0.05; done
./build/sbx-node --state "$WORK/node" --listen 127.0.0.1:$NPORT --control 127.0.0.1:$CPORT \
    --join-token-file "$WORK/control/node-join.token" --name node-1 2>"$WORK/node.log" &
PIDS+=($!)
TOKEN=$(cat "$SBX_HOME/token")
C=https://127.0.0.1:$CPORT # TLS 1.3; the platform's CA is made on the first start
CA=$WORK/control/tls/ca.crt
api() { curl -fsS --cacert "$CA" -H "Authorization: Bearer $TOKEN" "$@"; }
for _ in $(seq 100); do
    api "$C/v1/nodes" 2>/dev/null | grep -q '"live":true' && break
    sleep 0.1
done
api "$C/v1/nodes"; echo

# A sandbox's token is derived, never stored by the client: HMAC-SHA256(API token, nonce).
derive() { python3 -c 'import hmac,hashlib,sys
print(hmac.new(sys.argv[1].encode(), ("sbx-sandbox:"+sys.argv[2]).encode(), hashlib.sha256).hexdigest())' "$TOKEN" "$1"; }
create_job() { # mode labels-json env-json nonce
    api -X POST "$C/v1/jobs/demo" -d "{\"flavor\":\"cpu-small\",\"mode\":\"$1\",\"labels\":$2,
        \"env\":$3,\"secrets\":{\"SBX_TOKEN\":\"$(derive "$4")\"}}" | field id
}
wait_stage() { # id stage
    for _ in $(seq 150); do
        s=$(api "$C/v1/jobs/demo/$1" | field stage)
        [ "$s" = "$2" ] && return 0
        sleep 0.1
    done
    echo "job $1 did not reach $2 (stage $s)" >&2
    api "$C/v1/jobs/demo/$1" >&2
    return 1
}

say "a dedicated sandbox: one job, its own run (user, network and other namespaces, cgroup, own root)"
N1=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
J1=$(create_job dedicated "{\"sbx-sandbox\":\"1\",\"sbx-sandbox-mode\":\"dedicated\",\"sbx-sandbox-nonce\":\"$N1\"}" '{}' "$N1")
wait_stage "$J1" RUNNING
api "$C/v1/jobs/demo/$J1" | python3 -m json.tool | sed -n '1,200p' | grep -E '"(id|stage|generation|node|activation|state)"'
P1="$C/v1/jobs/demo/$J1/proxy/49983"
T1=$(derive "$N1")
say "exec through control -> node -> run, output streamed live (NDJSON)"
api -N -H "X-Sandbox-Token: $T1" "$P1/v1/exec" \
    -d '{"cmd":"for i in 1 2 3; do echo step $i; sleep 0.3; done; echo pid $$ on $(hostname); id; cat /proc/self/uid_map; grep PRETTY /etc/os-release; python3 -V"}'
api -H "X-Sandbox-Token: $T1" -X PUT --data-binary 'kept across generations' \
    "$P1/v1/files/write?path=/root/note.txt"; echo

say "a pool host (mode \"pool\"): one job packing light sandboxes (uid + home + Landlock each)"
N2=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
J2=$(create_job pool "{\"sbx-sandbox\":\"1\",\"sbx-sandbox-mode\":\"pool\",\"sbx-sandbox-pool\":\"demo\",\"sbx-sandbox-nonce\":\"$N2\"}" \
    '{"SBX_CAPACITY":"32"}' "$N2")
wait_stage "$J2" RUNNING
P2="$C/v1/jobs/demo/$J2/proxy/49983"
SB=$(api -H "X-Sandbox-Token: $(derive "$N2")" -X POST "$P2/v1/sandboxes" -d '{"count":3}')
for i in 0 1 2; do
    ID=$(printf '%s' "$SB" | field "sandboxes.$i.id")
    TK=$(printf '%s' "$SB" | field "sandboxes.$i.token")
    echo "-- sandbox $ID"
    api -N -H "X-Sandbox-Token: $TK" "$P2/v1/sandboxes/$ID/exec" \
        -d '{"cmd":"echo hello from $(id -u) in $(pwd); ls /sbx/homes 2>&1 | head -2"}'
done

say "pause and resume the dedicated sandbox: a new generation, its files kept"
api -X POST "$C/v1/jobs/demo/$J1/pause" >/dev/null
wait_stage "$J1" PAUSED
curl -sS --cacert "$CA" -H "Authorization: Bearer $TOKEN" -H "X-Sandbox-Token: $T1" "$P1/v1/exec" -d '{"cmd":"true"}'; echo
api -X POST "$C/v1/jobs/demo/$J1/resume" >/dev/null
wait_stage "$J1" RUNNING
api "$C/v1/jobs/demo/$J1" | python3 -c 'import json,sys; j=json.load(sys.stdin); print("generation", j["run"]["generation"], "activation", j["run"]["activation"])'
api -N -H "X-Sandbox-Token: $T1" "$P1/v1/exec" -d '{"cmd":"cat /root/note.txt; echo"}'

say "list the sandbox jobs by label, then cancel them"
api "$C/v1/jobs/demo?label=sbx-sandbox=1" | python3 -c 'import json,sys
for j in json.load(sys.stdin): print(j["id"], j["labels"]["sbx-sandbox-mode"], j["stage"])'
api -X POST "$C/v1/jobs/demo/$J1/cancel" >/dev/null
api -X POST "$C/v1/jobs/demo/$J2/cancel" >/dev/null
wait_stage "$J1" CANCELED
wait_stage "$J2" CANCELED
say "a wrong API token is refused"
curl -sS --cacert "$CA" -H "Authorization: Bearer wrong" "$C/v1/jobs/demo"; echo
say "demo finished"
