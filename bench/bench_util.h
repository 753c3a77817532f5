/* SPDX-License-Identifier: MIT */
/* Helpers shared by the benchmarks: clocks, figure printing, /proc readings, percentiles. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

uint64_t now_ns(void);
void section(const char *title);
void fig(const char *label, double v, const char *unit, const char *note);
const char *target_note(bool met, const char *target, char *buf, size_t cap);
ssize_t read_small_file(const char *path, char *buf, size_t cap);
/* CPU time the process has used (schedstat, else utime+stime). */
uint64_t server_cpu_ns(pid_t pid);
uint64_t server_tree_cpu_ns(pid_t pid);
/* The pct-th percentile of v, which must be sorted or is sorted in place. */
uint64_t percentile(const uint64_t *v, size_t n, unsigned pct);
/* qsort comparator for uint64_t. */
int cmp_u64(const void *a, const void *b);
void print_loadavg(const char *when);
/* Print a free loopback TCP port (for the scripts); returns the exit status. */
int free_port(void);
/* Whether `name` is in the comma-separated `only` list (NULL: everything). */
bool bench_want(const char *only, const char *name);
