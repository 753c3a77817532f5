/* SPDX-License-Identifier: MIT */
#include "filter.h"

#include <errno.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
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
    "setns",
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

int seccomp_filter_build(seccomp_filter_t *f)
{
    *f = (seccomp_filter_t){ 0 };
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx)
        return -ENOMEM;
    int r = 0;
    /* The child sets NO_NEW_PRIVS itself, in its ordered list of steps. */
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
    if (r >= 0) /* faking terminal input into another session */
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                             SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, TIOCSTI));
    if (r < 0) {
        seccomp_release(ctx);
        return r;
    }
    /* Export the BPF once; children only load it. */
    int fds[2];
    if (pipe2(fds, 0) < 0) {
        seccomp_release(ctx);
        return negative_errno();
    }
    r = seccomp_export_bpf(ctx, fds[1]);
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
