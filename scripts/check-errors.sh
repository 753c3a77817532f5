#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The error contract's checks (docs/style.md, "Errors"):
# - an HTTP status is written as a number only in src/http/status.{c,h} (the status table, the
#   errno table and the error helpers); elsewhere it is a name (HTTP_NOT_FOUND) or a helper
#   (http_not_found(c, flags, ...)). Flagged: a 4xx/5xx number among a call's arguments where
#   the call answers or fails (…respond…, …error…, …fail…, …answer…, refuse, …begin…), on a
#   line that names a status, returned, in a ternary, or in a { "name", status } table row;
# - the connection is closed by the helpers' HTTP_CLOSE flag: `keep_alive = false` outside the
#   HTTP core (src/http/) is flagged;
# - conn_respond_error is gone (the helpers replace it).
# Code only: comments and string literals are stripped first. The client side (src/lib,
# src/cli) reads statuses and is not checked. An exemption: `/* status-ok: reason */` on the
# line. Lifecycle states held as strings are check-banned.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t files < <(find src -type f \( -name '*.c' -o -name '*.h' \) -not -path 'src/lib/*' \
    -not -path 'src/cli/*' -not -path 'src/http/status.c' -not -path 'src/http/status.h' | sort)

hits=$(awk '
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
        if (raw ~ /status-ok:/)
            next
        st = "(^|[^A-Za-z0-9_.])[45][0-9][0-9]($|[^A-Za-z0-9_.])"
        why = ""
        if (line ~ ("[A-Za-z_]*(respond|error|fail|answer|refuse|begin)[A-Za-z_]*[ \t]*\\([^;]*" st))
            why = "a status number in an answer"
        else if (line ~ ("(^|[^A-Za-z_])status([^A-Za-z_]|$)") && line ~ st)
            why = "a status number"
        else if (line ~ ("return[ \t]+[45][0-9][0-9][ \t]*;") || line ~ ("[?:][ \t]*[45][0-9][0-9]([^0-9]|$)"))
            why = "a status number"
        else if (line ~ ("\\{[ \t]*\"\"[ \t]*,[ \t]*[45][0-9][0-9][ \t]*\\}"))
            why = "a status number in a table"
        else if (line ~ /keep_alive[ \t]*=[ \t]*false/ && FILENAME !~ /^src\/http\//)
            why = "keep_alive = false outside the HTTP core (use HTTP_CLOSE)"
        else if (line ~ /conn_respond_error[ \t]*\(/)
            why = "conn_respond_error (use the http_* helpers of src/http/status.h)"
        if (why != "")
            printf "%s:%d: %s: %s\n", FILENAME, FNR, why, raw
    }' "${files[@]}")

if [[ -n "$hits" ]]; then
    printf '%s\n' "$hits"
    echo "check-errors: $(printf '%s\n' "$hits" | wc -l) line(s); write statuses by name" \
        "(src/http/status.h) or add /* status-ok: reason */ on the line" >&2
    exit 1
fi
echo "check-errors: ${#files[@]} files ok"
