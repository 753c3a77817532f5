/* SPDX-License-Identifier: MIT */
#include "landlock.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>

#include "common/macro.h"

#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_RULE_NET_PORT 2

struct ll_ruleset_attr { /* ABI 6 layout: 24 bytes */
    uint64_t handled_access_fs;
    uint64_t handled_access_net;
    uint64_t scoped;
};

struct ll_path_beneath_attr {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

#define FS_READ_EXEC (LL_ACCESS_FS_EXECUTE | LL_ACCESS_FS_READ_FILE | LL_ACCESS_FS_READ_DIR)
#define FS_READ (LL_ACCESS_FS_READ_FILE | LL_ACCESS_FS_READ_DIR)

int landlock_abi(void)
{
    long r = syscall(SYS_landlock_create_ruleset, NULL, 0, LL_CREATE_RULESET_VERSION);
    return r < 0 ? 0 : (int)r;
}

void landlock_features(int abi, char *out, size_t cap)
{
    (void)snprintf(out, cap, "%s%s%s%s%s%s", abi >= 1 ? "fs" : "none", abi >= 2 ? ",refer" : "",
                   abi >= 3 ? ",truncate" : "", abi >= 4 ? ",no_tcp_bind" : "",
                   abi >= 5 ? ",ioctl_dev" : "", abi >= 6 ? ",scope_abstract_unix" : "");
}

const char *landlock_feature(int abi, int i)
{
    static const char *const names[] = { "fs",          "refer",     "truncate",
                                         "no_tcp_bind", "ioctl_dev", "scope_abstract_unix" };
    return i >= 0 && i < abi && i < (int)ELEMENTSOF(names) ? names[i] : NULL;
}

static uint64_t fs_mask_for_abi(int abi)
{
    uint64_t m = (LL_ACCESS_FS_MAKE_SYM << 1) - 1; /* the 13 ABI-1 rights */
    if (abi >= 2)
        m |= LL_ACCESS_FS_REFER;
    if (abi >= 3)
        m |= LL_ACCESS_FS_TRUNCATE;
    if (abi >= 5)
        m |= LL_ACCESS_FS_IOCTL_DEV;
    return m;
}

static void add_sys(landlock_base_t *b, const char *path, uint64_t access, bool dir)
{
    if (b->n_sys >= (int)ELEMENTSOF(b->sys_fds))
        return;
    int fd = open(path, O_PATH | O_CLOEXEC | (dir ? O_DIRECTORY : 0));
    if (fd < 0)
        return; /* absent directories (/lib32, /opt, ...) are skipped */
    /* Rights that only make sense on directories must not be granted on a file rule. */
    if (!dir)
        access &= LL_ACCESS_FS_EXECUTE | LL_ACCESS_FS_WRITE_FILE | LL_ACCESS_FS_READ_FILE |
                  LL_ACCESS_FS_TRUNCATE | LL_ACCESS_FS_IOCTL_DEV;
    b->sys_fds[b->n_sys] = fd;
    b->sys_access[b->n_sys] = access & b->handled_fs;
    b->n_sys++;
}

int landlock_base_init(landlock_base_t *b, const char *proc_path)
{
    *b = (landlock_base_t){ 0 };
    b->abi = landlock_abi();
    if (b->abi <= 0)
        return -EOPNOTSUPP;
    b->handled_fs = fs_mask_for_abi(b->abi);
    b->handled_net = b->abi >= 4 ? LL_ACCESS_NET_BIND_TCP : 0;
    /* Signal scoping is left out on purpose: every exec gets its own domain, and a sandbox must
     * be able to signal its own earlier background processes. Distinct uids already stop
     * signals between sandboxes. */
    b->scoped = b->abi >= 6 ? LL_SCOPE_ABSTRACT_UNIX_SOCKET : 0;
    static const char *const sys_dirs[] = { "/usr",   "/bin",    "/sbin", "/lib", "/lib64",
                                            "/lib32", "/libx32", "/etc",  "/opt" };
    for (size_t i = 0; i < ELEMENTSOF(sys_dirs); i++)
        add_sys(b, sys_dirs[i], FS_READ_EXEC, true);
    add_sys(b, proc_path ? proc_path : "/proc", FS_READ, true);
    add_sys(b, "/sys", FS_READ, true);
    add_sys(b, "/dev/null",
            LL_ACCESS_FS_READ_FILE | LL_ACCESS_FS_WRITE_FILE | LL_ACCESS_FS_TRUNCATE, false);
    add_sys(b, "/dev/zero", LL_ACCESS_FS_READ_FILE, false);
    add_sys(b, "/dev/full", LL_ACCESS_FS_READ_FILE | LL_ACCESS_FS_WRITE_FILE, false);
    add_sys(b, "/dev/random", LL_ACCESS_FS_READ_FILE, false);
    add_sys(b, "/dev/urandom", LL_ACCESS_FS_READ_FILE, false);
    return 0;
}

void landlock_base_done(landlock_base_t *b)
{
    for (int i = 0; i < b->n_sys; i++)
        safe_close(b->sys_fds[i]);
    b->n_sys = 0;
}

static int add_path_rule(int ruleset, int fd, uint64_t access)
{
    struct ll_path_beneath_attr pb = { .allowed_access = access, .parent_fd = fd };
    if (syscall(SYS_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &pb, 0) < 0)
        return negative_errno();
    return 0;
}

int landlock_ruleset_for_home(const landlock_base_t *b, int home_fd, int *ret_fd)
{
    if (b->abi <= 0)
        return -EOPNOTSUPP;
    struct ll_ruleset_attr attr = { .handled_access_fs = b->handled_fs,
                                    .handled_access_net = b->handled_net,
                                    .scoped = b->scoped };
    size_t size = b->abi >= 6 ? sizeof attr : b->abi >= 4 ? 16 : 8;
    _cleanup_close_ int rs = (int)syscall(SYS_landlock_create_ruleset, &attr, size, 0);
    if (rs < 0)
        return negative_errno();
    /* Every rule must land: a missing rule would only deny more, but a failure here means
     * the kernel and we disagree about the ABI, so fail closed and say so. */
    for (int i = 0; i < b->n_sys; i++) {
        int r = add_path_rule(rs, b->sys_fds[i], b->sys_access[i]);
        if (r < 0)
            return r;
    }
    int r = add_path_rule(rs, home_fd, b->handled_fs);
    if (r < 0)
        return r;
    /* No net rule: with BIND_TCP handled and nothing allowed, every TCP bind is denied. */
    *ret_fd = TAKE_FD(rs);
    return 0;
}

long landlock_restrict_self_raw(int ruleset_fd)
{
    return syscall(SYS_landlock_restrict_self, ruleset_fd, 0);
}
