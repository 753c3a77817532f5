/* SPDX-License-Identifier: MIT */
/* Environments for execve: a base list, then the entries of JSON objects of strings (a job's
 * env and secrets, a sandbox's or a command's env) laid over it, each checked by the caller's
 * rules. The one builder of sbx-node's runs, sbx-server's sandboxes and its commands. */
#pragma once

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "err.h"

typedef struct {
    const char *name; /* in messages: "env", "secrets" */
    json_t *obj;      /* an object of strings; NULL: none */
} env_overlay_t;

typedef struct {
    /* Names [A-Za-z_][A-Za-z0-9_]* (env_name_valid); else any non-empty name without '='. */
    bool portable_names;
    /* An overlay's entry replaces the base's entry of that name; else both stay, base first. */
    bool replace;
    const char *const *reserved; /* names no overlay may set (NULL-terminated), or NULL */
    size_t max_entries;          /* of the whole result; 0: no cap */
    size_t max_bytes;            /* of the overlays' "NAME=value\0" entries; 0: no cap */
} env_rules_t;

/* The base entries ("NAME=value"; an entry without '=' is left out) and the overlays' entries
 * in order, as a malloc'd NULL-terminated list in *ret (free with strv_free). -EINVAL with a
 * message when an overlay breaks the rules (not an object, a bad name, a reserved name, a
 * value that is not a string without NUL, too large), -E2BIG past max_entries, -ENOMEM. */
int env_build(char *const *base, const env_overlay_t *overlays, size_t n_overlays,
              const env_rules_t *rules, char ***ret, sbx_err_t *err);

/* Free a NULL-terminated list of malloc'd strings and the list; NULL is fine. */
void strv_free(char **v);
static inline void strv_freep(char ***v) { strv_free(*v); }
#define _cleanup_strv_free_ _cleanup_(strv_freep)
