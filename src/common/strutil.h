/* SPDX-License-Identifier: MIT */
/* Length-carrying string views and strict number parsers. Nothing here relies on NUL. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *p;
    size_t len;
} sv_t;

#define SV(s) ((sv_t){ (s), sizeof(s) - 1 })
#define SV_FMT "%.*s"
#define SV_ARG(v) (int)(v).len, (v).p

static inline sv_t sv_make(const char *p, size_t len) { return (sv_t){ p, len }; }
bool sv_eq(sv_t a, sv_t b);
bool sv_eq_lit_nocase(sv_t a, const char *lit);
bool sv_has_prefix(sv_t a, sv_t prefix);
/* Whether a begins with lit, ASCII letters in any case. */
bool sv_has_prefix_lit_nocase(sv_t a, const char *lit);

/* Digits only, no sign, no whitespace, no leading '+'; max is inclusive.
 * Return 0 or -EINVAL (not a number) / -ERANGE (above max). */
int parse_u64(sv_t s, uint64_t max, uint64_t *ret);
/* Same for a NUL-terminated string (configuration values). */
int parse_u64_str(const char *s, uint64_t max, uint64_t *ret);
/* Octal digits only (file modes). */
int parse_octal(sv_t s, uint32_t max, uint32_t *ret);
/* A non-negative decimal with optional fraction ("1", "0.5", "2.25"); returns milliseconds. */
int parse_seconds_ms(sv_t s, uint64_t max_ms, uint64_t *ret_ms);

/* Decode %XX and '+' (as space) of a query component into out (capacity outcap).
 * Return the decoded length or -EINVAL on a malformed escape / -E2BIG. */
int url_decode(sv_t in, char *out, size_t outcap, bool plus_is_space);

/* Find a query parameter value (raw, still encoded) in "a=1&b=2". */
bool query_get_raw(sv_t query, const char *name, sv_t *ret);

/* Valid UTF-8 prefix length of buf; *ret_incomplete is set to the number of trailing bytes
 * that start a valid but unfinished sequence (0..3). Invalid bytes stop the scan. */
size_t utf8_valid_prefix(const unsigned char *buf, size_t len, size_t *ret_incomplete);
bool utf8_valid(const unsigned char *buf, size_t len);

/* Whether s is a numeric loopback address (127.0.0.0/8 or ::1). */
bool addr_is_loopback(const char *s);

/* "IP:PORT" or "[IPv6]:PORT" with a numeric address and a port 1..65535: the address (without
 * brackets, NUL-terminated, at most hcap - 1 bytes) and the port; -EINVAL otherwise. The one
 * address parser of the daemons' flags and of node registration. */
int parse_hostport(const char *s, char *host, size_t hcap, uint16_t *ret_port);

/* An environment variable name jobs and runs accept: [A-Za-z_][A-Za-z0-9_]*, at most 128
 * bytes (the control plane checks it at create, the node again before a run starts). */
#define ENV_NAME_MAX 128
bool env_name_valid(const char *k);
