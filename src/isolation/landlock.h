/* SPDX-License-Identifier: MIT */
/* Landlock rulesets for pooled sandboxes. The Debian 12 headers stop at ABI 2, so the newer
 * constants and the 24-byte ruleset attribute are defined here (values from the kernel UAPI). */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LL_ACCESS_FS_EXECUTE (1ULL << 0)
#define LL_ACCESS_FS_WRITE_FILE (1ULL << 1)
#define LL_ACCESS_FS_READ_FILE (1ULL << 2)
#define LL_ACCESS_FS_READ_DIR (1ULL << 3)
#define LL_ACCESS_FS_REMOVE_DIR (1ULL << 4)
#define LL_ACCESS_FS_REMOVE_FILE (1ULL << 5)
#define LL_ACCESS_FS_MAKE_CHAR (1ULL << 6)
#define LL_ACCESS_FS_MAKE_DIR (1ULL << 7)
#define LL_ACCESS_FS_MAKE_REG (1ULL << 8)
#define LL_ACCESS_FS_MAKE_SOCK (1ULL << 9)
#define LL_ACCESS_FS_MAKE_FIFO (1ULL << 10)
#define LL_ACCESS_FS_MAKE_BLOCK (1ULL << 11)
#define LL_ACCESS_FS_MAKE_SYM (1ULL << 12)
#define LL_ACCESS_FS_REFER (1ULL << 13)     /* ABI 2 */
#define LL_ACCESS_FS_TRUNCATE (1ULL << 14)  /* ABI 3 */
#define LL_ACCESS_FS_IOCTL_DEV (1ULL << 15) /* ABI 5 */
#define LL_ACCESS_NET_BIND_TCP (1ULL << 0)  /* ABI 4 */
#define LL_ACCESS_NET_CONNECT_TCP (1ULL << 1)
#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0) /* ABI 6 */
#define LL_SCOPE_SIGNAL (1ULL << 1)

typedef struct {
    int abi;             /* 0 = Landlock unavailable */
    uint64_t handled_fs; /* everything this ABI can handle */
    uint64_t handled_net;
    uint64_t scoped;
    int sys_fds[16]; /* O_PATH fds of system directories, opened once */
    uint64_t sys_access[16];
    int n_sys;
} landlock_base_t;

int landlock_abi(void);
/* Comma-separated feature names for an ABI ("fs,refer,truncate,no_tcp_bind,ioctl_dev,scope_abstract_unix"). */
void landlock_features(int abi, char *out, size_t cap);
/* The same names one by one: the i-th feature of abi, or NULL past the last (none for 0). */
const char *landlock_feature(int abi, int i);
/* Probe the ABI and open the system directories once. proc_path is the /proc to allow
 * (a private hidepid mount may live elsewhere). */
int landlock_base_init(landlock_base_t *b, const char *proc_path);
void landlock_base_done(landlock_base_t *b);
/* A ruleset fd for one sandbox: the base rules plus full access beneath home_fd. */
int landlock_ruleset_for_home(const landlock_base_t *b, int home_fd, int *ret_fd);
/* Raw syscall wrapper (used in the confined child). */
long landlock_restrict_self_raw(int ruleset_fd);
