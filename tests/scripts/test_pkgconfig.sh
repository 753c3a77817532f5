#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# libsbx as an outside program sees it: `meson install` of the build into a scratch DESTDIR,
# then tests/pkgconfig/consumer.c compiled with only what the installed libsbx.pc says
# (`pkg-config --cflags --libs libsbx`, PKG_CONFIG_PATH at the installed file) and run against
# the installed shared library. A meson test (tests/meson.build): scripts/test.sh's unit stage.
#   bash tests/scripts/test_pkgconfig.sh BUILD_DIR SOURCE_ROOT SANITIZE CC...
# SANITIZE is the build's b_sanitize ("none", or e.g. "address,undefined": the program is then
# built with the same runtime).
set -euo pipefail
BUILD=$(realpath "$1") ROOT=$(realpath "$2") SAN=$3
shift 3
CC_CMD=("$@")
((${#CC_CMD[@]})) || CC_CMD=(cc)
DEST=$(mktemp -d "${TMPDIR:-/tmp}/libsbx-pc.XXXXXX")
trap 'rm -rf "$DEST"' EXIT

meson install -C "$BUILD" --destdir "$DEST" --no-rebuild --quiet >"$DEST/install.log" 2>&1 || {
    cat "$DEST/install.log"
    echo "FAIL: meson install --destdir did not work"
    exit 1
}
pc=$(find "$DEST" -name libsbx.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n $pc ]] || {
    echo "FAIL: no pkgconfig/libsbx.pc installed under $DEST"
    exit 1
}
prefix=$(sed -n 's/^prefix=//p' "$pc")
[[ -f "$DEST$prefix/include/sbx/sbx.h" ]] || {
    echo "FAIL: sbx/sbx.h is not installed under $DEST$prefix/include"
    exit 1
}
# The installed file, relocated into DESTDIR (its other paths are ${prefix}-relative); only
# its directory on PKG_CONFIG_PATH, and no uninstalled variant.
export PKG_CONFIG_PATH
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_DISABLE_UNINSTALLED=1
pc_args=(--define-variable=prefix="$DEST$prefix")
pkg-config "${pc_args[@]}" --exists libsbx || {
    echo "FAIL: pkg-config does not accept $pc"
    exit 1
}
read -r -a flags <<<"$(pkg-config "${pc_args[@]}" --cflags --libs libsbx)"
libdir=$(pkg-config "${pc_args[@]}" --variable=libdir libsbx)
echo "pkg-config --cflags --libs libsbx: ${flags[*]}"
[[ " ${flags[*]} " == *" -I$DEST$prefix/include "* && " ${flags[*]} " == *" -lsbx "* &&
    $libdir == "$DEST"* ]] || {
    echo "FAIL: the flags do not point into the installed tree"
    exit 1
}

san=()
[[ $SAN != none && -n $SAN ]] && san=(-fsanitize="$SAN")
"${CC_CMD[@]}" -std=gnu17 -Wall -Werror "${san[@]}" -o "$DEST/consumer" \
    "$ROOT/tests/pkgconfig/consumer.c" "${flags[@]}"

want=$(printf 'sbx-sandbox:0123abcd' | openssl dgst -sha256 -hmac api-token | sed 's/.*= *//')
[[ ${#want} == 64 ]] || {
    echo "FAIL: openssl gave no HMAC"
    exit 1
}
mkdir -p "$DEST/home"
# the library from the installed tree: consumer checks that is where its code came from
SBX_HOME="$DEST/home" LD_LIBRARY_PATH="$libdir" "$DEST/consumer" "$DEST" "$want"
