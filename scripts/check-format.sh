#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fail when a C file under src/ tests/unit/ fuzz/ bench/ (or at the top) differs from what
# .clang-format asks.
# `scripts/check-format.sh --fix` rewrites the files in place instead.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t files < <({
    find src tests/unit fuzz bench -type f \( -name '*.c' -o -name '*.h' \) -not -path 'fuzz/corpus*'
    find . -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' \)
} 2>/dev/null | sort)
if ((${#files[@]} == 0)); then
    echo "check-format: no files" >&2
    exit 1
fi
if [[ "${1:-}" == --fix ]]; then
    clang-format -i "${files[@]}"
    exit 0
fi
if ! out=$(clang-format --dry-run --Werror "${files[@]}" 2>&1); then
    printf '%s\n' "$out" | head -n 60 || true
    bad=$(printf '%s\n' "$out" | grep -oE '^[^:]+\.[ch]:' | sort -u | tr -d ':' | tr '\n' ' ' || true)
    echo "check-format: not formatted: $bad" >&2
    echo "check-format: run scripts/check-format.sh --fix (clang-format $(clang-format --version | grep -oE '[0-9]+\.[0-9.]+' | head -1))" >&2
    exit 1
fi
echo "check-format: ${#files[@]} files ok"
