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
#
# Every #include of every .c/.h under src/ is resolved to the directory it names, whatever its
# form: "x/y.h" and <x/y.h> through -I src (an angle include counts only when x is a directory
# of src/ or the public sbx/: the rest are system headers), a relative "../x/y.h" (or any path
# with a . or .. component) from the includer's own directory. include/sbx/ is the layer "sbx"
# (the public header); a relative path that climbs out of src/ and include/sbx/ fails.
set -euo pipefail
cd "$(dirname "$0")/.."

DOC=docs/architecture.md
fail=0
layers=$(cd src && for d in */; do printf '%s ' "${d%/}"; done)

# "<dir> <included dir> <file>:<line>: <the include>" for every include that names another
# directory than the includer's own ("?" for a path out of src/ and include/sbx/).
includes() {
    find src -name '*.[ch]' -print0 | sort -z |
        { xargs -0 grep -Hn -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"][^">]*[">]' || true; } |
        awk -v layers=" $layers " '
        function norm(p,    n, a, out, k, i, s) { # "." and ".." folded; "" when above the root
            n = split(p, a, "/"); k = 0
            for (i = 1; i <= n; i++) {
                if (a[i] == "" || a[i] == ".") continue
                if (a[i] == "..") { if (k == 0) return ""; k--; continue }
                out[++k] = a[i]
            }
            s = out[1]
            for (i = 2; i <= k; i++) s = s "/" out[i]
            return s
        }
        function exists(p,    x) {
            if (p == "" || (getline x < p) < 0) return 0
            close(p)
            return 1
        }
        function layer_of(t,    l) { # the directory of src/ a path is in, "sbx", or ""
            if (t ~ /^include\/sbx\//) return "sbx"
            if (t !~ /^src\/[^\/]+\//) return ""
            l = substr(t, 5); sub(/\/.*/, "", l)
            return l
        }
        {
            file = $0; sub(/:.*/, "", file)
            rest = substr($0, length(file) + 2); line = rest; sub(/:.*/, "", line)
            text = substr(rest, length(line) + 2); sub(/^[[:space:]]+/, "", text)
            dir = file; sub(/\/[^\/]*$/, "", dir)
            own = substr(dir, 5); sub(/\/.*/, "", own)
            if (!match(text, /[<"][^">]*[">]/)) next
            inc = substr(text, RSTART + 1, RLENGTH - 2); angle = substr(text, RSTART, 1) == "<"
            # where the compiler looks: "x" beside the includer first, then -I src, -I include
            n = 0
            if (!angle) cand[++n] = norm(dir "/" inc)
            cand[++n] = norm("src/" inc); cand[++n] = norm("include/" inc)
            found = ""
            for (i = 1; i <= n && found == ""; i++) if (exists(cand[i])) found = cand[i]
            relative = inc ~ /(^|\/)\.\.?(\/|$)/
            if (found != "") {
                layer = layer_of(found)
            } else if (relative) {      # no such file: judged by where the path points
                layer = layer_of(cand[1])
            } else if (inc !~ /\//) {
                next                    # a system header (or one that does not compile)
            } else {
                layer = inc; sub(/\/.*/, "", layer)
                if (angle && layer != "sbx" && index(layers, " " layer " ") == 0) next
            }
            if (layer == "") layer = "?"
            if (layer != own) print own, layer, file ":" line ": " text
        }'
}

INCLUDES=$(includes)

# "<dir> <included dir>" for every directory another one includes.
edges() { echo "$INCLUDES" | awk 'NF >= 2 && $2 != "?" { print $1, $2 }' | sort -u; }

forbid() { # dir, regex of directories it must not include, why
    local hits
    hits=$(echo "$INCLUDES" | awk -v d="$1" -v re="^($2)\$" '$1 == d && $2 ~ re' |
        cut -d' ' -f3- | sed 's/^/  /' || true)
    if [[ -n $hits ]]; then
        echo "check-layers: src/$1 must not include ${2//|/\/ or }/ ($3):"
        echo "$hits"
        fail=1
    fi
}

outside=$(echo "$INCLUDES" | awk '$2 == "?"' | cut -d' ' -f3- | sed 's/^/  /' || true)
if [[ -n $outside ]]; then
    echo "check-layers: an include climbs out of src/ (and is not include/sbx/):"
    echo "$outside"
    fail=1
fi
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
