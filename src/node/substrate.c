/* SPDX-License-Identifier: MIT */
#include "substrate.h"

#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/close_range.h>
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

/* Host directories shown read-only in every run, and the merged-/usr names that are links to
 * them on current systems (copied as links) or directories on older ones (bound read-only). */
static const char *const ro_dirs[] = { "usr", "etc", "opt" };
static const char *const usr_links[] = { "bin", "sbin", "lib", "lib32", "lib64", "libx32" };
static const char *const dev_nodes[] = { "null", "zero", "full", "random", "urandom", "tty" };
#define N_RO (sizeof ro_dirs / sizeof ro_dirs[0])
#define N_LINKS (sizeof usr_links / sizeof usr_links[0])
#define N_DEV (sizeof dev_nodes / sizeof dev_nodes[0])
#define POOL_LOCK "/run/sbx-pool-uids.lock"

typedef enum {
    ST_PRIVATE,
    ST_CGROUP,
    ST_ROOT,
    ST_RO_BIND,
    ST_LINKS,
    ST_PROC,
    ST_DEV,
    ST_TMP,
    ST_AGENT,
    ST_POOL,
    ST_PIVOT,
    ST_HOSTNAME,
    ST_LOOPBACK,
    ST_CAPS,
    ST_STDIO,
    ST_EXEC,
} step_t;

static const char *const step_names[] = {
    [ST_PRIVATE] = "make mounts private",
    [ST_CGROUP] = "join cgroups",
    [ST_ROOT] = "bind the run root",
    [ST_RO_BIND] = "bind host directories read-only",
    [ST_LINKS] = "merged-/usr links",
    [ST_PROC] = "mount /proc",
    [ST_DEV] = "populate /dev",
    [ST_TMP] = "create /tmp",
    [ST_AGENT] = "mount the agent",
    [ST_POOL] = "pool host mounts",
    [ST_PIVOT] = "pivot_root",
    [ST_HOSTNAME] = "set hostname",
    [ST_LOOPBACK] = "bring up loopback",
    [ST_CAPS] = "drop capabilities",
    [ST_STDIO] = "set up stdio and fds",
    [ST_EXEC] = "exec",
};

/* Every path the child needs, built before clone(): the child only makes system calls. */
typedef struct {
    char ro_src[N_RO][16], ro_dst[N_RO][PATH_MAX];
    char link_target[N_LINKS][PATH_MAX], link_dst[N_LINKS][PATH_MAX];
    bool link_is_dir[N_LINKS], link_present[N_LINKS], ro_present[N_RO];
    char dev_src[N_DEV][32], dev_dst[N_DEV][PATH_MAX];
    char proc[PATH_MAX], dev[PATH_MAX], devshm[PATH_MAX], tmp[PATH_MAX];
    char sbx[PATH_MAX], sbxbin[PATH_MAX], agent[PATH_MAX];
    char sys[PATH_MAX], sysfs[PATH_MAX], cgroup[PATH_MAX], run[PATH_MAX], lock[PATH_MAX];
    char exe[PATH_MAX];
} paths_t;

static int join(char *out, const char *a, const char *b)
{
    int n = snprintf(out, PATH_MAX, "%s/%s", a, b);
    return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

static int build_paths(const substrate_spec_t *sp, paths_t *p)
{
    int r = 0;
    for (size_t i = 0; i < N_RO && r >= 0; i++) {
        struct stat st;
        (void)snprintf(p->ro_src[i], sizeof p->ro_src[i], "/%s", ro_dirs[i]);
        p->ro_present[i] = lstat(p->ro_src[i], &st) == 0 && S_ISDIR(st.st_mode);
        r = join(p->ro_dst[i], sp->root, ro_dirs[i]);
    }
    for (size_t i = 0; i < N_LINKS && r >= 0; i++) {
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
        r = join(p->link_dst[i], sp->root, usr_links[i]);
    }
    for (size_t i = 0; i < N_DEV && r >= 0; i++) {
        (void)snprintf(p->dev_src[i], sizeof p->dev_src[i], "/dev/%s", dev_nodes[i]);
        char rel[32];
        (void)snprintf(rel, sizeof rel, "dev/%s", dev_nodes[i]);
        r = join(p->dev_dst[i], sp->root, rel);
    }
    if (r >= 0)
        r = join(p->proc, sp->root, "proc");
    if (r >= 0)
        r = join(p->dev, sp->root, "dev");
    if (r >= 0)
        r = join(p->devshm, sp->root, "dev/shm");
    if (r >= 0)
        r = join(p->tmp, sp->root, "tmp");
    if (r >= 0)
        r = join(p->sbx, sp->root, ".sbx");
    if (r >= 0)
        r = join(p->sbxbin, sp->root, ".sbx/bin");
    if (r >= 0)
        r = join(p->agent, sp->root, SUBSTRATE_AGENT_PATH + 1);
    if (r >= 0)
        r = join(p->sys, sp->root, "sys");
    if (r >= 0)
        r = join(p->sysfs, sp->root, "sys/fs");
    if (r >= 0)
        r = join(p->cgroup, sp->root, "sys/fs/cgroup");
    if (r >= 0)
        r = join(p->run, sp->root, "run");
    if (r >= 0)
        r = join(p->lock, sp->root, POOL_LOCK + 1);
    const char *a0 = sp->argv[0];
    if (r >= 0 && strlen(a0) >= PATH_MAX)
        r = -ENAMETOOLONG;
    if (r >= 0)
        memcpy(p->exe, streq(a0, "sbx-server") ? SUBSTRATE_AGENT_PATH : a0,
               strlen(streq(a0, "sbx-server") ? SUBSTRATE_AGENT_PATH : a0) + 1);
    return r;
}

/* ---- the child: a flat list of fail-closed steps, system calls only ----------------------- */

static int mkdir_ok(const char *p, mode_t m)
{
    return mkdir(p, m) == 0 || errno == EEXIST ? 0 : -1;
}

static int touch(const char *p)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

/* Bind src at dst and make that mount read-only, no setuid, no devices. */
static int bind_ro(const char *src, const char *dst, bool rec)
{
    if (mount(src, dst, NULL, MS_BIND | (rec ? MS_REC : 0), NULL) < 0)
        return -1;
    return mount(NULL, dst, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);
}

static int child_mounts(const substrate_spec_t *sp, const paths_t *p, step_t *st)
{
    *st = ST_ROOT; /* a mount point of its own, so that pivot_root can move it */
    if (mount(sp->root, sp->root, NULL, MS_BIND, NULL) < 0)
        return -1;
    *st = ST_RO_BIND; /* the host's programs and configuration: visible, never writable */
    for (size_t i = 0; i < N_RO; i++)
        if (p->ro_present[i] &&
            (mkdir_ok(p->ro_dst[i], 0755) < 0 || bind_ro(p->ro_src[i], p->ro_dst[i], true) < 0))
            return -1;
    *st = ST_LINKS;
    for (size_t i = 0; i < N_LINKS; i++) {
        if (!p->link_present[i])
            continue;
        if (p->link_is_dir[i]) {
            if (mkdir_ok(p->link_dst[i], 0755) < 0 ||
                bind_ro(p->link_target[i], p->link_dst[i], true) < 0)
                return -1;
        } else if (symlink(p->link_target[i], p->link_dst[i]) < 0 && errno != EEXIST)
            return -1;
    }
    *st = ST_PROC; /* this pid namespace's own /proc: the run sees only its processes */
    if (mkdir_ok(p->proc, 0555) < 0 ||
        mount("proc", p->proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return -1;
    *st = ST_DEV; /* a few harmless device nodes, never the host's /dev */
    if (mkdir_ok(p->dev, 0755) < 0 ||
        mount("tmpfs", p->dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=1m") < 0)
        return -1;
    for (size_t i = 0; i < N_DEV; i++)
        if (touch(p->dev_dst[i]) < 0 ||
            mount(p->dev_src[i], p->dev_dst[i], NULL, MS_BIND, NULL) < 0)
            return -1;
    if (mkdir_ok(p->devshm, 01777) < 0 ||
        mount("tmpfs", p->devshm, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m") < 0)
        return -1;
    *st = ST_TMP;
    if (mkdir_ok(p->tmp, 01777) < 0 || chmod(p->tmp, 01777) < 0)
        return -1;
    *st = ST_AGENT; /* the agent binary, read-only: the run cannot replace what the node
                     * verifies as the bridge's executable */
    if (mkdir_ok(p->sbx, 0755) < 0 || mkdir_ok(p->sbxbin, 0755) < 0 || touch(p->agent) < 0 ||
        bind_ro(sp->agent_bin, p->agent, false) < 0)
        return -1;
    if (sp->pool_host) {
        *st = ST_POOL; /* a pool host makes cgroups per sandbox and shares uid locks with
                        * the other pool hosts of this kernel */
        if (mkdir_ok(p->sys, 0555) < 0 || mkdir_ok(p->sysfs, 0555) < 0 ||
            mkdir_ok(p->cgroup, 0555) < 0 ||
            mount("/sys/fs/cgroup", p->cgroup, NULL, MS_BIND | MS_REC, NULL) < 0 ||
            mkdir_ok(p->run, 0755) < 0 || touch(p->lock) < 0 ||
            mount(POOL_LOCK, p->lock, NULL, MS_BIND, NULL) < 0)
            return -1;
    }
    return 0;
}

/* The run is root inside its namespaces, without a user namespace: what keeps it from the
 * host's kernel interfaces is the capability bounding set. A dedicated run keeps what a
 * program running as root ordinarily needs (file ownership, uids, signals, low ports); never
 * mount, mknod, modules, raw I/O, time, or network administration. A pool host also keeps
 * CAP_SYS_ADMIN and CAP_SYS_CHROOT (its hidepid /proc mount namespace, joined with setns) and CAP_SYS_PTRACE (reading its sandboxes'
 * /proc entries): a pool host is one trust domain, its sandboxes confined by uid + Landlock +
 * seccomp inside it. */
static int drop_caps(bool pool_host)
{
    uint64_t keep = (1ULL << CAP_CHOWN) | (1ULL << CAP_DAC_OVERRIDE) | (1ULL << CAP_FOWNER) |
                    (1ULL << CAP_FSETID) | (1ULL << CAP_KILL) | (1ULL << CAP_SETGID) |
                    (1ULL << CAP_SETUID) | (1ULL << CAP_NET_BIND_SERVICE) |
                    (1ULL << CAP_AUDIT_WRITE);
    if (pool_host)
        keep |= (1ULL << CAP_SYS_ADMIN) | (1ULL << CAP_SYS_CHROOT) | (1ULL << CAP_SYS_PTRACE) |
                (1ULL << CAP_DAC_READ_SEARCH); /* setns(mount) needs SYS_CHROOT too */
    for (int c = 0; c < 64; c++) {
        if (keep & (1ULL << c))
            continue;
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
            return -1; /* EINVAL: beyond this kernel's last capability */
    }
    /* and no more privileges from exec (setuid binaries, file capabilities) for dedicated runs;
     * a pool host sets it per sandbox itself */
    if (!pool_host && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return -1;
    return 0;
}

_noreturn_ static void child_main(const substrate_spec_t *sp, const paths_t *p, int errfd)
{
    step_t st = ST_PRIVATE;
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
    if (child_mounts(sp, p, &st) < 0)
        goto fail;
    st = ST_PIVOT; /* the run's root becomes / and the host's tree is detached entirely */
    if (chdir(sp->root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
        umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
        goto fail;
    st = ST_HOSTNAME;
    if (sethostname(sp->hostname, strlen(sp->hostname)) < 0)
        goto fail;
    if (sp->new_netns) {
        st = ST_LOOPBACK; /* a network namespace of its own: loopback only, and up */
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct ifreq ifr = { .ifr_name = "lo" };
        if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
            goto fail;
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
            goto fail;
        close(s);
    }
    st = ST_CAPS;
    if (drop_caps(sp->pool_host) < 0)
        goto fail;
    st = ST_STDIO;
    int nul = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nul < 0 || dup2(nul, 0) < 0)
        goto fail;
    if (dup2(sp->bridge_fd, 3) < 0) /* the agent listens on the node's socket: SBX_LISTEN=fd:3 */
        goto fail;
    if (syscall(SYS_close_range, 4, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
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

int substrate_spawn(const substrate_spec_t *sp, pid_t *ret_pid, uint64_t *ret_start, char *err,
                    size_t errlen)
{
    _cleanup_free_ paths_t *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    int r = build_paths(sp, p);
    if (r < 0) {
        (void)snprintf(err, errlen, "paths: %s", strerror(-r));
        return r;
    }
    _cleanup_close_ int logfd =
        open(sp->log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (logfd < 0) {
        r = negative_errno();
        (void)snprintf(err, errlen, "open %s: %s", sp->log_path, strerror(-r));
        return r;
    }
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return negative_errno();
    unsigned long flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | SIGCHLD;
    if (sp->new_netns)
        flags |= CLONE_NEWNET;
    pid_t pid = (pid_t)syscall(SYS_clone, flags, NULL, NULL, NULL, NULL);
    if (pid < 0) {
        r = negative_errno();
        safe_close(pfd[0]);
        safe_close(pfd[1]);
        (void)snprintf(err, errlen, "clone: %s", strerror(-r));
        return r;
    }
    if (pid == 0) {
        /* stdout and stderr go to the run's log before anything can fail */
        (void)dup2(logfd, 1);
        (void)dup2(logfd, 2);
        child_main(sp, p, pfd[1]);
    }
    safe_close(pfd[1]);
    int e[2];
    ssize_t n;
    do
        n = read(pfd[0], e, sizeof e);
    while (n < 0 && errno == EINTR);
    safe_close(pfd[0]);
    if (n == sizeof e) {
        (void)waitpid(pid, NULL, 0);
        const char *what = e[0] >= 0 && e[0] <= ST_EXEC ? step_names[e[0]] : "?";
        (void)snprintf(err, errlen, "run setup failed at \"%s\": %s", what, strerror(e[1]));
        return -e[1] ?: -EIO;
    }
    uint64_t start;
    r = proc_start_time(pid, &start);
    if (r < 0) {
        (void)kill(pid, SIGKILL);
        (void)waitpid(pid, NULL, 0);
        (void)snprintf(err, errlen, "run exited at once");
        return -ESRCH;
    }
    *ret_pid = pid;
    *ret_start = start;
    return 0;
}
