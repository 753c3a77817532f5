/* SPDX-License-Identifier: MIT */
/* User namespaces for runs. The node makes each run's user namespace first, with its ids
 * 0..count-1 mapped onto a block of host ids; the run's other namespaces are made by the node
 * as host root and stay owned by the host's user namespace, and the run's process enters its
 * user namespace last (setns), just before exec. So root in a run holds capabilities only over
 * what its own user namespace owns (its files, its processes) and none over its mount, network,
 * pid, ipc or uts namespaces: it cannot mount, unmount a mask, configure interfaces or set the
 * host name, and outside the run it is the unprivileged host uid `base`. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

/* A user namespace mapping uid and gid 0..count-1 onto base..base+count-1; *ret_fd is an fd of
 * it (O_CLOEXEC). setgroups() stays allowed inside (the map is written by a privileged
 * process), so programs in the run may drop or set supplementary groups among its own ids. */
int userns_create(uint32_t base, uint32_t count, int *ret_fd);

/* Map ids 0..count-1 of the user namespace of pid (not yet mapped) onto base..base+count-1,
 * uids and gids alike. */
int userns_write_maps(pid_t pid, uint32_t base, uint32_t count);

/* In a single-threaded child: enter the user namespace and become its root (uid 0 and gid 0 of
 * the namespace, no supplementary groups). Raw system calls only (safe after clone/fork).
 * Returns 0 or -errno. */
int userns_enter_as_root(int userns_fd);

/* Run argv (absolute path) as root of a fresh user namespace mapped onto base (count ids), in
 * directory dirfd, with stdin/stdout from the given fds (-1: /dev/null), and wait for it.
 * What the program does to files is done with the run's own ids: files it creates are owned by
 * base+x on the host, files of other owners it cannot touch, and it has no privilege outside
 * the mapping. Used for tar archives of a run's root and for restoring them. 0 if it exited 0,
 * -EIO if it failed (status in *ret_status when not NULL). */
int userns_run(uint32_t base, uint32_t count, int dirfd, int in_fd, int out_fd, char *const argv[],
               int *ret_status);
/* The same without waiting: *ret_pid is the child (the caller reaps it). */
int userns_spawn(uint32_t base, uint32_t count, int dirfd, int in_fd, int out_fd,
                 char *const argv[], pid_t *ret_pid);
