#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Build the default sbx image: Debian 12 (bookworm) minbase plus python3 and ca-certificates,
# as an OCI image layout (oci-layout, index.json, blobs/sha256/...) with one gzip'd tar layer.
#
#   scripts/build-image.sh [--out DIR] [--name NAME]
#
# DIR is the images directory (default ${SBX_IMAGES:-/var/lib/sbx/images}); the layout goes to
# DIR/NAME (default name: debian), and its index names the manifest NAME
# (org.opencontainers.image.ref.name), which is what sbx-node looks for. Nothing is done when
# DIR/NAME already holds a layout for NAME. Needs root (debootstrap) and the Debian archive that
# apt already uses on this machine (read from /etc/apt/sources.list{,.d}); nothing else is
# fetched.
#
# The JSON is written here and digested with sha256sum rather than with umoci: an image of one
# layer needs four small documents, the result is byte-for-byte what we wrote (gzip -n, a sorted
# tar with numeric owners), and the build needs no tool beyond debootstrap, tar and coreutils.
set -euo pipefail

out=${SBX_IMAGES:-/var/lib/sbx/images}
name=debian
suite=bookworm
while (($#)); do
    case $1 in
    --out) out=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    -h | --help) sed -n '3,10p' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
    esac
done
if ! [[ $name =~ ^[a-z0-9][a-z0-9._-]{0,62}$ ]] || [[ $name == host ]]; then
    echo "build-image: --name: [a-z0-9][a-z0-9._-]*, at most 63 bytes, not \"host\"" >&2
    exit 2
fi
if ((EUID != 0)); then
    echo "build-image: needs root (debootstrap)" >&2
    exit 1
fi
dest=$out/$name
if [[ -f $dest/index.json ]] && grep -q "\"org.opencontainers.image.ref.name\": *\"$name\"" \
    "$dest/index.json"; then
    echo "build-image: $dest already holds image $name; nothing to do"
    exit 0
fi
if [[ -e $dest ]]; then
    echo "build-image: $dest exists and is not an image named $name; remove it first" >&2
    exit 1
fi

# The mirror apt uses for this suite: deb822 .sources files first, then one-line lists.
mirror=
for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    mirror=$(awk -v s="$suite" '
        /^[ \t]*$/ { if (u != "" && ok && deb) { print u; exit } u = ""; ok = 0; deb = 0; next }
        /^Types:/ { for (i = 2; i <= NF; i++) if ($i == "deb") deb = 1 }
        /^URIs:/ { u = $2 }
        /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) ok = 1 }
        END { if (u != "" && ok && deb) print u }' "$f" | head -n1)
    [[ -n $mirror ]] && break
done
if [[ -z $mirror ]]; then
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk -v s="$suite" '$1 == "deb" { u = $2; if (u ~ /^\[/) u = $3; for (i = 2; i <= NF; i++)
            if ($i == s) { print u; exit } }' | head -n1)
fi
if [[ -z $mirror ]]; then
    echo "build-image: no Debian $suite archive in /etc/apt/sources.list{,.d}" >&2
    exit 1
fi
command -v debootstrap >/dev/null || { echo "build-image: debootstrap missing (scripts/setup.sh)" >&2; exit 1; }

start=$(date +%s)
arch=$(dpkg --print-architecture)
mkdir -p "$out"
work=$(mktemp -d "$out/.build-$name.XXXXXX")
cleanup() {
    set +e # everything here runs, whatever fails
    # debootstrap mounts /proc and /sys in the target while it runs; never leave them behind
    findmnt -rn -o TARGET 2>/dev/null | grep -F "$work/" | sort -r | while read -r m; do
        umount -l "$m"
    done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT
root=$work/rootfs

echo "build-image: debootstrap --variant=minbase $suite from $mirror"
debootstrap --variant=minbase --arch="$arch" --include=python3,ca-certificates \
    "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
    tail -n 30 "$work/debootstrap.log" >&2
    exit 1
}

# What a run does not need, or must not take from the build host: package caches, apt lists,
# device nodes (the node gives each run its own /dev; sbx-node refuses device nodes in layers),
# the host's resolver and hostname.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
    "$root"/var/lib/apt/lists/* "$root"/var/log/* "$root"/tmp/* "$root"/var/tmp/* \
    "$root"/dev/* "$root"/run/*
rm -f "$root"/etc/resolv.conf "$root"/etc/hostname
echo sbx >"$root"/etc/hostname
: >"$root"/etc/resolv.conf

stage=$work/layout
blobs=$stage/blobs/sha256
mkdir -p "$blobs"
# One layer: a sorted tar with numeric owners, no xattrs; gzip -n keeps no name or time.
tar --numeric-owner --sort=name --format=gnu -C "$root" -cf "$work/layer.tar" .
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
gzip -n -6 <"$work/layer.tar" >"$work/layer.tar.gz"
rm -f "$work/layer.tar"
put_blob() { # file -> prints "digest size", moves the file into blobs/
    local d s
    d=$(sha256sum "$1" | cut -d' ' -f1)
    s=$(stat -c %s "$1")
    mv "$1" "$blobs/$d"
    echo "$d $s"
}
read -r layer_d layer_s < <(put_blob "$work/layer.tar.gz")

created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
printf '{"architecture":"%s","os":"linux","created":"%s","config":{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","LANG=C.UTF-8"],"Cmd":["/bin/bash"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"%s","created_by":"sbx scripts/build-image.sh: debootstrap --variant=minbase --include=python3,ca-certificates %s"}]}' \
    "$arch" "$created" "$diff_id" "$created" "$suite" >"$work/config.json"
read -r config_d config_s < <(put_blob "$work/config.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$config_d" "$config_s" "$layer_d" "$layer_s" >"$work/manifest.json"
read -r man_d man_s < <(put_blob "$work/manifest.json")

printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name": "%s"}}]}\n' \
    "$man_d" "$man_s" "$name" >"$stage/index.json"
printf '{"imageLayoutVersion":"1.0.0"}\n' >"$stage/oci-layout"
chmod -R go-w "$stage"
mv -T "$stage" "$dest" # atomic: a reader sees no layout or a whole one

end=$(date +%s)
echo "build-image: $dest: image $name, manifest sha256:$man_d"
echo "build-image: layer $((layer_s / 1024 / 1024)) MiB gzip'd, rootfs $(du -sm "$root" | cut -f1) MiB unpacked, $((end - start)) s"
