/* SPDX-License-Identifier: MIT */
/* The environment builder and the error object (src/common/env.c, src/common/err.c). */
#include <errno.h>
#include <string.h>

#include "common/env.h"
#include "common/err.h"
#include "tap.h"

static size_t count(char **v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    return n;
}

TEST(err_object)
{
    sbx_err_t e = { 0 };
    ASSERT_EQ(sbx_err(&e, -EINVAL, "bad %s %d", "thing", 7), -EINVAL);
    ASSERT_EQ(e.code, -EINVAL);
    ASSERT_STREQ(e.msg, "bad thing 7");
    ASSERT_EQ(sbx_err(NULL, -ENOENT, "nobody reads this"), -ENOENT); /* no message wanted */
}

TEST(env_replace_and_append)
{
    char *const base[] = { "PATH=/bin", "HOME=/root", "NOEQUALS", NULL };
    json_t *o = json_pack("{s:s,s:s}", "HOME", "/home/x", "A", "1");
    const env_overlay_t ov = { "env", o };
    _cleanup_strv_free_ char **v = NULL;
    /* replace: the overlay's HOME replaces the base's; an entry without '=' is left out */
    ASSERT_EQ(env_build(base, &ov, 1, &(env_rules_t){ .replace = true }, &v, NULL), 0);
    ASSERT_EQ_U(count(v), 3);
    ASSERT_STREQ(v[0], "PATH=/bin");
    ASSERT_STREQ(v[1], "HOME=/home/x");
    ASSERT_STREQ(v[2], "A=1");
    strv_free(v);
    v = NULL;
    /* append: both stay, the base's first */
    ASSERT_EQ(env_build(base, &ov, 1, &(env_rules_t){ 0 }, &v, NULL), 0);
    ASSERT_EQ_U(count(v), 4);
    ASSERT_STREQ(v[1], "HOME=/root");
    ASSERT_STREQ(v[2], "HOME=/home/x");
    json_decref(o);
}

TEST(env_refusals)
{
    static const char *const reserved[] = { "SBX_LISTEN", NULL };
    const env_rules_t strict = {
        .portable_names = true, .reserved = reserved, .max_entries = 3, .max_bytes = 32
    };
    struct {
        const char *json;
        int want;
    } cases[] = {
        { "[1]", -EINVAL },                                         /* not an object */
        { "{\"1A\":\"x\"}", -EINVAL },                              /* not a portable name */
        { "{\"A-B\":\"x\"}", -EINVAL },                             /* not a portable name */
        { "{\"SBX_LISTEN\":\"x\"}", -EINVAL },                      /* reserved */
        { "{\"A\":1}", -EINVAL },                                   /* not a string */
        { "{\"A\":\"a\\u0000b\"}", -EINVAL },                       /* NUL in the value */
        { "{\"A\":\"0123456789012345678901234567890\"}", -EINVAL }, /* max_bytes */
        { "{\"A\":\"1\",\"B\":\"2\",\"C\":\"3\"}", -E2BIG },        /* max_entries (base: 1) */
        { "{\"A\":\"1\",\"B\":\"2\"}", 0 },                         /* positive control */
    };
    char *const base[] = { "PATH=/bin", NULL };
    for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
        json_t *o = json_loads(cases[i].json, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        ASSERT_TRUE(o != NULL);
        const env_overlay_t ov = { "env", o };
        _cleanup_strv_free_ char **v = NULL;
        sbx_err_t e = { 0 };
        ASSERT_EQ(env_build(base, &ov, 1, &strict, &v, &e), cases[i].want);
        if (cases[i].want < 0) {
            ASSERT_EQ(e.code, cases[i].want);
            ASSERT_TRUE(v == NULL);
        }
        json_decref(o);
    }
    /* the lax names: anything non-empty without '=' */
    json_t *o = json_pack("{s:s}", "a-b.c", "x");
    const env_overlay_t ov = { "env", o };
    _cleanup_strv_free_ char **v = NULL;
    ASSERT_EQ(env_build(base, &ov, 1, &(env_rules_t){ 0 }, &v, NULL), 0);
    json_decref(o);
}

TAP_MAIN(T(err_object), T(env_replace_and_append), T(env_refusals))
