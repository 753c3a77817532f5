#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Fail on calls to functions sbx does not use (see ../shared/STYLE.md: unbounded writes, hidden state,
# unchecked number parsing, shell invocation). Matches `name(` as a whole word in code, ignoring
# comments and string literals. An exemption needs `/* banned-ok: reason */` on the same line.
# Use instead: snprintf / buf_printf, memcpy with explicit lengths, parse_u64 / parse_octal /
# parse_seconds_ms (src/common/strutil.h), posix_spawn.
set -euo pipefail
cd "$(dirname "$0")/.."

BANNED='sprintf|vsprintf|strcpy|strcat|strncpy|strncat|strtok|gets|system|atoi|atol|atoll|strtol|strtoul|strtoll|strtoull|sscanf'

mapfile -t files < <(find src bench fuzz tests/unit -type f \( -name '*.c' -o -name '*.h' \) \
    -not -path 'fuzz/corpus*' 2>/dev/null | sort)
if ((${#files[@]} == 0)); then
    echo "check-banned: no files" >&2
    exit 1
fi

# awk strips char literals, string literals and comments (block comments may span lines), then
# looks for a banned name followed by '('.
hits=$(awk -v banned="$BANNED" '
    FNR == 1 { in_comment = 0 }
    {
        raw = $0
        line = $0
        if (in_comment) {
            j = index(line, "*/")
            if (j == 0) next
            line = substr(line, j + 2)
            in_comment = 0
        }
        gsub(/\x27(\\.|[^\x27\\])+\x27/, "0", line)
        gsub(/"(\\.|[^"\\])*"/, "\"\"", line)
        while ((i = index(line, "/*")) > 0) {
            rest = substr(line, i + 2)
            j = index(rest, "*/")
            if (j == 0) {
                line = substr(line, 1, i - 1)
                in_comment = 1
                break
            }
            line = substr(line, 1, i - 1) " " substr(rest, j + 2)
        }
        if ((i = index(line, "//")) > 0)
            line = substr(line, 1, i - 1)
        if (line ~ ("(^|[^A-Za-z0-9_])(" banned ")[ \t]*\\(") && raw !~ /banned-ok:/)
            printf "%s:%d: %s\n", FILENAME, FNR, raw
    }' "${files[@]}")

if [[ -n "$hits" ]]; then
    printf '%s\n' "$hits"
    echo "check-banned: $(printf '%s\n' "$hits" | wc -l) banned call(s); use the safe helpers or" \
        "add /* banned-ok: reason */ on the line" >&2
    exit 1
fi
# Lifecycle states are enums with one string table each (src/control/states.h), never strings
# copied into fixed buffers: a new `char state[N]`-style field or local fails here.
states=$(grep -nE '\bchar[[:space:]]+(state|stage|desired)[[:space:]]*\[' "${files[@]}" || true)
if [[ -n "$states" ]]; then
    printf '%s\n' "$states"
    echo "check-banned: a lifecycle state held as a string; use the enums of src/control/states.h" >&2
    exit 1
fi
echo "check-banned: ${#files[@]} files ok"
