#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install what building and testing sbx needs on Debian 12. Idempotent and quiet: it asks
# dpkg-query first and calls apt-get (update + install) only when something is missing.
set -euo pipefail

PACKAGES=(
    build-essential meson ninja-build pkg-config
    clang clang-format
    libsodium-dev libjansson-dev libseccomp-dev libcap-dev libsqlite3-dev sqlite3 musl-tools
    python3 python3-pytest python3-websockets
    curl openssl iproute2 procps
    libarchive-dev libssl-dev debootstrap
    e2fsprogs passt nftables util-linux
)

missing=()
for p in "${PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
    [[ "$status" == installed ]] || missing+=("$p")
done

# Node.js runs E2B's own SDK in the compatibility tests (tests/e2b): Debian's nodejs and npm
# unless a newer Node.js is installed already.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)

if ((${#missing[@]} > 0)); then
    echo "setup: installing ${missing[*]}"
    if ((EUID != 0)); then
        echo "setup: missing packages and not root; run: sudo apt-get install ${missing[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    echo "setup: done"
fi

# E2B's SDK, the version pinned in tests/e2b/package-lock.json (from the npm registry). Its
# engines (undici 7) need Node.js >= 20.18.1: Debian 12's own nodejs (18) is too old for it.
node_ok=$(node -e 'const [a, b, c] = process.versions.node.split(".").map(Number);
    console.log(a > 20 || (a === 20 && (b > 18 || (b === 18 && c >= 1))) ? 1 : 0)' 2>/dev/null || echo 0)
if [[ "$node_ok" != 1 ]]; then
    echo "setup: Node.js $(node --version 2>/dev/null || echo '(none)') is older than 20.18.1, which" \
        "E2B's SDK (tests/e2b, e2b@2.51.0) needs: its compatibility tests will fail until a" \
        "newer Node.js is on the PATH" >&2
fi
e2b_dir="$(dirname "$0")/../tests/e2b"
if [[ ! -f "$e2b_dir/node_modules/e2b/package.json" ]]; then
    echo "setup: installing E2B's SDK for the compatibility tests (npm ci in tests/e2b)"
    (cd "$e2b_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
