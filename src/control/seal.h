/* SPDX-License-Identifier: MIT */
/* Secrets at rest: values the control plane keeps in its store that must not be readable from
 * the store alone (signing keys' secret parts, job secrets) are sealed under a key kept in a
 * file outside the store (<state>/secrets.key by default).
 *
 * The key file holds one or more keys, one a line, "<kid> <base64url of 32 bytes>" ('#' starts
 * a comment line); the first is the current key (what new values are sealed under), the others
 * are older keys still accepted for opening (a rotation in progress). It must be a regular file
 * owned by root or by the running uid, with no group or other permission bits.
 *
 * A sealed value is the text "sbxenc1.<kid>.<base64url of nonce || secretbox ciphertext>". */
#pragma once

#include <sodium.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define SEAL_PREFIX "sbxenc1."
#define SEAL_KID_LEN 8 /* lowercase hex */
#define SEAL_KEYS_MAX 8
#define SEAL_FILE_MAX 4096
#define SEAL_VALUE_MAX (1024 * 1024) /* plaintext bytes */

typedef struct {
    char kid[SEAL_KID_LEN + 1];
    uint8_t key[crypto_secretbox_KEYBYTES];
} seal_key_t;

typedef struct {
    seal_key_t keys[SEAL_KEYS_MAX]; /* keys[0]: the current key */
    size_t n;
} seal_keys_t;

/* A fresh key (crypto_secretbox_keygen) with a random kid. */
int seal_key_generate(seal_key_t *ret);

/* Read and check the key file. -ENOENT when absent; -EPERM when its mode or owner is refused,
 * -EINVAL when malformed; err (may be NULL) gets a sentence for the operator on failure. */
int seal_keys_load(const char *path, seal_keys_t *ret, sbx_err_t *err);
/* Load the key file, or make it (one fresh key, mode 0600, O_EXCL: of processes racing to make
 * it, one wins and the others read that one). *ret_created tells which happened. */
int seal_keys_load_or_create(const char *path, seal_keys_t *ret, bool *ret_created, sbx_err_t *err);
/* Replace the key file atomically (a 0600 temporary file beside it, fsync, rename, fsync of
 * the directory): a crash leaves either the old file or the new one. */
int seal_keys_write(const char *path, const seal_keys_t *k);

/* Whether v (len bytes) is a sealed value (by its prefix; says nothing of its integrity). */
bool seal_is_sealed(const char *v, size_t len);
/* Whether v is sealed under kid (its prefix names kid). */
bool seal_has_kid(const char *v, size_t len, const char *kid);

/* Seal len bytes of pt for the record named `record` (the store key it is written under) with
 * the current key. *ret: a malloc'd NUL-terminated sealed value. */
int seal_value(const seal_keys_t *k, const char *record, const void *pt, size_t len, char **ret);
/* Open a sealed value of record `record`. *ret: malloc'd plaintext (NUL-terminated beyond
 * *ret_len; the caller wipes and frees it); *ret_index (may be NULL): the key that opened it
 * (0: the current key). -EINVAL: not a sealed value; -ENOKEY: sealed under a kid the key file
 * does not hold; -EBADMSG: the ciphertext does not authenticate (altered, truncated, or moved
 * from another record). Never returns unauthenticated bytes. */
int seal_open(const seal_keys_t *k, const char *record, const char *v, size_t len, char **ret,
              size_t *ret_len, size_t *ret_index);
