/* SPDX-License-Identifier: MIT */
#include "filter.h"

#include <errno.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/macro.h"

static const char *const denied[] = {
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "mount",
    "umount2",
    "pivot_root",
    "swapon",
    "swapoff",
    "reboot",
    "unshare",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "shmget",
    "shmat",
    "shmctl",
    "shmdt",
    "msgget",
    "msgsnd",
    "msgrcv",
    "msgctl",
    "semget",
    "semop",
    "semtimedop",
    "semctl",
    "fsopen",
    "fsmount",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "quotactl",
    "acct",
    "settimeofday",
    "clock_settime",
    "adjtimex",
    "syslog",
    "vhangup",
    "lookup_dcookie",
};

/* Export the BPF once (the loads take the raw program); consumes ctx. */
static int export_bpf(scmp_filter_ctx ctx, seccomp_filter_t *f)
{
    int fds[2];
    if (pipe2(fds, 0) < 0) {
        seccomp_release(ctx);
        return negative_errno();
    }
    int r = seccomp_export_bpf(ctx, fds[1]);
    close(fds[1]);
    seccomp_release(ctx);
    if (r < 0) {
        close(fds[0]);
        return r;
    }
    size_t cap = 4096 * sizeof(struct sock_filter), len = 0;
    struct sock_filter *prog = malloc(cap);
    if (!prog) {
        close(fds[0]);
        return -ENOMEM;
    }
    for (;;) {
        ssize_t n = read(fds[0], (char *)prog + len, cap - len);
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == cap)
            break;
    }
    close(fds[0]);
    if (len == 0 || len % sizeof(struct sock_filter) != 0) {
        free(prog);
        return -EIO;
    }
    f->prog.filter = prog;
    f->prog.len = (unsigned short)(len / sizeof(struct sock_filter));
    return 0;
}

/* Socket families a sandbox or a run may use: unix, IPv4, IPv6 and netlink (`ip`). Every other
 * family (vsock above all: a VM's vsock space is not in any network namespace, so a sandbox
 * would take the VM's ports and reach the hypervisor's services; also AF_ALG, AF_PACKET and the
 * rest of the kernel's protocol code) is refused with EAFNOSUPPORT, as on a kernel without it.
 * socketpair: unix only. The rules name every family up to SOCKET_FAMILIES_CHECKED, so no
 * rule of theirs overlaps another. default_allows: the filter's default action is to allow
 * (libseccomp refuses a rule with the default's action: only the refusals are added). */
#define SOCKET_FAMILIES_CHECKED 64 /* AF_MAX is 46 here; anything above is refused too */
static int socket_families(scmp_filter_ctx ctx, bool default_allows)
{
    static const int allowed[] = { AF_UNIX, AF_INET, AF_INET6, AF_NETLINK };
    int r = 0;
    for (int call = 0; call < 2 && r >= 0; call++) {
        int nr = call == 0 ? SCMP_SYS(socket) : SCMP_SYS(socketpair);
        for (uint64_t fam = 0; fam < SOCKET_FAMILIES_CHECKED && r >= 0; fam++) {
            bool ok = false;
            for (size_t i = 0; i < ELEMENTSOF(allowed); i++)
                ok = ok || fam == (uint64_t)allowed[i];
            if (call == 1)
                ok = fam == AF_UNIX;
            if (ok && default_allows)
                continue;
            r = seccomp_rule_add(ctx, ok ? SCMP_ACT_ALLOW : SCMP_ACT_ERRNO(EAFNOSUPPORT), nr, 1,
                                 SCMP_A0(SCMP_CMP_EQ, fam));
        }
        if (r >= 0)
            r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), nr, 1,
                                 SCMP_A0(SCMP_CMP_GE, SOCKET_FAMILIES_CHECKED));
    }
    return r;
}

int seccomp_filter_build(seccomp_filter_t *f)
{
    *f = (seccomp_filter_t){ 0 };
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx)
        return -ENOMEM;
    int r = 0;
    /* Loaded as root by the spawn helpers (no NO_NEW_PRIVS needed); each child sets
     * NO_NEW_PRIVS itself, in its ordered list of steps. */
    (void)seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
    (void)seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2); /* binary tree: fewer insns */
    for (size_t i = 0; i < ELEMENTSOF(denied) && r >= 0; i++) {
        int nr = seccomp_syscall_resolve_name(denied[i]);
        if (nr == __NR_SCMP_ERROR)
            continue; /* not on this architecture */
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    }
    /* clone/clone3 with CLONE_NEWUSER (or any namespace flag): clone3 gets ENOSYS so libc falls
     * back to clone, whose flags we can inspect. */
    if (r >= 0)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    static const unsigned long ns_flags[] = { CLONE_NEWUSER,  CLONE_NEWNS,  CLONE_NEWPID,
                                              CLONE_NEWNET,   CLONE_NEWIPC, CLONE_NEWUTS,
                                              CLONE_NEWCGROUP };
    for (size_t i = 0; i < ELEMENTSOF(ns_flags) && r >= 0; i++)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    /* setns: the spawn helper installs this filter in itself once and every child inherits it
     * (no compile of the program per command), so the child's own first steps, entering the
     * sandbox mount and network namespaces, run under it. Exactly those two types pass; the
     * kernel then refuses them to the sandbox uid anyway (setns needs CAP_SYS_ADMIN, and a
     * sandbox can make no user namespace to hold it in). Refused here: type 0 (any namespace
     * the descriptor names), the user, pid, uts, ipc, cgroup and time types, and a pidfd's
     * several types at once. The type is an int: only the low 32 bits count. What this gives
     * up, knowingly: the filter no longer stops setns of those two types before the kernel's
     * own checks, should a sandbox ever hold a capability (it cannot, as above); the price of
     * keeping that layer would be a second filter loaded in every child after its setns. */
    static const unsigned long setns_refused[] = { CLONE_NEWUSER, CLONE_NEWPID,    CLONE_NEWUTS,
                                                   CLONE_NEWIPC,  CLONE_NEWCGROUP, CLONE_NEWTIME };
    if (r >= 0)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(setns), 1,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, 0));
    for (size_t i = 0; i < ELEMENTSOF(setns_refused) && r >= 0; i++)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(setns), 1,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, setns_refused[i], setns_refused[i]));
    if (r >= 0)
        r = seccomp_rule_add(
            ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(setns), 1,
            SCMP_A1(SCMP_CMP_MASKED_EQ, CLONE_NEWNS | CLONE_NEWNET, CLONE_NEWNS | CLONE_NEWNET));
    if (r >= 0)
        r = socket_families(ctx, true);
    if (r >= 0) /* faking terminal input into another session */
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, TIOCSTI));
    if (r < 0) {
        seccomp_release(ctx);
        return r;
    }
    return export_bpf(ctx, f);
}

void seccomp_filter_done(seccomp_filter_t *f)
{
    free(f->prog.filter);
    f->prog.filter = NULL;
    f->prog.len = 0;
}

long seccomp_filter_load_raw(const seccomp_filter_t *f)
{
    return syscall(SYS_prctl, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &f->prog, 0, 0);
}

/* ---- the default profile of every run --------------------------------------------------- */

/* What a run may call: the system calls of ordinary programs (the container default's list, in
 * spirit). Anything not named here fails with ENOSYS, as on a kernel that lacks it, so programs
 * fall back the way they do there; the dangerous families below fail with EPERM. */
static const char *const run_allowed[] = {
    "accept",
    "accept4",
    "access",
    "alarm",
    "arch_prctl",
    "bind",
    "brk",
    "capget",
    "capset",
    "chdir",
    "chmod",
    "chown",
    "chroot",
    "clock_getres",
    "clock_gettime",
    "clock_nanosleep",
    "close",
    "close_range",
    "connect",
    "copy_file_range",
    "creat",
    "dup",
    "dup2",
    "dup3",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_pwait",
    "epoll_pwait2",
    "epoll_wait",
    "eventfd",
    "eventfd2",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "faccessat",
    "faccessat2",
    "fadvise64",
    "fallocate",
    "fanotify_mark",
    "fchdir",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "fchown",
    "fchownat",
    "fcntl",
    "fdatasync",
    "fgetxattr",
    "flistxattr",
    "flock",
    "fork",
    "fremovexattr",
    "fsetxattr",
    "fstat",
    "fstatfs",
    "fsync",
    "ftruncate",
    "futex",
    "futex_waitv",
    "futimesat",
    "get_mempolicy",
    "get_robust_list",
    "get_thread_area",
    "getcpu",
    "getcwd",
    "getdents",
    "getdents64",
    "getegid",
    "geteuid",
    "getgid",
    "getgroups",
    "getitimer",
    "getpeername",
    "getpgid",
    "getpgrp",
    "getpid",
    "getppid",
    "getpriority",
    "getrandom",
    "getresgid",
    "getresuid",
    "getrlimit",
    "getrusage",
    "getsid",
    "getsockname",
    "getsockopt",
    "gettid",
    "gettimeofday",
    "getuid",
    "getxattr",
    "inotify_add_watch",
    "inotify_init",
    "inotify_init1",
    "inotify_rm_watch",
    "io_cancel",
    "io_destroy",
    "io_getevents",
    "io_pgetevents",
    "io_setup",
    "io_submit",
    "ioctl",
    "ioprio_get",
    "ioprio_set",
    "kcmp",
    "kill",
    "landlock_add_rule",
    "landlock_create_ruleset",
    "landlock_restrict_self",
    "lchown",
    "lgetxattr",
    "link",
    "linkat",
    "listen",
    "listxattr",
    "llistxattr",
    "lremovexattr",
    "lseek",
    "lsetxattr",
    "lstat",
    "madvise",
    "mbind",
    "membarrier",
    "memfd_create",
    "mincore",
    "mkdir",
    "mkdirat",
    "mknod",
    "mknodat",
    "mlock",
    "mlock2",
    "mlockall",
    "mmap",
    "mprotect",
    "mq_getsetattr",
    "mq_notify",
    "mq_open",
    "mq_timedreceive",
    "mq_timedsend",
    "mq_unlink",
    "mremap",
    "msgctl",
    "msgget",
    "msgrcv",
    "msgsnd",
    "msync",
    "munlock",
    "munlockall",
    "munmap",
    "name_to_handle_at",
    "nanosleep",
    "newfstatat",
    "open",
    "openat",
    "openat2",
    "pause",
    "personality",
    "pidfd_getfd",
    "pidfd_open",
    "pidfd_send_signal",
    "pipe",
    "pipe2",
    "pkey_alloc",
    "pkey_free",
    "pkey_mprotect",
    "poll",
    "ppoll",
    "prctl",
    "pread64",
    "preadv",
    "preadv2",
    "prlimit64",
    "process_madvise",
    "process_mrelease",
    "process_vm_readv",
    "process_vm_writev",
    "pselect6",
    "ptrace",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "read",
    "readahead",
    "readlink",
    "readlinkat",
    "readv",
    "recvfrom",
    "recvmmsg",
    "recvmsg",
    "remap_file_pages",
    "removexattr",
    "rename",
    "renameat",
    "renameat2",
    "restart_syscall",
    "rmdir",
    "rseq",
    "rt_sigaction",
    "rt_sigpending",
    "rt_sigprocmask",
    "rt_sigqueueinfo",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigtimedwait",
    "rt_tgsigqueueinfo",
    "sched_get_priority_max",
    "sched_get_priority_min",
    "sched_getaffinity",
    "sched_getattr",
    "sched_getparam",
    "sched_getscheduler",
    "sched_rr_get_interval",
    "sched_setaffinity",
    "sched_setattr",
    "sched_setparam",
    "sched_setscheduler",
    "sched_yield",
    "seccomp",
    "select",
    "semctl",
    "semget",
    "semop",
    "semtimedop",
    "sendfile",
    "sendmmsg",
    "sendmsg",
    "sendto",
    "set_mempolicy",
    "set_robust_list",
    "set_thread_area",
    "set_tid_address",
    "setfsgid",
    "setfsuid",
    "setgid",
    "setgroups",
    "setitimer",
    "setpgid",
    "setpriority",
    "setregid",
    "setresgid",
    "setresuid",
    "setreuid",
    "setrlimit",
    "setsid",
    "setsockopt",
    "setuid",
    "setxattr",
    "shmat",
    "shmctl",
    "shmdt",
    "shmget",
    "shutdown",
    "sigaltstack",
    "signalfd",
    "signalfd4",
    "splice",
    "stat",
    "statfs",
    "statx",
    "symlink",
    "symlinkat",
    "sync",
    "sync_file_range",
    "syncfs",
    "sysinfo",
    "tee",
    "tgkill",
    "time",
    "timer_create",
    "timer_delete",
    "timer_getoverrun",
    "timer_gettime",
    "timer_settime",
    "timerfd_create",
    "timerfd_gettime",
    "timerfd_settime",
    "times",
    "tkill",
    "truncate",
    "umask",
    "uname",
    "unlink",
    "unlinkat",
    "utime",
    "utimensat",
    "utimes",
    "vfork",
    "vmsplice",
    "wait4",
    "waitid",
    "write",
    "writev",
};

/* Named refusals (EPERM): kernel interfaces a run never gets, whatever its capabilities inside
 * its user namespace. */
static const char *const run_refused[] = {
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "open_by_handle_at",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "clock_settime",
    "clock_adjtime",
    "settimeofday",
    "adjtimex",
    "swapon",
    "swapoff",
    "reboot",
    "acct",
    "quotactl",
    "quotactl_fd",
    "iopl",
    "ioperm",
    "syslog",
    "lookup_dcookie",
    "vhangup",
    "sethostname",
    "setdomainname",
    "fanotify_init",
    "modify_ldt",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "nfsservctl",
    "move_pages",
    "memfd_secret",
};

static int add_names(scmp_filter_ctx ctx, const char *const *names, size_t n, uint32_t action)
{
    for (size_t i = 0; i < n; i++) {
        int nr = seccomp_syscall_resolve_name(names[i]);
        if (nr == __NR_SCMP_ERROR)
            continue; /* not on this architecture */
        int r = seccomp_rule_add(ctx, action, nr, 0);
        if (r < 0)
            return r;
    }
    return 0;
}

int seccomp_run_filter_build(seccomp_filter_t *f, bool pool_host)
{
    *f = (seccomp_filter_t){ 0 };
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(ENOSYS));
    if (!ctx)
        return -ENOMEM;
    (void)seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0); /* the node sets it, in order */
    (void)seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);
    int r = add_names(ctx, run_allowed, ELEMENTSOF(run_allowed), SCMP_ACT_ALLOW);
    if (r >= 0)
        r = add_names(ctx, run_refused, ELEMENTSOF(run_refused), SCMP_ACT_ERRNO(EPERM));
    /* New namespaces: never a user namespace (the run stays in the one the node made for it).
     * A pool host makes a network namespace per sandbox and enters it; a dedicated run makes
     * none. clone3 hides its flags from seccomp: ENOSYS, so libc falls back to clone. */
    const unsigned long refused_ns =
        pool_host ? CLONE_NEWUSER
                  : (CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC |
                     CLONE_NEWUTS | CLONE_NEWCGROUP);
    /* (clone3 is not on the allow-list: it gets the default ENOSYS) */
    if (r >= 0)
        r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, refused_ns, 0));
    static const unsigned long ns_flags[] = { CLONE_NEWUSER,  CLONE_NEWNS,  CLONE_NEWPID,
                                              CLONE_NEWNET,   CLONE_NEWIPC, CLONE_NEWUTS,
                                              CLONE_NEWCGROUP };
    for (size_t i = 0; i < ELEMENTSOF(ns_flags) && r >= 0; i++)
        if (refused_ns & ns_flags[i])
            r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                 SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
    if (r >= 0 && pool_host) {
        r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(unshare), 1,
                             SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, 0));
        if (r >= 0)
            r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 1,
                                 SCMP_A0(SCMP_CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER));
        if (r >= 0)
            r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(setns), 0);
    } else if (r >= 0) {
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 0);
        if (r >= 0)
            r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(setns), 0);
    }
    if (r >= 0)
        r = socket_families(ctx, false);
    /* ioctl stays allowed whole: libseccomp drops a conditional refusal beside an unconditional
     * allow, and a run shares no terminal with the host (TIOCSTI reaches only its own ptys);
     * pooled sandboxes, which share a host, refuse TIOCSTI in their own filter. */
    if (r < 0) {
        seccomp_release(ctx);
        return r;
    }
    return export_bpf(ctx, f);
}
