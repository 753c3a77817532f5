/* SPDX-License-Identifier: MIT */
/* A run's disk: its root is a file system of its own, of the flavor's size, in a sparse image
 * file in the run's directory (`disk.img`, ext4, made by mkfs.ext4 with its root directory
 * owned by the run's root), mounted (loop device, no setuid, no devices) on `root/` in the
 * host's mount namespace for as long as the node keeps the run's record. A run that fills it
 * gets ENOSPC; the node's own disk is not touched beyond the image's size. Sparse files stay
 * sparse: only written blocks take space on the host, and moves carry them sparse. A tenant
 * never writes the image file itself (it sits in a 0700 directory of the node), only files
 * through the mounted file system. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

/* Make a fresh image of `bytes` at img (replacing none: -EEXIST if it exists) whose root
 * directory belongs to uid/gid owner. Blocking (mkfs): an install thread's work. */
int disk_create(const char *img, uint64_t bytes, uint32_t owner, sbx_err_t *err);
/* Mount img on dir unless something is mounted there already (0 either way). */
int disk_mount(const char *img, const char *dir, sbx_err_t *err);
/* Detach whatever is mounted on dir (lazily: a run still holding it keeps it until it ends);
 * 0 if nothing was mounted. */
int disk_umount(const char *dir);
/* What img may still take of the node's disk as its run writes: its size less the blocks it
 * holds; `absent` when there is no image (yet). */
uint64_t disk_unwritten(const char *img, uint64_t absent);
/* Whether a file system other than its parent's is mounted on dir. */
bool disk_is_mounted(const char *dir);
