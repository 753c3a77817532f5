/* SPDX-License-Identifier: MIT */
#include "disk.h"

#include <fcntl.h>
#include <linux/loop.h>
#include <spawn.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "common/macro.h"

extern char **environ;

bool disk_is_mounted(const char *dir)
{
    char parent[4096];
    struct stat a, b;
    if (snprintf(parent, sizeof parent, "%s/..", dir) >= (int)sizeof parent)
        return false;
    return lstat(dir, &a) == 0 && lstat(parent, &b) == 0 && S_ISDIR(a.st_mode) &&
           a.st_dev != b.st_dev;
}

uint64_t disk_unwritten(const char *img, uint64_t absent)
{
    struct stat st;
    if (lstat(img, &st) < 0 || !S_ISREG(st.st_mode))
        return absent;
    uint64_t held = (uint64_t)st.st_blocks * 512;
    return (uint64_t)st.st_size > held ? (uint64_t)st.st_size - held : 0;
}

int disk_create(const char *img, uint64_t bytes, uint32_t owner, sbx_err_t *err)
{
    _cleanup_close_ int fd = open(img, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        int r = negative_errno();
        return sbx_err(err, r, "disk image: %s", strerror(-r));
    }
    if (ftruncate(fd, (off_t)bytes) < 0) {
        int r = negative_errno();
        (void)unlink(img);
        return sbx_err(err, r, "disk image of %llu bytes: %s", (unsigned long long)bytes,
                       strerror(-r));
    }
    char ext[96];
    (void)snprintf(ext, sizeof ext, "lazy_itable_init=1,lazy_journal_init=1,root_owner=%u:%u",
                   owner, owner);
    /* -m 0: no blocks reserved for root (root of the run is its only user) */
    char *const argv[] = { "/sbin/mkfs.ext4", "-q", "-F", "-m", "0", "-E", ext, (char *)img, NULL };
    pid_t pid;
    int r = posix_spawn(&pid, argv[0], NULL, NULL, argv, environ);
    int st = 0;
    if (r == 0)
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
    if (r != 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        (void)unlink(img);
        return sbx_err(err, r ? -r : -EIO, "mkfs.ext4 failed (%s, status 0x%x)",
                       r ? strerror(r) : "ran", st);
    }
    return 0;
}

int disk_mount(const char *img, const char *dir, sbx_err_t *err)
{
    if (disk_is_mounted(dir))
        return 0;
    _cleanup_close_ int file = open(img, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (file < 0) {
        int r = negative_errno();
        return sbx_err(err, r, "disk image: %s", strerror(-r));
    }
    _cleanup_close_ int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0) {
        int r = negative_errno();
        return sbx_err(err, r, "/dev/loop-control: %s", strerror(-r));
    }
    /* another process may take the free device first: try the next one */
    for (int attempt = 0; attempt < 16; attempt++) {
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0)
            break;
        char dev[32];
        (void)snprintf(dev, sizeof dev, "/dev/loop%d", n);
        _cleanup_close_ int lfd = open(dev, O_RDWR | O_CLOEXEC);
        if (lfd < 0)
            continue;
        /* AUTOCLEAR: the device lets go of the image when its last mount is gone */
        struct loop_config cfg = { .fd = (uint32_t)file,
                                   .info = { .lo_flags = LO_FLAGS_AUTOCLEAR } };
        if (ioctl(lfd, LOOP_CONFIGURE, &cfg) < 0) {
            if (errno == EBUSY)
                continue;
            break;
        }
        if (mount(dev, dir, "ext4", MS_NOSUID | MS_NODEV, "") < 0) {
            int r = negative_errno();
            (void)ioctl(lfd, LOOP_CLR_FD, 0);
            return sbx_err(err, r, "mount of the run's disk: %s", strerror(-r));
        }
        return 0;
    }
    int r = errno ? -errno : -EBUSY;
    return sbx_err(err, r, "no loop device for the run's disk: %s", strerror(-r));
}

int disk_umount(const char *dir)
{
    if (!disk_is_mounted(dir))
        return 0;
    return umount2(dir, MNT_DETACH) < 0 ? negative_errno() : 0;
}
