#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fail when a layer of src/ includes one it must not (docs/architecture.md):
#   - src/http (the HTTP core) includes nothing of server/, node/ or control/;
#   - src/node and src/control never include server/ (the agent), nor each other;
#   - src/server (the agent) includes neither node/ nor control/;
#   - src/common, src/cap, src/isolation, src/store and src/tls include no daemon nor the core;
#   - src/lib (libsbx) includes only common/ and its public header, src/cli only that header;
# and when the dependency list in docs/architecture.md (between the "layers:begin" and
# "layers:end" markers, one "dir -> dir dir ..." line per directory) differs from what the
# #include lines say, in either direction.
set -euo pipefail
cd "$(dirname "$0")/.."

DOC=docs/architecture.md
fail=0

# "<dir> <included dir>" for every #include "x/..." in src/<dir>, another directory than its own.
# An include without a directory names a header beside the includer (or fails to compile).
edges() {
    local d n
    for d in src/*/; do
        d=${d%/} n=${d#src/}
        grep -ho '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z0-9_]*/' "$d"/*.[ch] 2>/dev/null |
            sed -E 's/.*"([a-z0-9_]*)\//\1/' | sort -u | grep -vx "$n" | sed "s/^/$n /" || true
    done
}

forbid() { # dir, regex of directories it must not include, why
    local hits
    hits=$(grep -n -E "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"($2)/" src/"$1"/*.[ch] || true)
    if [[ -n $hits ]]; then
        echo "check-layers: src/$1 must not include ${2//|/\/ or }/ ($3):"
        echo "$hits" | sed 's/^/  /'
        fail=1
    fi
}

forbid http 'server|node|control' 'the HTTP core knows no daemon'
forbid node 'server|control' 'sbx-node runs on the HTTP core, not on the agent'
forbid control 'server|node' 'sbx-control runs on the HTTP core, not on the agent'
forbid server 'node|control' 'the agent knows no platform daemon'
for lib in common cap isolation store tls; do
    forbid "$lib" 'http|server|node|control' 'a library below every daemon'
done
forbid lib 'http|server|node|control|cap|isolation|store|tls|cli' 'libsbx is client side'
forbid cli 'common|http|server|node|control|cap|isolation|store|tls|lib' 'the CLI uses libsbx only'

actual=$(edges | awk '$1 != prev { if (prev != "") print line; prev = $1; line = $1 " ->" }
                     { line = line " " $2 } END { if (prev != "") print line }' | sort)
if [[ ! -f $DOC ]]; then
    echo "check-layers: $DOC is missing"
    exit 1
fi
documented=$(sed -n '/layers:begin/,/layers:end/p' "$DOC" | grep -E '^[a-z0-9_]+ ->' |
    while read -r dir _ deps; do
        [[ -n $deps ]] && echo "$dir -> $(echo "$deps" | tr ' ' '\n' | sort -u | xargs)"
    done | sort || true)
if [[ $actual != "$documented" ]]; then
    echo "check-layers: the dependencies in $DOC (layers:begin..end) do not match the includes:"
    diff <(echo "$documented") <(echo "$actual") | sed -n 's/^</  documented only:/p; s/^>/  included only:  /p'
    fail=1
fi

if ((fail)); then
    exit 1
fi
echo "check-layers: $(echo "$actual" | wc -l) directories, includes match $DOC"
