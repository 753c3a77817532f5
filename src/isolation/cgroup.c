/* SPDX-License-Identifier: MIT */
#include "cgroup.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "common/macro.h"

static const char *const v1_names[3] = { "memory", "pids", "cpu" };

static bool dir_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int write_file(const char *path, const char *val)
{
    _cleanup_close_ int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return negative_errno();
    size_t n = strlen(val);
    if (write(fd, val, n) != (ssize_t)n)
        return negative_errno();
    return 0;
}

void cgroups_init(cgroups_t *cg, const char *tag)
{
    *cg = (cgroups_t){ 0 };
    bool *have[3] = { &cg->v1_memory, &cg->v1_pids, &cg->v1_cpu };
    for (int i = 0; i < 3; i++) {
        char mnt[96];
        (void)snprintf(mnt, sizeof mnt, "/sys/fs/cgroup/%s", v1_names[i]);
        if (!dir_exists(mnt))
            continue;
        (void)snprintf(cg->v1_root[i], sizeof cg->v1_root[i], "%s/%s", mnt, tag);
        if (mkdir(cg->v1_root[i], 0755) < 0 && errno != EEXIST)
            continue;
        *have[i] = true;
        cg->enabled = true;
    }
    /* cgroup2 (for killing a command's whole tree): /sys/fs/cgroup itself on a pure-v2 host,
     * /sys/fs/cgroup/unified beside v1 controllers (here, and inside a pool run) */
    static const char *const v2_mounts[] = { "/sys/fs/cgroup", "/sys/fs/cgroup/unified" };
    for (size_t i = 0; i < 2 && !cg->v2_root[0]; i++) {
        struct statfs sf;
        if (statfs(v2_mounts[i], &sf) < 0 || sf.f_type != 0x63677270 /* CGROUP2_SUPER_MAGIC */)
            continue;
        (void)snprintf(cg->v2_root, sizeof cg->v2_root, "%s/%s", v2_mounts[i], tag);
        if (mkdir(cg->v2_root, 0755) < 0 && errno != EEXIST)
            cg->v2_root[0] = 0;
    }
    if (cg->v1_memory) { /* children must not share the parent's charge accounting quirks */
        char p[192];
        (void)snprintf(p, sizeof p, "%s/memory.use_hierarchy", cg->v1_root[0]);
        (void)write_file(p, "1");
    }
}

int cgroups_seal(const cgroups_t *cg)
{
    for (int i = 0; i < 3; i++)
        if (cg->v1_root[i][0] && chmod(cg->v1_root[i], 0700) < 0)
            return negative_errno();
    if (cg->v2_root[0] && chmod(cg->v2_root, 0700) < 0)
        return negative_errno();
    return 0;
}

static void rmtree_cgroup(const char *dir, int depth);

void cgroups_done(cgroups_t *cg)
{
    for (int i = 0; i < 3; i++) {
        if (!cg->v1_root[i][0])
            continue;
        /* remove recycled children, then the host's parent (one listing, not a probe of every
         * possible slot name: that was 24,000 failed rmdirs at each shutdown) */
        rmtree_cgroup(cg->v1_root[i], 0);
    }
    if (cg->v2_root[0])
        rmtree_cgroup(cg->v2_root, 0);
}

void cgroups_describe(const cgroups_t *cg, char *out, size_t cap)
{
    if (!cg->enabled) {
        (void)snprintf(out, cap, "none");
        return;
    }
    (void)snprintf(out, cap, "%s%s%s (v1)", cg->v1_memory ? "memory" : "",
                   cg->v1_pids ? (cg->v1_memory ? ",pids" : "pids") : "", cg->v1_cpu ? ",cpu" : "");
}

int cgroup_prepare(const cgroups_t *cg, uint32_t slot, const cg_limits_t *lim, int *fds, int nfds)
{
    int k = 0;
    bool have[3] = { cg->v1_memory, cg->v1_pids, cg->v1_cpu };
    for (int i = 0; i < 3 && k < nfds - 1; i++) {
        if (!have[i])
            continue;
        char dir[192], p[224], val[32];
        (void)snprintf(dir, sizeof dir, "%s/s%u", cg->v1_root[i], slot);
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
            goto fail;
        int r = 0;
        if (i == 0) {
            (void)snprintf(p, sizeof p, "%s/memory.limit_in_bytes", dir);
            (void)snprintf(val, sizeof val, "%llu",
                           lim->mem_bytes ? (unsigned long long)lim->mem_bytes
                                          : (unsigned long long)-1);
            r = lim->mem_bytes ? write_file(p, val) : write_file(p, "-1");
        } else if (i == 1) {
            (void)snprintf(p, sizeof p, "%s/pids.max", dir);
            (void)snprintf(val, sizeof val, "%llu", (unsigned long long)lim->pids);
            r = write_file(p, lim->pids ? val : "max");
        } else if (lim->cpu_quota_us) {
            (void)snprintf(p, sizeof p, "%s/cpu.cfs_period_us", dir);
            (void)snprintf(val, sizeof val, "%llu", (unsigned long long)lim->cpu_period_us);
            r = write_file(p, val);
            (void)snprintf(p, sizeof p, "%s/cpu.cfs_quota_us", dir);
            (void)snprintf(val, sizeof val, "%llu", (unsigned long long)lim->cpu_quota_us);
            if (r >= 0)
                r = write_file(p, val);
        }
        if (r < 0)
            goto fail;
        (void)snprintf(p, sizeof p, "%s/cgroup.procs", dir);
        fds[k] = open(p, O_WRONLY | O_CLOEXEC);
        if (fds[k] < 0)
            goto fail;
        k++;
    }
    fds[k] = -1;
    return 0;
fail:;
    int r = negative_errno();
    while (k > 0) {
        k--;
        fds[k] = safe_close(fds[k]);
    }
    fds[0] = -1;
    return r;
}

int cgroup_count(const cgroups_t *cg, uint32_t slot)
{
    if (!cg->v1_pids)
        return -EOPNOTSUPP;
    char p[224];
    (void)snprintf(p, sizeof p, "%s/s%u/pids.current", cg->v1_root[1], slot);
    _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return negative_errno();
    char b[32];
    ssize_t n = read(fd, b, sizeof b - 1);
    if (n <= 0)
        return -EIO;
    int v = 0;
    for (ssize_t i = 0; i < n && b[i] >= '0' && b[i] <= '9'; i++)
        v = v * 10 + (b[i] - '0');
    return v;
}

static int set_limit(int i, const char *dir, const cg_limits_t *lim)
{
    char p[256], val[32];
    if (i == 0) {
        (void)snprintf(p, sizeof p, "%s/memory.limit_in_bytes", dir);
        (void)snprintf(val, sizeof val, "%llu", (unsigned long long)lim->mem_bytes);
        return write_file(p, lim->mem_bytes ? val : "-1");
    }
    if (i == 1) {
        (void)snprintf(p, sizeof p, "%s/pids.max", dir);
        (void)snprintf(val, sizeof val, "%llu", (unsigned long long)lim->pids);
        return write_file(p, lim->pids ? val : "max");
    }
    if (!lim->cpu_quota_us)
        return 0;
    (void)snprintf(p, sizeof p, "%s/cpu.cfs_period_us", dir);
    (void)snprintf(val, sizeof val, "%llu", (unsigned long long)lim->cpu_period_us);
    int r = write_file(p, val);
    (void)snprintf(p, sizeof p, "%s/cpu.cfs_quota_us", dir);
    (void)snprintf(val, sizeof val, "%llu", (unsigned long long)lim->cpu_quota_us);
    return r < 0 ? r : write_file(p, val);
}

/* One hierarchy's group of a run: made, given to owner (the directory and the files that let
 * it create and fill children; never the limit files) when owner >= 0, and its cgroup.procs
 * opened for the run's process to join. */
static int prepare_one(const char *root, const char *name, int64_t owner, const char *const *deleg,
                       size_t ndeleg, char *dir, int *ret_fd)
{
    char p[256];
    int n = snprintf(dir, 192, "%s/%s", root, name);
    if (n < 0 || n >= 192) {
        errno = ENAMETOOLONG;
        return -1;
    }
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return -1;
    for (size_t f = 0; owner >= 0 && f < ndeleg; f++) {
        (void)snprintf(p, sizeof p, "%s%s", dir, deleg[f]);
        if (chown(p, (uid_t)owner, (gid_t)owner) < 0)
            return -1;
    }
    (void)snprintf(p, sizeof p, "%s/cgroup.procs", dir);
    *ret_fd = open(p, O_WRONLY | O_CLOEXEC);
    return *ret_fd < 0 ? -1 : 0;
}

int cgroup_prepare_run(const cgroups_t *cg, const char *name, const cg_limits_t *lim, int64_t owner,
                       int *fds, int nfds, char (*dirs)[192], const char **names)
{
    static const char *const v1_deleg[] = { "", "/cgroup.procs", "/tasks" };
    static const char *const v2_deleg[] = { "", "/cgroup.procs", "/cgroup.threads",
                                            "/cgroup.subtree_control" };
    int k = 0;
    bool have[3] = { cg->v1_memory, cg->v1_pids, cg->v1_cpu };
    for (int i = 0; i < 3 && k < nfds - 1; i++) {
        if (!have[i])
            continue;
        /* the limits are set before the group is delegated: the run never raises them */
        char dir[192];
        int n = snprintf(dir, sizeof dir, "%s/%s", cg->v1_root[i], name);
        if (n < 0 || n >= (int)sizeof dir || (mkdir(dir, 0755) < 0 && errno != EEXIST))
            goto fail;
        int r = set_limit(i, dir, lim);
        if (r < 0) {
            errno = -r;
            goto fail;
        }
        if (prepare_one(cg->v1_root[i], name, owner, v1_deleg, ELEMENTSOF(v1_deleg), dirs[k],
                        &fds[k]) < 0)
            goto fail;
        names[k++] = v1_names[i];
    }
    /* cgroup2: one group for the run's whole tree */
    if (cg->v2_root[0] && k < nfds - 1) {
        if (prepare_one(cg->v2_root, name, owner, v2_deleg, ELEMENTSOF(v2_deleg), dirs[k],
                        &fds[k]) < 0)
            goto fail;
        names[k++] = "unified";
    }
    fds[k] = -1;
    names[k] = NULL;
    return 0;
fail:;
    int e = errno;
    while (k > 0) {
        k--;
        fds[k] = safe_close(fds[k]);
        names[k] = NULL;
    }
    fds[0] = -1;
    errno = e;
    return -e;
}

static void rmtree_cgroup(const char *dir, int depth)
{
    DIR *d = depth < 16 ? opendir(dir) : NULL;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_type != DT_DIR || streq(de->d_name, ".") || streq(de->d_name, ".."))
            continue;
        char sub[512];
        if (snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name) < (int)sizeof sub)
            rmtree_cgroup(sub, depth + 1);
    }
    if (d)
        closedir(d);
    (void)rmdir(dir);
}

void cgroup_remove_run(const cgroups_t *cg, const char *name)
{
    bool have[3] = { cg->v1_memory, cg->v1_pids, cg->v1_cpu };
    for (int i = 0; i < 3; i++) {
        if (!have[i])
            continue;
        char dir[256];
        if (snprintf(dir, sizeof dir, "%s/%s", cg->v1_root[i], name) < (int)sizeof dir)
            rmtree_cgroup(dir, 0);
    }
    char dir[256];
    if (cg->v2_root[0] && snprintf(dir, sizeof dir, "%s/%s", cg->v2_root, name) < (int)sizeof dir)
        rmtree_cgroup(dir, 0);
}

int cgroup_cmd_create_at(const char *root, const char *name, int *ret_procs_fd, int *ret_kill_fd,
                         int *ret_events_fd)
{
    char dir[256], p[300];
    if (!*name || strchr(name, '/') || name[0] == '.')
        return -EINVAL;
    if (snprintf(dir, sizeof dir, "%s/%s", root, name) >= (int)sizeof dir)
        return -ENAMETOOLONG;
    static const char *const files[] = { "cgroup.procs", "cgroup.kill", "cgroup.events" };
    int fds[3] = { -1, -1, -1 }, r = 0;
    bool made = false;
    /* Opened first and made only when missing: a kept group is there at all but its first
     * command, and a mkdir that finds it costs as much as an open (~25 us in cgroupfs here). */
    (void)snprintf(p, sizeof p, "%s/%s", dir, files[0]);
    fds[0] = open(p, O_WRONLY | O_CLOEXEC);
    if (fds[0] < 0 && errno == ENOENT) {
        made = mkdir(dir, 0755) == 0;
        if (!made && errno != EEXIST)
            return negative_errno();
        fds[0] = open(p, O_WRONLY | O_CLOEXEC);
    }
    if (fds[0] < 0)
        r = negative_errno();
    for (size_t i = 1; i < (ret_events_fd ? 3 : 2) && r == 0; i++) {
        (void)snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        fds[i] = open(p, (i == 2 ? O_RDONLY : O_WRONLY) | O_CLOEXEC);
        if (fds[i] < 0)
            r = negative_errno();
    }
    if (r == 0 && ret_events_fd && !made && !cgroup_cmd_empty(fds[2]))
        r = -EBUSY; /* not for keeping: something of an earlier run is in it */
    if (r < 0) {
        for (size_t i = 0; i < 3; i++)
            safe_close(fds[i]);
        if (made)
            (void)rmdir(dir);
        return r;
    }
    *ret_procs_fd = fds[0];
    *ret_kill_fd = fds[1];
    if (ret_events_fd)
        *ret_events_fd = fds[2];
    return 0;
}

bool cgroup_cmd_empty(int events_fd)
{
    /* "populated 0|1\nfrozen 0|1\n": read afresh at offset 0 each time */
    char b[64];
    ssize_t n = pread(events_fd, b, sizeof b - 1, 0);
    if (n <= 0)
        return false;
    b[n] = '\0';
    return strncmp(b, "populated 0\n", 12) == 0 || strstr(b, "\npopulated 0\n") != NULL;
}

bool cgroup_cmd_remove(const cgroups_t *cg, const char *name)
{
    char dir[256];
    return cg->v2_root[0] &&
           snprintf(dir, sizeof dir, "%s/%s", cg->v2_root, name) < (int)sizeof dir &&
           rmdir(dir) == 0;
}

unsigned cgroup_cmd_remove_prefix(const cgroups_t *cg, const char *prefix)
{
    if (!cg->v2_root[0])
        return 0;
    DIR *d = opendir(cg->v2_root);
    struct dirent *de;
    size_t n = strlen(prefix);
    unsigned gone = 0;
    while (d && (de = readdir(d)))
        if (de->d_type == DT_DIR && strncmp(de->d_name, prefix, n) == 0)
            gone += cgroup_cmd_remove(cg, de->d_name);
    if (d)
        closedir(d);
    return gone;
}
