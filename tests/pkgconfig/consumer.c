/* SPDX-License-Identifier: MIT */
/* A program outside the build, compiled with nothing but `pkg-config --cflags --libs libsbx`
 * against an installed libsbx (tests/scripts/test_pkgconfig.sh installs it into a scratch
 * DESTDIR). It checks that the library it runs is that installed one, that a call computes
 * what it must, and that bad endpoints come back as error values with reasons.
 *
 *   consumer DESTDIR HMAC   HMAC: hex HMAC-SHA256("api-token", "sbx-sandbox:0123abcd") */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <sbx/sbx.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    if (argc != 3) {
        fputs("usage: consumer DESTDIR HMAC\n", stderr);
        return 2;
    }
    /* the library this process runs is the one installed under DESTDIR */
    Dl_info info;
    CHECK(dladdr((void *)sbx_client_new, &info) != 0 && info.dli_fname &&
              strncmp(info.dli_fname, argv[1], strlen(argv[1])) == 0,
          "sbx_client_new from %s, not under %s", info.dli_fname ? info.dli_fname : "?", argv[1]);

    char tok[65];
    int r = sbx_derive_token("api-token", "0123abcd", tok);
    CHECK(r == 0 && strcmp(tok, argv[2]) == 0, "derive: %d [%s] want [%s]", r, tok, argv[2]);

    sbx_client_t *c = NULL;
    sbx_error_t e = { 0 };
    sbx_config_t bad = { .endpoint = "ftp://x", .token = "t" };
    r = sbx_client_new(&bad, &c, &e);
    CHECK(r == -EINVAL && e.code == -EINVAL && c == NULL && strstr(e.message, "https://"),
          "ftp endpoint: %d (code %d) %s", r, e.code, e.message);

    /* nothing listens on port 1: a connect error, no HTTP status, a message that says what to
     * do (positive control for the error path: the client itself is made) */
    sbx_config_t dead = { .endpoint = "http://127.0.0.1:1", .token = "t" };
    memset(&e, 0, sizeof e);
    r = sbx_client_new(&dead, &c, &e);
    CHECK(r == 0 && c != NULL, "client for a plain-HTTP loopback endpoint: %d %s", r, e.message);
    if (c) {
        CHECK(strcmp(sbx_client_endpoint(c), "http://127.0.0.1:1") == 0, "endpoint %s",
              sbx_client_endpoint(c));
        char *json = NULL;
        r = sbx_jobs_list(c, NULL, 0, &json, &e);
        CHECK(r == -ECONNREFUSED && e.code == r && e.http_status == 0 && json == NULL &&
                  strstr(e.message, "sbx up"),
              "dead endpoint: %d (status %d) %s", r, e.http_status, e.message);
        sbx_client_free(c);
    }
    if (failures)
        return 1;
    puts("consumer: ok");
    return 0;
}
