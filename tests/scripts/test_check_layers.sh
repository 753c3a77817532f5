#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/check-layers.sh against includes that climb between layers: in a scratch copy of
# src/, include/ and docs/architecture.md, the unchanged tree passes (positive control), then
# each bad include added to one file alone must fail and be named; includes that stay in
# bounds must still pass. TAP output; a meson test (tests/meson.build), so scripts/test.sh's
# unit stage runs it.
#   bash tests/scripts/test_check_layers.sh [SOURCE_ROOT]
set -uo pipefail
ROOT=$(realpath "${1:-$(dirname "$0")/../..}")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/check-layers-test.XXXXXX") || exit 1
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/scripts" "$WORK/docs"
cp -r "$ROOT/src" "$ROOT/include" "$WORK/" || exit 1
cp "$ROOT/docs/architecture.md" "$WORK/docs/" || exit 1
cp "$ROOT/README.md" "$WORK/" || exit 1
cp "$ROOT/scripts/check-layers.sh" "$WORK/scripts/" || exit 1

n=0 failed=0
ok() { n=$((n + 1)) && echo "ok $n - $1"; }
not_ok() {
    n=$((n + 1)) failed=1
    echo "not ok $n - $1"
    sed 's/^/# /' "$WORK/out"
}

# run_with FILE LINE: check-layers.sh with LINE appended to src/FILE (restored after); its
# exit status, its output in $WORK/out
run_with() {
    local f="$WORK/src/$1" rc
    cp "$f" "$WORK/saved"
    [[ -n $2 ]] && printf '%s\n' "$2" >>"$f"
    bash "$WORK/scripts/check-layers.sh" >"$WORK/out" 2>&1
    rc=$?
    cp "$WORK/saved" "$f"
    return $rc
}

expect_fail() { # file, include line, why
    local line
    if run_with "$1" "$2"; then
        not_ok "$3: passed, but must fail: $2 in src/$1"
        return
    fi
    line=$(wc -l <"$WORK/src/$1")
    line=$((line + 1))
    if grep -qF "src/$1:$line: $2" "$WORK/out"; then
        ok "$3: fails and names src/$1:$line"
    else
        not_ok "$3: failed without naming src/$1:$line: $2"
    fi
}

expect_pass() { # file, include line, why
    if run_with "$1" "$2"; then ok "$3"; else not_ok "$3: must pass: $2 in src/$1"; fi
}

expect_pass http/conn.c "" "the tree as it is passes"
expect_fail http/conn.c '#include "server/server.h"' "the HTTP core includes the agent"
expect_fail http/conn.c '#include "../server/server.h"' "a relative climb into server/"
expect_fail http/conn.c '#include <server/server.h>' "an angle include of server/"
expect_fail http/conn.c '#  include "./../node/node.h"' "./../ into node/"
expect_fail http/conn.c '#include "../../src/control/control.h"' "out of src/ and back into control/"
expect_fail http/conn.c '#include "common/../server/server.h"' "a path through common/ into server/"
expect_fail http/conn.c '#include "../server/no-such-header.h"' "a relative climb to a missing file"
expect_fail node/node.c '#include "../control/control.h"' "sbx-node includes the control plane"
expect_fail lib/client.c '#include "../server/server.h"' "libsbx includes the agent"
expect_fail cli/main.c '#include "../common/buf.h"' "the CLI climbs into common/"
expect_fail cli/main.c '#include <common/buf.h>' "the CLI includes common/ by angle"
expect_fail common/buf.c '#include "../../README.md"' "a path out of src/ and include/sbx/"
expect_fail common/buf.c '#include "../../../etc/passwd"' "a path above the tree"
expect_pass node/node.c '#include "../common/buf.h"' "a relative include of an allowed layer"
expect_pass node/node.c '#include "../node/node.h"' "a relative include of the own directory"
expect_pass http/conn.c '#include <sys/types.h>' "system headers are no layer"
expect_pass lib/client.c '#include "../../include/sbx/sbx.h"' "libsbx's public header by a relative path"

echo "1..$n"
exit $failed
