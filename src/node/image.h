/* SPDX-License-Identifier: MIT */
/* Images: a run's read-only root. An image is an OCI image layout (the on-disk format that
 * `skopeo copy ... oci:DIR:NAME` and scripts/build-image.sh write) in <images_dir>/<name>/:
 *
 *   oci-layout                 {"imageLayoutVersion": "1.0.0"}
 *   index.json                 a manifest whose org.opencontainers.image.ref.name is <name>
 *                              (or the index's only manifest when it names none)
 *   blobs/sha256/<hex>         manifest, config and layers (tar or tar+gzip), each checked
 *                              against its descriptor's sha256 digest and size
 *
 * image_resolve verifies the chain index -> manifest -> config + layers (digests, sizes, media
 * types, the config's diff_ids against the uncompressed layers, os and architecture) and
 * unpacks the layers once into <images_dir>/.rootfs/<manifest hex>/rootfs, keyed by the
 * manifest digest: a second resolve of the same manifest unpacks nothing. The unpacked tree is
 * made in a temporary directory and renamed into place, so it is either whole or absent.
 * Files keep the image's numeric owners (0..65535) as host ids; the runtime maps them into a
 * run (idmapped mounts). <images_dir>/.rootfs is 0700: the host's users never reach an image's
 * setuid files. Extended attributes (file capabilities, ACLs) in layers are not restored.
 *
 * Errors: -ENOENT unknown image, -EBADMSG a blob does not match its digest (or a layer its
 * diff_id), -EINVAL a malformed or unsupported layout, -EPERM a layer entry refused (path
 * traversal, absolute path, write through a symlink, device node, id above 65535), -EFBIG over
 * the size caps; `err` then holds one line saying which, beginning "image <name>: ". */
#pragma once

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cap/imagename.h"
#include "common/err.h"

#define IMAGE_DIGEST_MAX 72  /* "sha256:" + 64 hex + NUL */
#define IMAGE_LAYERS_MAX 128 /* layers in one manifest */
#define IMAGE_DEFAULT_DIR "/var/lib/sbx/images"
#define IMAGE_UNPACK_MAX (32ull << 30) /* bytes of regular files an image may unpack to */
#define IMAGE_ENTRIES_MAX 2000000      /* tar entries over all layers of one image */

typedef struct {
    char name[IMAGE_NAME_MAX];
    char digest[IMAGE_DIGEST_MAX]; /* the manifest's: "sha256:<64 hex>" */
    char rootfs[PATH_MAX];         /* <images_dir>/.rootfs/<hex>/rootfs, read-only by contract */
    uint64_t size;                 /* unpacked bytes (regular files' sizes) */
} image_t;

typedef enum {
    /* Hash every layer blob even when the manifest is unpacked already (a full check, as at
     * startup). Without it, an unpacked manifest costs only the index, manifest and config
     * checks: its rootfs was made from verified bytes. */
    IMAGE_VERIFY_ALL = 1 << 0,
} image_flags_t;

/* Verify image `name` of images_dir and make sure its rootfs is unpacked; *ret on success. */
int image_resolve(const char *images_dir, const char *name, unsigned flags, image_t *ret,
                  sbx_err_t *err);

/* Every image directory of images_dir, resolved with `flags`. Each entry says whether it
 * resolved (error == 0) or why not (error < 0, why). *ret is freed with free(). */
typedef struct {
    image_t img; /* img.name is set either way */
    int error;
    char why[256];
} image_entry_t;
int image_list(const char *images_dir, unsigned flags, image_entry_t **ret, size_t *ret_n);

/* ---- the node's image set (src/node/images.c) ---------------------------------------------
 * sbx-node verifies and unpacks every image of --images at startup (IMAGE_VERIFY_ALL) before it
 * registers, and rescans the directory every few seconds on a thread of its own (new images are
 * verified and unpacked; known manifests are re-checked cheaply). What it reports to the control
 * plane in registration and heartbeats is exactly the set that resolved: [{name, digest, size}].
 *
 * image_rootfs is what an install calls: the rootfs directory of image `name` on this node (and
 * its manifest digest when ret_digest is not NULL, IMAGE_DIGEST_MAX bytes). It answers from the
 * verified set, or resolves the image there and then (blocking: verify + unpack) when the set
 * does not hold it yet. -ENOENT/-EBADMSG/-EINVAL/-EPERM as image_resolve, with err set. Callable
 * from any thread. */
struct node;
int image_rootfs(struct node *n, const char *name, char *ret_path, size_t cap, char *ret_digest,
                 sbx_err_t *err);
int node_images_init(struct node *n); /* the startup scan; creates --images if missing */
int node_images_start(struct node *n);
void node_images_stop(struct node *n);
/* [{name, digest, size}] of the verified set (a new reference), for registration and
 * heartbeats. */
struct json_t;
struct json_t *node_images_json(struct node *n);
