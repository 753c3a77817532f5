/* SPDX-License-Identifier: MIT */
#include "substrate.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/close_range.h>
#include <linux/openat2.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/strutil.h"
#include "isolation/userns.h"

/* The host's programs, shown read-only in every run of the host image, and the merged-/usr
 * names that are links to them on current systems (made as links) or directories on older ones
 * (bound read-only). Never the host's /etc: a run gets an /etc of its own. */
static const char *const usr_links[] = { "bin", "sbin", "lib", "lib32", "lib64", "libx32" };
static const char *const dev_nodes[] = { "null", "zero", "full", "random", "urandom", "tty" };
#define N_LINKS ELEMENTSOF(usr_links)
#define N_DEV ELEMENTSOF(dev_nodes)

/* /proc entries no run reads (the OCI runtime default list and the kernel's page and symbol
 * tables): files get /dev/null bound over them, directories an empty read-only tmpfs. */
static const char *const proc_masked_files[] = {
    "kcore",         "keys",        "key-users",     "kallsyms",     "kmsg",        "kpagecount",
    "kpageflags",    "kpagecgroup", "latency_stats", "timer_list",   "timer_stats", "sched_debug",
    "sysrq-trigger", "vmallocinfo", "slabinfo",      "pagetypeinfo", "config.gz",   "buddyinfo",
    "zoneinfo",      "iomem",       "ioports",       "mtrr",
};
static const char *const proc_masked_dirs[] = { "acpi",   "asound",     "scsi",
                                                "driver", "tty/driver", "dynamic_debug" };
/* ... and these stay visible but read-only (their writes change the host's kernel) */
static const char *const proc_readonly[] = { "sys", "bus", "fs", "irq" };

typedef enum {
    ST_PRIVATE,
    ST_CGROUP,
    ST_CGROUPNS,
    ST_NETWORK,
    ST_IMAGE,
    ST_ROOT,
    ST_USR,
    ST_PROC,
    ST_MASK,
    ST_DEV,
    ST_AGENT,
    ST_SYS,
    ST_PIVOT,
    ST_HOSTNAME,
    ST_USERNS,
    ST_TREE,
    ST_STDIO,
    ST_CAPS,
    ST_NNP,
    ST_SECCOMP,
    ST_EXEC,
    ST_MAX_
} step_t;

static const char *const step_names[ST_MAX_] = {
    [ST_PRIVATE] = "make mounts private",
    [ST_CGROUP] = "join cgroups",
    [ST_CGROUPNS] = "cgroup namespace",
    [ST_NETWORK] = "loopback and network sysctls",
    [ST_IMAGE] = "image overlay",
    [ST_ROOT] = "bind the run root",
    [ST_USR] = "host programs read-only",
    [ST_PROC] = "mount /proc",
    [ST_MASK] = "mask /proc",
    [ST_DEV] = "populate /dev",
    [ST_AGENT] = "mount the agent",
    [ST_SYS] = "pool host cgroup subtree",
    [ST_PIVOT] = "pivot_root",
    [ST_HOSTNAME] = "set hostname",
    [ST_USERNS] = "enter the run's user namespace",
    [ST_TREE] = "make /tmp, /etc and homes",
    [ST_STDIO] = "set up stdio and fds",
    [ST_CAPS] = "drop capabilities",
    [ST_NNP] = "no new privileges",
    [ST_SECCOMP] = "seccomp profile",
    [ST_EXEC] = "exec",
};

/* Every host-side string the child needs, built before clone(): the child only makes system
 * calls (and formats small numbers). */
typedef struct {
    char link_target[N_LINKS][PATH_MAX];
    bool link_is_dir[N_LINKS], link_present[N_LINKS];
    char exe[PATH_MAX];
    char overlay_opts[3 * PATH_MAX + 64];
} paths_t;

static int build_paths(const substrate_spec_t *sp, paths_t *p)
{
    for (size_t i = 0; i < N_LINKS; i++) {
        char src[32];
        struct stat st;
        (void)snprintf(src, sizeof src, "/%s", usr_links[i]);
        p->link_present[i] = lstat(src, &st) == 0;
        p->link_is_dir[i] = p->link_present[i] && S_ISDIR(st.st_mode);
        if (p->link_present[i] && S_ISLNK(st.st_mode)) {
            ssize_t n = readlink(src, p->link_target[i], PATH_MAX - 1);
            if (n <= 0)
                p->link_present[i] = false;
            else
                p->link_target[i][n] = 0;
        } else if (p->link_is_dir[i])
            memcpy(p->link_target[i], src, strlen(src) + 1);
    }
    if (sp->image_rootfs) {
        int n = snprintf(p->overlay_opts, sizeof p->overlay_opts,
                         "lowerdir=%s,upperdir=%s/upper,workdir=%s/work", sp->lower_mnt, sp->root,
                         sp->root);
        if (n < 0 || n >= (int)sizeof p->overlay_opts)
            return -ENAMETOOLONG;
    }
    const char *a0 = sp->argv[0];
    const char *exe = streq(a0, "sbx-server") ? SUBSTRATE_AGENT_PATH : a0;
    if (strlen(exe) >= PATH_MAX)
        return -ENAMETOOLONG;
    memcpy(p->exe, exe, strlen(exe) + 1);
    return 0;
}

/* ---- the child: a flat list of fail-closed steps, system calls only ----------------------- */

/* "/proc/self/fd/N[/rel]": a mount target or source reached through a descriptor, never
 * through a path the tenant could have changed. */
static const char *fdpath(char *buf, size_t cap, int fd, const char *rel)
{
    char digits[16];
    int n = 0;
    unsigned v = (unsigned)fd;
    do
        digits[n++] = (char)('0' + v % 10);
    while ((v /= 10) && n < (int)sizeof digits);
    static const char pre[] = "/proc/self/fd/";
    size_t k = sizeof pre - 1, rl = rel ? strlen(rel) : 0;
    if (k + (size_t)n + 1 + rl + 1 > cap)
        return "/nonexistent";
    memcpy(buf, pre, k);
    while (n)
        buf[k++] = digits[--n];
    if (rel) {
        buf[k++] = '/';
        memcpy(buf + k, rel, rl);
        k += rl;
    }
    buf[k] = 0;
    return buf;
}

#define BENEATH (RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)

static int open_beneath(int dirfd, const char *rel, int flags, mode_t mode)
{
    struct open_how how = { .flags = (uint64_t)(flags | O_CLOEXEC),
                            .mode = mode,
                            .resolve = BENEATH };
    return (int)syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
}

/* mkdir -p rel beneath rootfd, refusing a symlink or anything but a directory at every
 * component; returns an O_PATH fd of the last directory. */
static int mkdirs_beneath(int rootfd, const char *rel, mode_t mode)
{
    char comp[NAME_MAX + 1];
    int cur = -1;
    const char *p = rel;
    while (*p) {
        size_t n = strcspn(p, "/");
        if (n == 0 || n > NAME_MAX) {
            errno = EINVAL;
            goto fail;
        }
        memcpy(comp, p, n);
        comp[n] = 0;
        int at = cur >= 0 ? cur : rootfd;
        if (mkdirat(at, comp, mode) < 0 && errno != EEXIST)
            goto fail;
        int nfd = open_beneath(at, comp, O_PATH | O_DIRECTORY, 0);
        if (nfd < 0)
            goto fail;
        if (cur >= 0)
            close(cur);
        cur = nfd;
        p += n;
        while (*p == '/')
            p++;
    }
    return cur;
fail:
    if (cur >= 0) {
        int e = errno;
        close(cur);
        errno = e;
    }
    return -1;
}

/* A regular file at dir/name to mount over (created empty if missing; a link or anything but
 * a regular file is refused). Returns an O_PATH fd. */
static int file_beneath(int dirfd, const char *name)
{
    int fd = open_beneath(dirfd, name, O_PATH, 0);
    if (fd < 0 && errno == ENOENT) {
        int c = openat(dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (c < 0 && errno != EEXIST)
            return -1;
        if (c >= 0)
            close(c);
        fd = open_beneath(dirfd, name, O_PATH, 0);
    }
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EEXIST;
        return -1;
    }
    return fd;
}

/* The mount API's constants (<linux/mount.h> clashes with <sys/mount.h> in this libc). */
#define SBX_OPEN_TREE_CLONE 1
#define SBX_MOVE_MOUNT_F_EMPTY_PATH 0x4
#define SBX_MOVE_MOUNT_T_EMPTY_PATH 0x40
#define SBX_MOUNT_ATTR_RDONLY 0x1
#define SBX_MOUNT_ATTR_NOSUID 0x2
#define SBX_MOUNT_ATTR_NODEV 0x4
#define SBX_MOUNT_ATTR_IDMAP 0x100000
struct sbx_mount_attr {
    uint64_t attr_set, attr_clr, propagation, userns_fd;
};

/* A read-only, no-setuid, no-device copy of the host tree at src (with its submounts), attached
 * on the object behind fd: made detached (open_tree), made read-only as a whole
 * (mount_setattr, recursive), then moved onto the mount point by descriptor. */
/* pin: when not NULL, the object opened must be that file (device and inode), or EXDEV. */
static int bind_ro_pinned(const char *src, int fd, bool rec, const struct stat *pin)
{
    int t = (int)syscall(SYS_open_tree, AT_FDCWD, src,
                         SBX_OPEN_TREE_CLONE | O_CLOEXEC | (rec ? AT_RECURSIVE : 0));
    if (t < 0)
        return -1;
    struct stat st;
    int r = 0;
    if (pin && (fstat(t, &st) < 0 || st.st_dev != pin->st_dev || st.st_ino != pin->st_ino)) {
        r = -1;
        errno = EXDEV;
    }
    struct sbx_mount_attr a = { .attr_set = SBX_MOUNT_ATTR_RDONLY | SBX_MOUNT_ATTR_NOSUID |
                                            SBX_MOUNT_ATTR_NODEV };
    if (r >= 0)
        r = (int)syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH | (rec ? AT_RECURSIVE : 0), &a,
                         sizeof a);
    if (r >= 0)
        r = (int)syscall(SYS_move_mount, t, "", fd, "",
                         SBX_MOVE_MOUNT_F_EMPTY_PATH | SBX_MOVE_MOUNT_T_EMPTY_PATH);
    int e = errno;
    close(t);
    errno = e;
    return r < 0 ? -1 : 0;
}

static int bind_ro_fd(const char *src, int fd, bool rec)
{
    return bind_ro_pinned(src, fd, rec, NULL);
}

/* The run's root from an image: the image's rootfs, read-only and seen through the run's id
 * mapping (its root-owned files belong to the run's root), under the run's own writable layer
 * (upper/ on the run's disk; what pause keeps and move carries). Both paths are the node's. */
static int mount_image(const substrate_spec_t *sp, const paths_t *p)
{
    int t = (int)syscall(SYS_open_tree, AT_FDCWD, sp->image_rootfs,
                         SBX_OPEN_TREE_CLONE | O_CLOEXEC | AT_RECURSIVE);
    if (t < 0)
        return -1;
    struct sbx_mount_attr a = { .attr_set = SBX_MOUNT_ATTR_IDMAP | SBX_MOUNT_ATTR_RDONLY |
                                            SBX_MOUNT_ATTR_NOSUID | SBX_MOUNT_ATTR_NODEV,
                                .userns_fd = (uint64_t)sp->userns_fd };
    int r = (int)syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH | AT_RECURSIVE, &a, sizeof a);
    if (r >= 0)
        r = (int)syscall(SYS_move_mount, t, "", AT_FDCWD, sp->lower_mnt,
                         SBX_MOVE_MOUNT_F_EMPTY_PATH);
    int e = errno;
    close(t);
    errno = e;
    if (r < 0)
        return -1;
    return mount("overlay", sp->root, "overlay", MS_NOSUID | MS_NODEV, p->overlay_opts);
}

static int mount_at(int dirfd, const char *rel, const char *fstype, unsigned long flags,
                    const char *data)
{
    int fd = mkdirs_beneath(dirfd, rel, 0755);
    if (fd < 0)
        return -1;
    char t[64];
    int r = mount(fstype, fdpath(t, sizeof t, fd, NULL), fstype, flags, data);
    int e = errno;
    close(fd);
    errno = e;
    return r;
}

/* The run's loopback, up, and the network settings a root in the run cannot make itself (its
 * network namespace belongs to the host's user namespace): binding low ports and ICMP echo
 * sockets for every id of the run. */
static int setup_network(void)
{
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = { .ifr_name = "lo" };
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
        return -1;
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
        return -1;
    close(s);
    static const char *const sysctls[][2] = {
        { "/proc/sys/net/ipv4/ip_unprivileged_port_start", "0" },
        { "/proc/sys/net/ipv4/ping_group_range", "0 2147483647" },
    };
    for (size_t i = 0; i < ELEMENTSOF(sysctls); i++) {
        int fd = open(sysctls[i][0], O_WRONLY | O_CLOEXEC);
        if (fd < 0)
            return -1;
        ssize_t n = write(fd, sysctls[i][1], strlen(sysctls[i][1]));
        close(fd);
        if (n < 0)
            return -1;
    }
    return 0;
}

/* The host's programs (the "host" image): /usr read-only, the merged-/usr links. */
static int mount_usr(int rootfd, const paths_t *p)
{
    int fd = mkdirs_beneath(rootfd, "usr", 0755);
    if (fd < 0)
        return -1;
    int r = bind_ro_fd("/usr", fd, true);
    close(fd);
    if (r < 0)
        return -1;
    for (size_t i = 0; i < N_LINKS; i++) {
        if (!p->link_present[i])
            continue;
        if (p->link_is_dir[i]) {
            int d = mkdirs_beneath(rootfd, usr_links[i], 0755);
            if (d < 0)
                return -1;
            r = bind_ro_fd(p->link_target[i], d, true);
            close(d);
            if (r < 0)
                return -1;
        } else if (symlinkat(p->link_target[i], rootfd, usr_links[i]) < 0 && errno != EEXIST)
            return -1;
    }
    return 0;
}

/* The run's own /proc (its pid namespace only; a pool host's with hidepid, so that sandboxes
 * see only their own processes), then the masks over it. */
static int mount_proc(int rootfd, bool pool_host, step_t *st)
{
    *st = ST_PROC;
    if (mount_at(rootfd, "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                 pool_host ? "hidepid=invisible" : NULL) < 0)
        return -1;
    *st = ST_MASK;
    int procfd = open_beneath(rootfd, "proc", O_PATH | O_DIRECTORY, 0);
    if (procfd < 0)
        return -1;
    char t[PATH_MAX];
    int r = 0;
    for (size_t i = 0; i < ELEMENTSOF(proc_masked_files) && r >= 0; i++) {
        fdpath(t, sizeof t, procfd, proc_masked_files[i]);
        if (mount("/dev/null", t, NULL, MS_BIND, NULL) < 0) {
            if (errno == ENOENT)
                continue; /* not on this kernel */
            r = -1;
        } else
            r = mount(NULL, t, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL);
    }
    for (size_t i = 0; i < ELEMENTSOF(proc_masked_dirs) && r >= 0; i++) {
        fdpath(t, sizeof t, procfd, proc_masked_dirs[i]);
        if (mount("tmpfs", t, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                  "size=0,mode=0555") < 0 &&
            errno != ENOENT)
            r = -1;
    }
    for (size_t i = 0; i < ELEMENTSOF(proc_readonly) && r >= 0; i++) {
        fdpath(t, sizeof t, procfd, proc_readonly[i]);
        if (mount(t, t, NULL, MS_BIND | MS_REC, NULL) < 0) {
            if (errno == ENOENT)
                continue;
            r = -1;
        } else
            r = mount(NULL, t, NULL,
                      MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    }
    int e = errno;
    close(procfd);
    errno = e;
    return r;
}

/* A few harmless device nodes, never the host's /dev; a pty instance of the run's own. */
static int mount_dev(int rootfd)
{
    if (mount_at(rootfd, "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m") < 0)
        return -1;
    int devfd = open_beneath(rootfd, "dev", O_PATH | O_DIRECTORY, 0);
    if (devfd < 0)
        return -1;
    char t[64], src[32];
    int r = 0;
    for (size_t i = 0; i < N_DEV && r >= 0; i++) {
        int f = file_beneath(devfd, dev_nodes[i]);
        if (f < 0) {
            r = -1;
            break;
        }
        memcpy(src, "/dev/", 5);
        memcpy(src + 5, dev_nodes[i], strlen(dev_nodes[i]) + 1);
        r = mount(src, fdpath(t, sizeof t, f, NULL), NULL, MS_BIND, NULL);
        close(f);
    }
    if (r >= 0)
        r = mount_at(devfd, "shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m");
    if (r >= 0)
        r = mount_at(devfd, "pts", "devpts", MS_NOSUID | MS_NOEXEC,
                     "newinstance,ptmxmode=0666,mode=0620");
    static const char *const links[][2] = {
        { "pts/ptmx", "ptmx" },          { "/proc/self/fd", "fd" },
        { "/proc/self/fd/0", "stdin" },  { "/proc/self/fd/1", "stdout" },
        { "/proc/self/fd/2", "stderr" },
    };
    for (size_t i = 0; i < ELEMENTSOF(links) && r >= 0; i++)
        if (symlinkat(links[i][0], devfd, links[i][1]) < 0)
            r = -1;
    /* the tmpfs is done: nothing in the run may add to it */
    if (r >= 0)
        r = mount(NULL, fdpath(t, sizeof t, devfd, NULL), NULL,
                  MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m");
    int e = errno;
    close(devfd);
    errno = e;
    return r;
}

/* A pool host's /sys: an empty read-only tmpfs holding only its own cgroup directories (the
 * node delegated them to the run's root), so it nests its sandboxes' cgroups in its own and
 * sees no other cgroup and nothing of the host's devices. */
static int mount_pool_sys(int rootfd, const substrate_spec_t *sp)
{
    if (mount_at(rootfd, "sys", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k") <
        0)
        return -1;
    int sysfd = open_beneath(rootfd, "sys", O_PATH | O_DIRECTORY, 0);
    if (sysfd < 0)
        return -1;
    int r = 0;
    char t[PATH_MAX];
    for (size_t i = 0; sp->cgroup_dirs && sp->cgroup_dirs[i] && r >= 0; i++) {
        char rel[64];
        int n = snprintf(rel, sizeof rel, "fs/cgroup/%s", sp->cgroup_names[i]);
        int d = n > 0 && n < (int)sizeof rel ? mkdirs_beneath(sysfd, rel, 0755) : -1;
        if (d < 0) {
            r = -1;
            break;
        }
        r = mount(sp->cgroup_dirs[i], fdpath(t, sizeof t, d, NULL), NULL, MS_BIND, NULL);
        close(d);
    }
    if (r >= 0)
        r = mount(NULL, fdpath(t, sizeof t, sysfd, NULL), NULL,
                  MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k");
    int e = errno;
    close(sysfd);
    errno = e;
    return r;
}

static int child_mounts(const substrate_spec_t *sp, const paths_t *p, int *ret_rootfd, step_t *st)
{
    *st = ST_ROOT; /* a mount point of its own, so that pivot_root can move it; no setuid files
                    * and no device nodes from the tenant's tree */
    if (mount(sp->root, sp->root, NULL, MS_BIND, NULL) < 0 ||
        mount(NULL, sp->root, NULL, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV, NULL) < 0)
        return -1;
    int rootfd = open(sp->root, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rootfd < 0)
        return -1;
    *ret_rootfd = rootfd;
    *st = ST_USR;
    if (!sp->image_rootfs && mount_usr(rootfd, p) < 0)
        return -1;
    if (mount_proc(rootfd, sp->pool_host, st) < 0)
        return -1;
    *st = ST_DEV;
    if (mount_dev(rootfd) < 0)
        return -1;
    *st = ST_AGENT; /* the agent binary, read-only: the run cannot replace what the node
                     * verifies as the bridge's executable */
    int bin = mkdirs_beneath(rootfd, ".sbx/bin", 0755);
    int f = bin >= 0 ? file_beneath(bin, "sbx-server") : -1;
    if (bin >= 0)
        close(bin);
    if (f < 0)
        return -1;
    /* the very file the node pinned (its device and inode), checked on the mount it binds */
    struct stat pin = { .st_dev = sp->agent_dev, .st_ino = sp->agent_ino };
    int r = bind_ro_pinned(sp->agent_bin, f, false, &pin);
    close(f);
    if (r < 0)
        return -1;
    if (sp->pool_host) {
        *st = ST_SYS;
        if (mount_pool_sys(rootfd, sp) < 0)
            return -1;
    }
    return 0;
}

/* What a fresh tree needs, made by the run's own root inside its namespaces (so a link the
 * tenant left can only lead somewhere the tenant could write anyway). Existing entries are
 * kept as they are: a kept or moved root is the tenant's. */
static int write_new(const char *path, const char *data, size_t len, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return errno == EEXIST ? 0 : -1;
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            return -1;
        }
        data += n;
        len -= (size_t)n;
    }
    close(fd);
    return 0;
}

static int mkdir_new(const char *path, mode_t mode)
{
    if (mkdir(path, mode) < 0)
        return errno == EEXIST ? 0 : -1;
    return chmod(path, mode); /* past the umask: /tmp is 1777 */
}

static int make_tree(const substrate_spec_t *sp)
{
    static const struct {
        const char *path;
        mode_t mode;
    } dirs[] = { { "/tmp", 01777 },     { "/root", 0700 }, { "/home", 0755 }, { "/var", 0755 },
                 { "/var/tmp", 01777 }, { "/run", 0755 },  { "/etc", 0755 } };
    for (size_t i = 0; i < ELEMENTSOF(dirs); i++)
        if (mkdir_new(dirs[i].path, dirs[i].mode) < 0)
            return -1;
    static const char passwd[] = "root:x:0:0:root:/root:/bin/sh\n"
                                 "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    static const char group[] = "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n";
    static const char nss[] = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n";
    static const char hosts[] = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n";
    int r = 0;
    r |= write_new("/etc/passwd", passwd, sizeof passwd - 1, 0644);
    r |= write_new("/etc/group", group, sizeof group - 1, 0644);
    r |= write_new("/etc/nsswitch.conf", nss, sizeof nss - 1, 0644);
    r |= write_new("/etc/hosts", hosts, sizeof hosts - 1, 0644);
    r |= write_new("/etc/hostname", sp->hostname, strlen(sp->hostname), 0644);
    const char *rc = sp->resolv_conf ? sp->resolv_conf : "";
    r |= write_new("/etc/resolv.conf", rc, strlen(rc), 0644);
    if (sp->etc_ld_cache)
        r |= write_new("/etc/ld.so.cache", sp->etc_ld_cache, sp->etc_ld_cache_len, 0644);
    return r < 0 ? -1 : 0;
}

/* Inside its user namespace root holds capabilities over the run's own files and processes
 * only; the bounding set narrows even that to what a program running as root ordinarily needs,
 * the set container runtimes keep by default: file ownership and modes (CHOWN, DAC_OVERRIDE,
 * FOWNER, FSETID), uids and gids (SETUID, SETGID), signals (KILL), ports below 1024
 * (NET_BIND_SERVICE), chroot (SYS_CHROOT) and audit records (AUDIT_WRITE, refused anyway
 * outside the initial user namespace). A pool host also keeps what packing sandboxes takes:
 * network namespaces per sandbox and their loopback (SYS_ADMIN, NET_ADMIN over namespaces it
 * makes itself), reading its sandboxes' /proc entries (SYS_PTRACE, DAC_READ_SEARCH). Every
 * other capability leaves the bounding set, so no exec inside the run gets it back. */
static int drop_caps(bool pool_host)
{
    uint64_t keep = (1ULL << CAP_CHOWN) | (1ULL << CAP_DAC_OVERRIDE) | (1ULL << CAP_FOWNER) |
                    (1ULL << CAP_FSETID) | (1ULL << CAP_KILL) | (1ULL << CAP_SETGID) |
                    (1ULL << CAP_SETUID) | (1ULL << CAP_NET_BIND_SERVICE) |
                    (1ULL << CAP_SYS_CHROOT) | (1ULL << CAP_AUDIT_WRITE);
    if (pool_host)
        keep |= (1ULL << CAP_SYS_ADMIN) | (1ULL << CAP_NET_ADMIN) | (1ULL << CAP_SYS_PTRACE) |
                (1ULL << CAP_DAC_READ_SEARCH);
    for (int c = 0; c < 64; c++) {
        if (keep & (1ULL << c))
            continue;
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
            return -1; /* EINVAL: beyond this kernel's last capability */
    }
    return 0;
}

_noreturn_ static void child_main(const substrate_spec_t *sp, const paths_t *p, int errfd, int gofd)
{
    step_t st = ST_PRIVATE;
    int rootfd = -1;
    /* Nothing before the node has recorded this process: EOF (the node died, or refused) ends
     * it here, before it has done anything. */
    char go;
    ssize_t k;
    do
        k = read(gofd, &go, 1);
    while (k < 0 && errno == EINTR);
    if (k != 1)
        _exit(126);
    close(gofd);
    sigset_t none;
    sigemptyset(&none);
    (void)sigprocmask(SIG_SETMASK, &none, NULL); /* the node blocks signals it reads by fd */
    (void)signal(SIGPIPE, SIG_DFL);
    (void)signal(SIGXFSZ, SIG_DFL);
    /* Mount changes stay in this namespace: nothing propagates back to the host. */
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        goto fail;
    st = ST_CGROUP; /* limits apply before anything of the run executes */
    for (size_t i = 0; sp->cgroup_fds && sp->cgroup_fds[i] >= 0; i++)
        if (write(sp->cgroup_fds[i], "0", 1) != 1)
            goto fail;
    st = ST_CGROUPNS; /* the run's cgroup is its cgroup root: /proc/self/cgroup shows "/" */
    if (unshare(CLONE_NEWCGROUP) < 0)
        goto fail;
    st = ST_NETWORK; /* an egress run joins the network namespace the node made for it */
    if (sp->netns_fd >= 0 && setns(sp->netns_fd, CLONE_NEWNET) < 0)
        goto fail;
    if (setup_network() < 0)
        goto fail;
    st = ST_IMAGE;
    if (sp->image_rootfs && mount_image(sp, p) < 0)
        goto fail;
    if (child_mounts(sp, p, &rootfd, &st) < 0)
        goto fail;
    st = ST_PIVOT; /* the run's root becomes / and the host's tree is detached entirely */
    if (fchdir(rootfd) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
        umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        goto fail;
    close(rootfd);
    st = ST_HOSTNAME;
    if (sethostname(sp->hostname, strlen(sp->hostname)) < 0)
        goto fail;
    st = ST_USERNS; /* from here on: root of the run's user namespace, nobody on the host */
    if (userns_enter_as_root(sp->userns_fd) < 0)
        goto fail;
    st = ST_TREE;
    umask(022);
    if (make_tree(sp) < 0)
        goto fail;
    st = ST_STDIO;
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul < 0 || dup2(nul, 0) < 0)
        goto fail;
    if (dup2(sp->bridge_fd, 3) < 0) /* the agent listens on the node's socket: SBX_LISTEN=fd:3 */
        goto fail;
    if (syscall(SYS_close_range, 4, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
        goto fail;
    st = ST_CAPS;
    if (drop_caps(sp->pool_host) < 0)
        goto fail;
    st = ST_NNP; /* no more privileges from exec (setuid binaries, file capabilities) */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        goto fail;
    st = ST_SECCOMP;
    if (seccomp_filter_load_raw(sp->filter) < 0)
        goto fail;
    st = ST_EXEC;
    execve(p->exe, sp->argv, sp->envp);
fail:;
    int e[2] = { (int)st, errno };
    (void)!write(errfd, e, sizeof e);
    _exit(127);
}

int proc_stat_start_time(int fd, uint64_t *ret)
{
    char buf[1024];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return n < 0 ? negative_errno() : -ESRCH;
    buf[n] = 0;
    /* comm may hold spaces and parentheses: fields restart after the last ')' */
    char *q = strrchr(buf, ')');
    if (!q)
        return -EIO;
    /* q+1 is the space before field 3 (state); advance to the one before field 22 */
    q++;
    if (q[0] == ' ' && (q[1] == 'Z' || q[1] == 'X'))
        return -ESRCH; /* dead, not yet reaped (a zombie keeps its pid and start time) */
    for (int field = 3; field < 22 && q; field++)
        q = strchr(q + 1, ' ');
    if (!q)
        return -EIO;
    q++;
    char *end = strchr(q, ' ');
    if (!end)
        return -EIO;
    uint64_t v;
    if (parse_u64(sv_make(q, (size_t)(end - q)), UINT64_MAX, &v) < 0)
        return -EIO;
    *ret = v;
    return 0;
}

int proc_stat_open(pid_t pid)
{
    char path[64];
    (void)snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    return fd < 0 ? negative_errno() : fd;
}

int proc_start_time(pid_t pid, uint64_t *ret)
{
    _cleanup_close_ int fd = proc_stat_open(pid);
    if (fd < 0)
        return fd;
    return proc_stat_start_time(fd, ret);
}

int substrate_spawn(const substrate_spec_t *sp, pid_t *ret_pid, uint64_t *ret_start, sbx_err_t *err)
{
    _cleanup_free_ paths_t *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    int r = build_paths(sp, p);
    if (r < 0)
        return sbx_err(err, r, "paths: %s", strerror(-r));
    int pfd[2], gfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return negative_errno();
    if (pipe2(gfd, O_CLOEXEC) < 0) {
        r = negative_errno();
        safe_close(pfd[0]);
        safe_close(pfd[1]);
        return r;
    }
    unsigned long flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
    if (sp->netns_fd < 0)
        flags |= CLONE_NEWNET;
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
    if (pid < 0) {
        r = negative_errno();
        safe_close(pfd[0]);
        safe_close(pfd[1]);
        safe_close(gfd[0]);
        safe_close(gfd[1]);
        return sbx_err(err, r, "clone: %s", strerror(-r));
    }
    if (pid == 0) {
        close(gfd[1]); /* the node's end: its death must read as EOF here */
        /* stdout and stderr go to the run's log before anything can fail */
        (void)dup2(sp->log_fd, 1);
        (void)dup2(sp->log_fd, 2);
        child_main(sp, p, pfd[1], gfd[0]);
    }
    safe_close(pfd[1]);
    safe_close(gfd[0]);
    uint64_t start;
    r = proc_start_time(pid, &start);
    if (r >= 0 && sp->cloned)
        r = sp->cloned(sp->cloned_arg, pid, start);
    if (r < 0 || write(gfd[1], "g", 1) != 1) {
        (void)kill(pid, SIGKILL);
        (void)waitpid(pid, NULL, 0);
        safe_close(gfd[1]);
        safe_close(pfd[0]);
        return sbx_err(err, r < 0 ? r : -EPIPE, "cannot record the run's process: %s",
                       strerror(r < 0 ? -r : EPIPE));
    }
    safe_close(gfd[1]);
    int e[2];
    ssize_t n;
    do
        n = read(pfd[0], e, sizeof e);
    while (n < 0 && errno == EINTR);
    safe_close(pfd[0]);
    if (n == sizeof e) {
        (void)waitpid(pid, NULL, 0);
        const char *what = e[0] >= 0 && e[0] < ST_MAX_ ? step_names[e[0]] : "?";
        return sbx_err(err, -e[1] ?: -EIO, "run setup failed at \"%s\": %s", what, strerror(e[1]));
    }
    uint64_t now;
    if (proc_start_time(pid, &now) < 0 || now != start) {
        (void)kill(pid, SIGKILL);
        (void)waitpid(pid, NULL, 0);
        return sbx_err(err, -ESRCH, "run exited at once");
    }
    *ret_pid = pid;
    *ret_start = start;
    return 0;
}
