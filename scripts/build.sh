#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Configure (or reconfigure) and build build/: build/sbx-server and build/sbx-server-static.
# Fails when the stripped static server is larger than 1.5 MiB.
# BUILD_DIR overrides the directory (default build).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
MAX_STATIC=1572864 # 1.5 MiB

setup_args=("$BUILD_DIR")
[[ -f "$BUILD_DIR/build.ninja" ]] && setup_args=(--reconfigure "$BUILD_DIR")
if ! setup_log=$(meson setup "${setup_args[@]}" 2>&1); then
    printf '%s\n' "$setup_log" | tail -n 30 >&2
    exit 1
fi
ninja -C "$BUILD_DIR"

bin="$BUILD_DIR/sbx-server-static"
if [[ ! -x "$bin" ]]; then
    echo "build: $bin was not built (static_server=false?)" >&2
    exit 1
fi
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
strip -o "$tmp" "$bin"
size=$(stat -c %s "$tmp")
echo "build: $bin stripped size $size bytes (limit $MAX_STATIC)"
if ((size > MAX_STATIC)); then
    echo "build: $bin is larger than 1.5 MiB" >&2
    exit 1
fi
