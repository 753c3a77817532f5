/* SPDX-License-Identifier: MIT */
#include "spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/wait.h>

#include "common/env.h"
#include "common/macro.h"
#include "common/strutil.h"
#include "pool.h"
#include "server.h"
#include "spawner.h"

void exec_spec_done(exec_spec_t *spec)
{
    json_decref(spec->cmd);
    strv_free(spec->argv);
    strv_free(spec->envp);
    free(spec->cwd);
    free(spec->stdin_data);
    free(spec->tag);
    *spec = (exec_spec_t){ 0 };
}

static int parse_argv(json_t *cmd, json_t *shell, char ***ret, sbx_err_t *err)
{
    bool is_str = json_is_string(cmd), is_arr = json_is_array(cmd);
    if (!is_str && !is_arr) {
        return sbx_err(err, -EINVAL, "cmd must be a string or an array of strings");
    }
    if (shell && !json_is_boolean(shell)) {
        return sbx_err(err, -EINVAL, "shell must be a boolean");
    }
    if (shell && json_is_true(shell) && !is_str) {
        return sbx_err(err, -EINVAL, "shell:true requires cmd to be a string");
    }
    if (shell && json_is_false(shell) && !is_arr) {
        return sbx_err(err, -EINVAL, "shell:false requires cmd to be an array");
    }
    size_t n = is_str ? 3 : json_array_size(cmd);
    if (n == 0) {
        return sbx_err(err, -EINVAL, "cmd must not be empty");
    }
    if (n > 65536) {
        return sbx_err(err, -EINVAL, "cmd has too many arguments");
    }
    char **v = calloc(n + 1, sizeof *v);
    if (!v)
        return -ENOMEM;
    if (is_str) {
        const char *s = json_string_value(cmd);
        if (strlen(s) != json_string_length(cmd)) {
            free(v);
            return sbx_err(err, -EINVAL, "cmd must not contain NUL");
        }
        v[0] = strdup("/bin/sh");
        v[1] = strdup("-c");
        v[2] = strdup(s);
    } else {
        for (size_t i = 0; i < n; i++) {
            json_t *a = json_array_get(cmd, i);
            if (!json_is_string(a) || strlen(json_string_value(a)) != json_string_length(a)) {
                strv_free(v);
                return sbx_err(err, -EINVAL, "cmd array items must be strings without NUL");
            }
            v[i] = strdup(json_string_value(a));
            if (!v[i]) {
                strv_free(v);
                return -ENOMEM;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        if (!v[i]) {
            strv_free(v);
            return -ENOMEM;
        }
    *ret = v;
    return 0;
}

/* base env (minus names the request sets) + request env. */
static int build_env(json_t *env, char *const *base, char ***ret, sbx_err_t *err)
{
    const env_overlay_t ov = { "env", env };
    const env_rules_t rules = { .replace = true, .max_bytes = EXEC_MAX_ENV_BYTES };
    return env_build(base, &ov, 1, &rules, ret, err);
}

static int get_opt_string(json_t *o, const char *name, char **ret, sbx_err_t *err, const char *msg)
{
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
        return sbx_err(err, -EINVAL, "%s", msg);
    }
    *ret = strdup(json_string_value(v));
    return *ret ? 0 : -ENOMEM;
}

static int get_opt_bool(json_t *o, const char *name, bool *ret, sbx_err_t *err, const char *msg)
{
    json_t *v = json_object_get(o, name);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        return sbx_err(err, -EINVAL, "%s", msg);
    }
    *ret = json_is_true(v);
    return 0;
}

static int parse_stdin(json_t *o, exec_spec_t *spec, sbx_err_t *err)
{
    json_t *in = json_object_get(o, "stdin"), *in64 = json_object_get(o, "stdin_b64");
    if (in && !json_is_null(in)) {
        if (json_is_boolean(in)) { /* stdin:true = keep a stdin stream open (background) */
            spec->stdin_stream = json_is_true(in);
        } else if (json_is_string(in)) {
            spec->stdin_len = json_string_length(in);
            spec->stdin_data = malloc(spec->stdin_len + 1);
            if (!spec->stdin_data)
                return -ENOMEM;
            memcpy(spec->stdin_data, json_string_value(in), spec->stdin_len);
            spec->has_stdin = true;
        } else {
            return sbx_err(err, -EINVAL, "stdin must be a string");
        }
    }
    if (in64 && !json_is_null(in64)) {
        if (!json_is_string(in64) || spec->has_stdin) {
            return sbx_err(err, -EINVAL, "stdin_b64 must be a base64 string (and excludes stdin)");
        }
        size_t l = json_string_length(in64), out;
        spec->stdin_data = malloc(l / 4 * 3 + 3);
        if (!spec->stdin_data)
            return -ENOMEM;
        if (sodium_base642bin((unsigned char *)spec->stdin_data, l / 4 * 3 + 3,
                              json_string_value(in64), l, NULL, &out, NULL,
                              sodium_base64_VARIANT_ORIGINAL) != 0) {
            return sbx_err(err, -EINVAL, "stdin_b64 is not valid base64");
        }
        spec->stdin_len = out;
        spec->has_stdin = true;
    }
    return 0;
}

int exec_spec_parse(json_t *o, char *const *base_env, exec_spec_t *spec, sbx_err_t *err)
{
    int r;
    *spec = (exec_spec_t){ 0 };
    json_t *cmd = json_object_get(o, "cmd");
    if (!cmd)
        return sbx_err(err, -EINVAL, "cmd is required");
    spec->cmd = json_incref(cmd);
    r = parse_argv(cmd, json_object_get(o, "shell"), &spec->argv, err);
    if (r >= 0)
        r = build_env(json_object_get(o, "env"), base_env, &spec->envp, err);
    if (r >= 0)
        r = get_opt_string(o, "cwd", &spec->cwd, err, "cwd must be a string");
    if (r >= 0)
        r = get_opt_string(o, "tag", &spec->tag, err, "tag must be a string");
    if (r >= 0)
        r = get_opt_bool(o, "background", &spec->background, err, "background must be a boolean");
    if (r >= 0)
        r = parse_stdin(o, spec, err);
    json_t *t = json_object_get(o, "timeout");
    if (r >= 0 && t && !json_is_null(t)) {
        double secs = json_is_number(t) ? json_number_value(t) : -1;
        if (!json_is_number(t) || secs < 0 || secs > 31536000.0)
            r = sbx_err(err, -EINVAL, "timeout must be a number of seconds between 0 and one year");
        else {
            spec->timeout_ms = (uint64_t)(secs * 1000.0 + 0.5);
            if (secs > 0 && spec->timeout_ms == 0)
                spec->timeout_ms = 1;
        }
    }
    json_t *enc = json_object_get(o, "encoding");
    if (r >= 0 && enc && !json_is_null(enc)) {
        const char *e = json_is_string(enc) ? json_string_value(enc) : "";
        if (streq(e, "base64"))
            spec->base64 = true;
        else if (!streq(e, "utf8") && !streq(e, "utf-8"))
            r = sbx_err(err, -EINVAL, "encoding must be \"utf8\" or \"base64\"");
    }
    if (r < 0) {
        exec_spec_done(spec);
        if (err && err->code != r) /* an allocation failed below: no message was set */
            (void)sbx_err(err, r, "%s", r == -ENOMEM ? "out of memory" : strerror(-r));
    }
    return r;
}

void spawned_close(spawned_t *sp)
{
    sp->in_fd = safe_close(sp->in_fd);
    sp->out_fd = safe_close(sp->out_fd);
    sp->err_fd = safe_close(sp->err_fd);
}

static int make_pipe(int p[2], bool parent_reads)
{
    if (pipe2(p, O_CLOEXEC) < 0)
        return negative_errno();
    int ours = parent_reads ? p[0] : p[1];
    (void)fcntl(ours, F_SETFL, O_NONBLOCK);
    return 0; /* an output pipe is grown when bulk output fills it (outpipe_read) */
}

typedef struct {
    spawn_done_cb done;
    void *data;
    sandbox_t *sb; /* a reference */
    spawned_t sp;  /* our ends; pid filled in by the answer */
} spawn_req_t;

static void spawn_answered(void *p, int r, pid_t pid, int kill_fd, int events_fd, const char *err)
{
    spawn_req_t *q = p;
    q->sp.cg.kill_fd = kill_fd;
    q->sp.cg.events_fd = events_fd;
    if (r >= 0 && q->sb && q->sb->deleted) {
        /* Deleted while the helper started it: it must not run on. Its teardown (after this
         * answer, spawner_settle_sandbox) verifies the uid is empty. */
        (void)kill(-pid, SIGKILL);
        sandbox_cmd_kill(&q->sp.cg);
        q->sp.cg.kill_fd = safe_close(q->sp.cg.kill_fd);
        r = -ESRCH;
        err = "sandbox has been deleted";
    }
    if (r < 0) {
        spawned_close(&q->sp);
        sandbox_cmd_done(&q->sp.cg);
        q->done(q->data, r, NULL, err);
    } else {
        q->sp.pid = pid;
        q->done(q->data, 0, &q->sp, "");
    }
    sandbox_unref(q->sb);
    free(q);
}

/* Dedicated mode: posix_spawnp's candidates (the server's own PATH, its default when unset). */
static int plain_candidates(confine_spec_t *c, const char *argv0, char *buf, size_t cap)
{
    const char *path = getenv("PATH");
    return confine_resolve_candidates(c, argv0, path ? path : "/bin:/usr/bin", buf, cap);
}

/* A pseudo-terminal: p[0] the master (ours, non-blocking), p[1] its slave (the child's), got
 * from the master itself (TIOCGPTPEER), never by a path name. */
static int make_pty(int p[2], unsigned short rows, unsigned short cols)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (m < 0)
        return negative_errno();
    struct winsize ws = { .ws_row = rows ? rows : 24, .ws_col = cols ? cols : 80 };
    if (unlockpt(m) < 0 || ioctl(m, TIOCSWINSZ, &ws) < 0) {
        int r = negative_errno();
        close(m);
        return r;
    }
    int sl = ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (sl < 0) {
        int r = negative_errno();
        close(m);
        return r;
    }
    (void)fcntl(m, F_SETFL, O_NONBLOCK);
    p[0] = m;
    p[1] = sl;
    return 0;
}

/* The pty's stdio: the slave thrice for the child; the master for output, a second descriptor
 * of it for input. */
static int pty_stdio(const exec_spec_t *spec, int out[2], int errp[2], int in[2])
{
    int r = make_pty(out, spec->pty_rows, spec->pty_cols);
    if (r < 0)
        return r;
    in[0] = errp[1] = -1; /* the child's stdin and stderr are out[1] too (below) */
    errp[0] = -1;
    in[1] = fcntl(out[0], F_DUPFD_CLOEXEC, 3);
    return in[1] < 0 ? negative_errno() : 0;
}

int spawn_command(server_t *s, const exec_spec_t *spec, sandbox_t *sb, spawn_done_cb done,
                  void *data, sbx_err_t *err)
{
    int out[2] = { -1, -1 }, errp[2] = { -1, -1 }, in[2] = { -1, -1 };
    int r;
    bool want_in = spec->has_stdin || spec->stdin_stream || spec->pty;

    if (!s->spawner && (r = spawner_new(s, &s->spawner)) < 0)
        return sbx_err(err, r, "cannot start the spawn helpers: %s", strerror(-r));
    spawn_req_t *q = calloc(1, sizeof *q);
    if (!q)
        return sbx_err(err, -ENOMEM, "%s", strerror(ENOMEM));
    if (spec->pty) {
        if ((r = pty_stdio(spec, out, errp, in)) < 0) {
            (void)sbx_err(err, r, "cannot make a pseudo-terminal: %s", strerror(-r));
            goto fail;
        }
    } else {
        if ((r = make_pipe(out, true)) < 0 || (r = make_pipe(errp, true)) < 0) {
            (void)sbx_err(err, r, "%s", strerror(ENOMEM)); /* the message it always had */
            goto fail;
        }
        /* Without stdin data the command reads EOF from an empty pipe; no /dev/null is needed,
         * so the server also works in a root filesystem that has no /dev. */
        if ((r = make_pipe(in, false)) < 0) {
            (void)sbx_err(err, r, "%s", strerror(ENOMEM));
            goto fail;
        }
        if (!want_in)
            in[1] = safe_close(in[1]);
    }
    /* the child's ends (on a pty, its slave for all three) */
    int child_in = spec->pty ? out[1] : in[0], child_err = spec->pty ? out[1] : errp[1];
    confine_spec_t c = { 0 };
    char cands[8192];
    int owned[3] = { out[1], in[0], errp[1] };
    int n_owned = spec->pty ? 1 : 3;
    cmdcg_t cg = CMDCG_NONE;
    cmdcg_req_t cgq = { .root = NULL };
    if (sb) {
        r = sandbox_exec_prepare(sb, spec->argv, spec->envp, spec->cwd, child_in, out[1], child_err,
                                 &c, cands, sizeof cands, &cgq, &cg, err);
    } else {
        c = (confine_spec_t){ .argv = spec->argv,
                              .envp = spec->envp,
                              .home_path = spec->cwd, /* the cwd (NULL: the server's) */
                              .stdin_fd = child_in,
                              .stdout_fd = out[1],
                              .stderr_fd = child_err,
                              .mntns_fd = -1,
                              .netns_fd = -1,
                              .ruleset_fd = -1 };
        r = plain_candidates(&c, spec->argv[0], cands, sizeof cands);
        if (r < 0)
            (void)sbx_err(err, r, "%s", strerror(-r));
    }
    if (r < 0)
        goto fail;
    c.new_session = spec->pty;
    *q = (spawn_req_t){ .done = done,
                        .data = data,
                        .sb = sandbox_ref(sb),
                        .sp = { .pid = 0,
                                .in_fd = want_in ? in[1] : -1,
                                .out_fd = out[0],
                                .err_fd = errp[0],
                                .cg = cg } };
    /* the child's ends go to the helper (and are closed here once sent) */
    r = spawner_submit(s->spawner, sb ? SPAWN_CONFINED : SPAWN_PLAIN, &c, &cgq, owned, n_owned, sb,
                       spawn_answered, q);
    if (r < 0) {
        (void)sbx_err(err, r, "cannot hand the command to a spawn helper: %s", strerror(-r));
        spawned_close(&q->sp);
        sandbox_cmd_done(&q->sp.cg);
        sandbox_unref(q->sb);
        free(q);
        return r;
    }
    return 0;
fail:
    free(q);
    safe_close(out[0]);
    safe_close(out[1]);
    safe_close(errp[0]);
    safe_close(errp[1]);
    safe_close(in[0]);
    safe_close(in[1]);
    return r;
}

/* ---- events ------------------------------------------------------------------------------ */

size_t event_output_max(size_t n)
{
    /* lossy JSON text (6 bytes per input byte at worst) + base64 copy + framing */
    return n * 6 + (n + 2) / 3 * 4 + 96;
}

/* What each ASCII byte needs in a JSON string: 0 copied as is, 1 escaped. */
static const unsigned char json_class[128] = {
    [0x00 ... 0x1f] = 1,
    ['"'] = 1,
    ['\\'] = 1,
};

/* The escape of each byte that needs one; 8 bytes are copied (the destination has room), n
 * of them count. */
static const struct {
    char s[7];
    unsigned char n;
} json_esc[128] = {
    [0x00] = { "\\u0000", 6 }, [0x01] = { "\\u0001", 6 }, [0x02] = { "\\u0002", 6 },
    [0x03] = { "\\u0003", 6 }, [0x04] = { "\\u0004", 6 }, [0x05] = { "\\u0005", 6 },
    [0x06] = { "\\u0006", 6 }, [0x07] = { "\\u0007", 6 }, [0x08] = { "\\b", 2 },
    [0x09] = { "\\t", 2 },     [0x0a] = { "\\n", 2 },     [0x0b] = { "\\u000b", 6 },
    [0x0c] = { "\\f", 2 },     [0x0d] = { "\\r", 2 },     [0x0e] = { "\\u000e", 6 },
    [0x0f] = { "\\u000f", 6 }, [0x10] = { "\\u0010", 6 }, [0x11] = { "\\u0011", 6 },
    [0x12] = { "\\u0012", 6 }, [0x13] = { "\\u0013", 6 }, [0x14] = { "\\u0014", 6 },
    [0x15] = { "\\u0015", 6 }, [0x16] = { "\\u0016", 6 }, [0x17] = { "\\u0017", 6 },
    [0x18] = { "\\u0018", 6 }, [0x19] = { "\\u0019", 6 }, [0x1a] = { "\\u001a", 6 },
    [0x1b] = { "\\u001b", 6 }, [0x1c] = { "\\u001c", 6 }, [0x1d] = { "\\u001d", 6 },
    [0x1e] = { "\\u001e", 6 }, [0x1f] = { "\\u001f", 6 }, [0x22] = { "\\\"", 2 },
    [0x5c] = { "\\\\", 2 },
};

/* The escape of ASCII byte c at d (8 bytes written, room for them); returns its end. */
static inline char *put_escape(char *d, unsigned char c)
{
    memcpy(d, json_esc[c].s, 8);
    return d + json_esc[c].n;
}

#define BYTES_01 UINT64_C(0x0101010101010101)
#define BYTES_80 UINT64_C(0x8080808080808080)

/* Non-zero when a byte of the 8 at p is below 0x20, '"', '\\' or 0x80 and up (SWAR: a byte
 * below k borrows into its high bit in v - k; equal to k, likewise after the xor). */
static inline uint64_t json_needs_look(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    uint64_t q = v ^ (BYTES_01 * '"'), b = v ^ (BYTES_01 * '\\');
    return ((v - BYTES_01 * 0x20) | (q - BYTES_01) | (b - BYTES_01) | v) & BYTES_80;
}

/* The length of the complete, valid UTF-8 sequence at p (p[0] >= 0x80; RFC 3629: no overlong
 * forms, surrogates or code points past U+10FFFF), 0 when it is not one. */
static inline size_t utf8_seq_at(const unsigned char *p, size_t have)
{
    unsigned char c = p[0];
    if (c >= 0xC2 && c <= 0xDF)
        return have >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (have < 3 || (p[2] & 0xC0) != 0x80)
            return 0;
        unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        return p[1] >= lo && p[1] <= hi ? 3 : 0;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (have < 4 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        return p[1] >= lo && p[1] <= hi ? 4 : 0;
    }
    return 0;
}

/* JSON-escape valid UTF-8 (invalid bytes become U+FFFD). Returns bytes written; *bad tells
 * whether any byte had to be replaced. A span that needs no change (plain ASCII, looked at 8
 * bytes at a time, and complete valid sequences) is copied with one memcpy; an escape comes
 * from a table. dst has room for 6 bytes per input byte + 2. */
static size_t json_escape_scalar(char *dst, const unsigned char *p, size_t n, bool *bad)
{
    char *d = dst;
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        for (;;) {
            while (run + 8 <= n && !json_needs_look(p + run))
                run += 8;
            if (run == n)
                break;
            unsigned char c = p[run];
            if (c >= 0x80) {
                size_t k = utf8_seq_at(p + run, n - run);
                if (k == 0)
                    break;
                run += k;
            } else if (json_class[c]) {
                break;
            } else {
                run++;
            }
        }
        memcpy(d, p + i, run - i);
        d += run - i;
        i = run;
        if (i == n)
            break;
        unsigned char c = p[i++];
        if (c < 0x80) {
            d = put_escape(d, c);
            continue;
        }
        /* invalid or truncated sequence: one replacement character for this byte */
        *bad = true;
        memcpy(d, "\xEF\xBF\xBD", 3);
        d += 3;
    }
    return (size_t)(d - dst);
}

#if defined(__x86_64__)
#include <immintrin.h>

/* Whether this CPU has SSSE3 (asked once; the vector paths below need it). */
static bool have_ssse3(void)
{
    static int has = -1;
    if (has < 0)
        has = __builtin_cpu_supports("ssse3") ? 1 : 0;
    return has;
}

/* Whether p[0..n) is complete, valid UTF-8 (RFC 3629), 16 bytes per step with SSSE3: the
 * lookup method of Keiser and Lemire ("Validating UTF-8 in less than one instruction per
 * byte", 2021). Each byte pair (previous, current) is classified by three 16-entry tables
 * indexed by the previous byte's high and low nibbles and the current byte's high nibble; a
 * bit set in all three is an error (too short, too long, overlong, surrogate, too large, a
 * stray continuation), except where the byte must be the 2nd or 3rd continuation of a 3- or
 * 4-byte sequence, which the bytes 2 and 3 back tell. An all-ASCII block costs one test. */
enum {
    U8_TOO_SHORT = 1 << 0,  /* 11______ then 0_______ or 11______ */
    U8_TOO_LONG = 1 << 1,   /* 0_______ then 10______ */
    U8_OVERLONG_3 = 1 << 2, /* 11100000 100_____ */
    U8_TOO_LARGE = 1 << 3,  /* 11110100 1001____, 11110100 101_____, 11110101.. */
    U8_SURROGATE = 1 << 4,  /* 11101101 101_____ */
    U8_OVERLONG_2 = 1 << 5, /* 1100000_ 10______ */
    U8_TOO_LARGE_1000 = 1 << 6,
    U8_OVERLONG_4 = 1 << 6, /* 11110000 1000____ */
    U8_TWO_CONTS = 1 << 7,  /* 10______ 10______ */
    U8_CARRY = U8_TOO_SHORT | U8_TOO_LONG | U8_TWO_CONTS,
};

/* The three tables, by the previous byte's high nibble, its low nibble, and the current
 * byte's high nibble. */
#define U8_C (U8_CARRY)
#define U8_L (U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000)
static const unsigned char u8_b1_high[16] = {
    U8_TOO_LONG,
    U8_TOO_LONG,
    U8_TOO_LONG,
    U8_TOO_LONG,
    U8_TOO_LONG,
    U8_TOO_LONG,
    U8_TOO_LONG,
    U8_TOO_LONG,
    U8_TWO_CONTS,
    U8_TWO_CONTS,
    U8_TWO_CONTS,
    U8_TWO_CONTS,
    U8_TOO_SHORT | U8_OVERLONG_2,
    U8_TOO_SHORT,
    U8_TOO_SHORT | U8_OVERLONG_3 | U8_SURROGATE,
    U8_TOO_SHORT | U8_TOO_LARGE | U8_TOO_LARGE_1000 | U8_OVERLONG_4,
};
static const unsigned char u8_b1_low[16] = {
    U8_CARRY | U8_OVERLONG_3 | U8_OVERLONG_2 | U8_OVERLONG_4,
    U8_CARRY | U8_OVERLONG_2,
    U8_C,
    U8_C,
    U8_CARRY | U8_TOO_LARGE,
    U8_L,
    U8_L,
    U8_L,
    U8_L,
    U8_L,
    U8_L,
    U8_L,
    U8_L,
    U8_CARRY | U8_TOO_LARGE | U8_TOO_LARGE_1000 | U8_SURROGATE,
    U8_L,
    U8_L,
};
#define U8_CONT (U8_TOO_LONG | U8_OVERLONG_2 | U8_TWO_CONTS)
static const unsigned char u8_b2_high[16] = {
    U8_TOO_SHORT,
    U8_TOO_SHORT,
    U8_TOO_SHORT,
    U8_TOO_SHORT,
    U8_TOO_SHORT,
    U8_TOO_SHORT,
    U8_TOO_SHORT,
    U8_TOO_SHORT,
    U8_CONT | U8_OVERLONG_3 | U8_TOO_LARGE_1000 | U8_OVERLONG_4,
    U8_CONT | U8_OVERLONG_3 | U8_TOO_LARGE,
    U8_CONT | U8_SURROGATE | U8_TOO_LARGE,
    U8_CONT | U8_SURROGATE | U8_TOO_LARGE,
    U8_TOO_SHORT,
    U8_TOO_SHORT,
    U8_TOO_SHORT,
    U8_TOO_SHORT,
};
#undef U8_C
#undef U8_L
#undef U8_CONT

__attribute__((target("ssse3"))) static inline __m128i u8_block_errors(__m128i in, __m128i prev)
{
    const __m128i b1_high = _mm_loadu_si128((const __m128i *)u8_b1_high),
                  b1_low = _mm_loadu_si128((const __m128i *)u8_b1_low),
                  b2_high = _mm_loadu_si128((const __m128i *)u8_b2_high);
    const __m128i nib = _mm_set1_epi8(0x0F);
    __m128i prev1 = _mm_alignr_epi8(in, prev, 15);
    __m128i sc = _mm_and_si128(
        _mm_and_si128(_mm_shuffle_epi8(b1_high, _mm_and_si128(_mm_srli_epi16(prev1, 4), nib)),
                      _mm_shuffle_epi8(b1_low, _mm_and_si128(prev1, nib))),
        _mm_shuffle_epi8(b2_high, _mm_and_si128(_mm_srli_epi16(in, 4), nib)));
    __m128i third = _mm_subs_epu8(_mm_alignr_epi8(in, prev, 14), _mm_set1_epi8(0xE0 - 0x80));
    __m128i fourth = _mm_subs_epu8(_mm_alignr_epi8(in, prev, 13), _mm_set1_epi8(0xF0 - 0x80));
    __m128i must23 = _mm_and_si128(_mm_or_si128(third, fourth), _mm_set1_epi8((char)0x80));
    return _mm_xor_si128(must23, sc);
}

__attribute__((target("ssse3"))) static bool utf8_valid_ssse3(const unsigned char *p, size_t n)
{
    /* a block ending in the lead of an unfinished sequence: above these, byte by byte */
    const __m128i unfinished = _mm_setr_epi8(-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                             (char)(0xF0 - 1), (char)(0xE0 - 1), (char)(0xC0 - 1));
    __m128i prev = _mm_setzero_si128(), err = prev, prev_unfinished = prev;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i in = _mm_loadu_si128((const __m128i *)(p + i));
        if (_mm_movemask_epi8(in) == 0) { /* ASCII: fine unless a sequence was left open */
            err = _mm_or_si128(err, prev_unfinished);
            prev_unfinished = _mm_setzero_si128();
        } else {
            err = _mm_or_si128(err, u8_block_errors(in, prev));
            prev_unfinished = _mm_subs_epu8(in, unfinished);
        }
        prev = in;
    }
    if (i < n) { /* the tail, padded with ASCII: a sequence cut by the end is an error */
        unsigned char t[16] = { 0 };
        memcpy(t, p + i, n - i);
        err = _mm_or_si128(err, u8_block_errors(_mm_loadu_si128((const __m128i *)t), prev));
    } else
        err = _mm_or_si128(err, prev_unfinished);
    return _mm_movemask_epi8(_mm_cmpeq_epi8(err, _mm_setzero_si128())) == 0xFFFF;
}

/* JSON-escape p[0..n), known to be valid UTF-8: only bytes below 0x20, '"' and '\\' change,
 * found 16 at a time; the runs between them are copied whole. */
static size_t json_escape_valid(char *dst, const unsigned char *p, size_t n)
{
    const __m128i c1f = _mm_set1_epi8(0x1F), quote = _mm_set1_epi8('"'),
                  bslash = _mm_set1_epi8('\\');
    char *d = dst;
    size_t i = 0;
    while (i < n) {
        size_t run = i;
        for (;;) {
            if (run + 16 <= n) {
                __m128i v = _mm_loadu_si128((const __m128i *)(p + run));
                __m128i m =
                    _mm_or_si128(_mm_cmpeq_epi8(_mm_max_epu8(v, c1f), c1f),
                                 _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, bslash)));
                unsigned bits = (unsigned)_mm_movemask_epi8(m);
                if (bits == 0) {
                    run += 16;
                    continue;
                }
                run += (size_t)__builtin_ctz(bits);
                break;
            }
            while (run < n && !(p[run] < 0x80 && json_class[p[run]]))
                run++;
            break;
        }
        memcpy(d, p + i, run - i);
        d += run - i;
        i = run;
        if (i == n)
            break;
        d = put_escape(d, p[i++]);
    }
    return (size_t)(d - dst);
}

static bool have_avx512bw(void)
{
    static int has = -1;
    if (has < 0) /* libgcc's check includes the OS's saving of the vector state (XCR0) */
        has = __builtin_cpu_supports("avx512bw") ? 1 : 0;
    return has;
}

static bool have_avx512vbmi(void)
{
    static int has = -1;
    if (has < 0)
        has = have_avx512bw() && __builtin_cpu_supports("avx512vbmi") ? 1 : 0;
    return has;
}

/* utf8_valid_ssse3, 64 bytes a step with AVX-512 VBMI: the same three tables (each 128-bit
 * lane looks up its own copy), the bytes 1, 2 and 3 back taken across the block boundary with
 * one two-source byte permute each. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static inline __m512i
u8_block_errors_512(__m512i in, __m512i prev)
{
    const __m128i b1_high = _mm_loadu_si128((const __m128i *)u8_b1_high),
                  b1_low = _mm_loadu_si128((const __m128i *)u8_b1_low),
                  b2_high = _mm_loadu_si128((const __m128i *)u8_b2_high);
    const __m512i t1h = _mm512_broadcast_i32x4(b1_high), t1l = _mm512_broadcast_i32x4(b1_low),
                  t2h = _mm512_broadcast_i32x4(b2_high), nib = _mm512_set1_epi8(0x0F);
    /* byte j of prevK: the byte K before in[j] (from prev's end for j < K) */
    const __m512i step = _mm512_set_epi8(
        63, 62, 61, 60, 59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 49, 48, 47, 46, 45, 44, 43, 42, 41,
        40, 39, 38, 37, 36, 35, 34, 33, 32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18,
        17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i prev1 = _mm512_permutex2var_epi8(prev, _mm512_add_epi8(step, _mm512_set1_epi8(63)), in);
    __m512i prev2 = _mm512_permutex2var_epi8(prev, _mm512_add_epi8(step, _mm512_set1_epi8(62)), in);
    __m512i prev3 = _mm512_permutex2var_epi8(prev, _mm512_add_epi8(step, _mm512_set1_epi8(61)), in);
    __m512i sc = _mm512_and_si512(
        _mm512_and_si512(
            _mm512_shuffle_epi8(t1h, _mm512_and_si512(_mm512_srli_epi16(prev1, 4), nib)),
            _mm512_shuffle_epi8(t1l, _mm512_and_si512(prev1, nib))),
        _mm512_shuffle_epi8(t2h, _mm512_and_si512(_mm512_srli_epi16(in, 4), nib)));
    __m512i third = _mm512_subs_epu8(prev2, _mm512_set1_epi8(0xE0 - 0x80));
    __m512i fourth = _mm512_subs_epu8(prev3, _mm512_set1_epi8(0xF0 - 0x80));
    __m512i must23 = _mm512_and_si512(_mm512_or_si512(third, fourth), _mm512_set1_epi8((char)0x80));
    return _mm512_xor_si512(must23, sc);
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static bool
utf8_valid_avx512(const unsigned char *p, size_t n)
{
    /* a block ending in the lead of an unfinished sequence (its last three bytes) */
    const __m512i unfinished = _mm512_mask_blend_epi8(
        UINT64_C(7) << 61, _mm512_set1_epi8(-1),
        _mm512_set_epi8((char)(0xC0 - 1), (char)(0xE0 - 1), (char)(0xF0 - 1), 0, 0, 0, 0, 0, 0, 0,
                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                        0, 0, 0, 0));
    __m512i prev = _mm512_setzero_si512(), err = prev, prev_unfinished = prev;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i in = _mm512_loadu_si512((const void *)(p + i));
        if (_mm512_movepi8_mask(in) == 0) { /* ASCII: fine unless a sequence was left open */
            err = _mm512_or_si512(err, prev_unfinished);
            prev_unfinished = _mm512_setzero_si512();
        } else {
            err = _mm512_or_si512(err, u8_block_errors_512(in, prev));
            prev_unfinished = _mm512_subs_epu8(in, unfinished);
        }
        prev = in;
    }
    if (i < n) /* the tail, padded with NULs (ASCII): a sequence cut by the end is an error */
        err = _mm512_or_si512(
            err, u8_block_errors_512(_mm512_maskz_loadu_epi8(~UINT64_C(0) >> (64 - (n - i)), p + i),
                                     prev));
    else
        err = _mm512_or_si512(err, prev_unfinished);
    return _mm512_test_epi8_mask(err, err) == 0;
}

/* The same, 64 bytes a step with AVX-512BW: each block is stored whole and the output moves
 * on by what of it is plain (all of it, or up to the first byte to escape), so a run costs no
 * copy call of its own. A store never reaches past the finished output: at least 64 input
 * bytes are left, each at least one output byte. The last < 64 bytes go the SSSE3 way (an
 * escape looks only at ASCII bytes, so any split of valid UTF-8 escapes the same). */
__attribute__((target("avx512f,avx512bw"))) static size_t
json_escape_valid_avx512(char *dst, const unsigned char *p, size_t n)
{
    const __m512i c20 = _mm512_set1_epi8(0x20), quote = _mm512_set1_epi8('"'),
                  bslash = _mm512_set1_epi8('\\');
    char *d = dst;
    size_t i = 0;
    while (i + 64 <= n) {
        __m512i v = _mm512_loadu_si512((const void *)(p + i));
        __mmask64 m = _mm512_cmplt_epu8_mask(v, c20) | _mm512_cmpeq_epi8_mask(v, quote) |
                      _mm512_cmpeq_epi8_mask(v, bslash);
        _mm512_storeu_si512((void *)d, v);
        if (m == 0) {
            i += 64;
            d += 64;
            continue;
        }
        size_t k = (size_t)__builtin_ctzll(m);
        d += k;
        i += k;
        d = put_escape(d, p[i++]);
    }
    return (size_t)(d - dst) + json_escape_valid(d, p + i, n - i);
}
#endif

/* JSON-escape p[0..n): valid UTF-8 (checked with the vector validator where the CPU has
 * SSSE3) takes the vector path; anything else the bytewise one, which replaces what is not
 * valid. Returns bytes written; *bad tells whether any byte had to be replaced. */
static size_t json_escape(char *dst, const unsigned char *p, size_t n, bool *bad)
{
#if defined(__x86_64__)
    if (n >= 64 && have_avx512vbmi())
        return utf8_valid_avx512(p, n) ? json_escape_valid_avx512(dst, p, n)
                                       : json_escape_scalar(dst, p, n, bad);
    if (have_ssse3() && n >= 16 && utf8_valid_ssse3(p, n))
        return n >= 64 && have_avx512bw() ? json_escape_valid_avx512(dst, p, n)
                                          : json_escape_valid(dst, p, n);
#endif
    return json_escape_scalar(dst, p, n, bad);
}

int utf8_valid_at(unsigned width, const unsigned char *p, size_t n)
{
    if (width == 0) {
        for (size_t i = 0; i < n;) {
            size_t k = p[i] < 0x80 ? 1 : utf8_seq_at(p + i, n - i);
            if (k == 0)
                return 0;
            i += k;
        }
        return 1;
    }
#if defined(__x86_64__)
    if (width == 16 && have_ssse3())
        return utf8_valid_ssse3(p, n);
    if (width == 64 && have_avx512vbmi())
        return utf8_valid_avx512(p, n);
#endif
    return -1;
}

ssize_t json_escape_at(unsigned width, char *dst, const unsigned char *p, size_t n)
{
    bool bad = false;
    if (width == 0)
        return (ssize_t)json_escape_scalar(dst, p, n, &bad);
#if defined(__x86_64__)
    if (width == 16 && have_ssse3())
        return (ssize_t)json_escape_valid(dst, p, n);
    if (width == 64 && have_avx512bw())
        return (ssize_t)json_escape_valid_avx512(dst, p, n);
#endif
    return -1;
}

static char *put(char *d, const char *s)
{
    size_t n = strlen(s);
    memcpy(d, s, n);
    return d + n;
}

/* Standard base64 with padding, no NUL. Command output is not secret, so a plain table encoder:
 * libsodium's constant-time sodium_bin2base64 took ~60% of the server's CPU when streaming
 * base64 output (bench/bench_server.c, section 2). Two output characters per lookup, from a
 * table of the 4096 12-bit values made once (the server is single-threaded; spawn helpers never
 * encode): a third less of the server's CPU per streamed byte than one character per lookup. */
static const char b64_tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static char b64_pairs[4096][2];

#if defined(__x86_64__)

/* 12 input bytes to 16 characters per step with SSSE3 (Muła's method: each 3-byte group
 * shuffled to 4 bytes, the 6-bit fields moved into place by two multiplies, then each
 * field's offset to its character taken from a 16-entry table). Loads 16 bytes, so it stops
 * 16 bytes before the end; returns the characters written, *ret_used the bytes consumed. */
__attribute__((target("ssse3"))) static size_t b64_encode_ssse3(char *dst, const unsigned char *p,
                                                                size_t n, size_t *ret_used)
{
    const __m128i shuf = _mm_setr_epi8(1, 0, 2, 1, 4, 3, 5, 4, 7, 6, 8, 7, 10, 9, 11, 10);
    /* offsets: [0] 'a'-26, [1..10] '0'-52, [11] '+'-62, [12] '/'-63, [13] 'A' */
    const __m128i lut =
        _mm_setr_epi8(71, -4, -4, -4, -4, -4, -4, -4, -4, -4, -4, -19, -16, 65, 0, 0);
    size_t i = 0;
    char *d = dst;
    for (; i + 16 <= n; i += 12, d += 16) {
        __m128i in = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + i)), shuf);
        __m128i hi = _mm_mulhi_epu16(_mm_and_si128(in, _mm_set1_epi32(0x0fc0fc00)),
                                     _mm_set1_epi32(0x04000040));
        __m128i lo = _mm_mullo_epi16(_mm_and_si128(in, _mm_set1_epi32(0x003f03f0)),
                                     _mm_set1_epi32(0x01000010));
        __m128i idx = _mm_or_si128(hi, lo); /* one 6-bit value per byte */
        __m128i red = _mm_subs_epu8(idx, _mm_set1_epi8(51));
        __m128i upper = _mm_cmpgt_epi8(_mm_set1_epi8(26), idx);
        red = _mm_or_si128(red, _mm_and_si128(upper, _mm_set1_epi8(13)));
        _mm_storeu_si128((__m128i *)d, _mm_add_epi8(idx, _mm_shuffle_epi8(lut, red)));
    }
    *ret_used = i;
    return (size_t)(d - dst);
}

/* 48 input bytes to 64 characters per step with AVX-512 VBMI (Muła and Lemire): each 3-byte
 * group gathered into a 32-bit lane as in the SSSE3 path (b1 b0 b2 b1), the four 6-bit
 * fields picked out with one multishift, and their characters looked up in the 64-character
 * alphabet with one byte permute (which reads only each index's low 6 bits). Loads 64 bytes,
 * so it stops 64 bytes before the end; same contract as b64_encode_ssse3. */
__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static size_t
b64_encode_vbmi(char *dst, const unsigned char *p, size_t n, size_t *ret_used)
{
    const __m512i gather =
        _mm512_setr_epi32(0x01020001, 0x04050304, 0x07080607, 0x0a0b090a, 0x0d0e0c0d, 0x10110f10,
                          0x13141213, 0x16171516, 0x191a1819, 0x1c1d1b1c, 0x1f201e1f, 0x22232122,
                          0x25262425, 0x28292728, 0x2b2c2a2b, 0x2e2f2d2e);
    /* per 32-bit group, the bit offsets of its fields: 10, 4, 22, 16 (then +32) */
    const __m512i fields = _mm512_set1_epi64(0x3036242a1016040a);
    const __m512i alphabet = _mm512_loadu_si512((const void *)b64_tab);
    size_t i = 0;
    char *d = dst;
    for (; i + 64 <= n; i += 48, d += 64) {
        __m512i in = _mm512_permutexvar_epi8(gather, _mm512_loadu_si512((const void *)(p + i)));
        __m512i idx = _mm512_multishift_epi64_epi8(fields, in);
        _mm512_storeu_si512((void *)d, _mm512_permutexvar_epi8(idx, alphabet));
    }
    *ret_used = i;
    return (size_t)(d - dst);
}
#endif

static size_t b64_encode(char *dst, const unsigned char *p, size_t n)
{
    char *start = dst;
#if defined(__x86_64__)
    if (n >= 64 && have_avx512vbmi()) {
        size_t used;
        dst += b64_encode_vbmi(dst, p, n, &used);
        p += used;
        n -= used;
    }
    if (have_ssse3() && n >= 16) {
        size_t used;
        dst += b64_encode_ssse3(dst, p, n, &used);
        p += used;
        n -= used;
    }
#endif
    if (b64_pairs[4095][0] == 0)
        for (unsigned v = 0; v < 4096; v++) {
            b64_pairs[v][0] = b64_tab[v >> 6];
            b64_pairs[v][1] = b64_tab[v & 63];
        }
    char *d = dst;
    size_t i = 0;
    for (; i + 3 <= n; i += 3, d += 4) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        memcpy(d, b64_pairs[v >> 12], 2);
        memcpy(d + 2, b64_pairs[v & 4095], 2);
    }
    if (i < n) {
        bool two = i + 1 < n;
        uint32_t v = (uint32_t)p[i] << 16 | (two ? (uint32_t)p[i + 1] << 8 : 0);
        d[0] = b64_tab[v >> 18];
        d[1] = b64_tab[v >> 12 & 63];
        d[2] = two ? b64_tab[v >> 6 & 63] : '=';
        d[3] = '=';
        d += 4;
    }
    return (size_t)(d - start);
}

size_t event_encode_output(char *dst, const char *stream, const unsigned char *p, size_t n,
                           bool base64)
{
    char *d = dst;
    d = put(d, "{\"event\":\"");
    d = put(d, stream);
    d = put(d, "\",\"data\":\"");
    if (base64) {
        d += b64_encode(d, p, n);
        d = put(d, "\"}\n");
        return (size_t)(d - dst);
    }
    bool bad = false;
    d += json_escape(d, p, n, &bad);
    if (bad) {
        d = put(d, "\",\"data_b64\":\"");
        d += b64_encode(d, p, n);
    }
    d = put(d, "\"}\n");
    return (size_t)(d - dst);
}

size_t utf8_split_tail(const unsigned char *buf, size_t len, utf8_carry_t *carry)
{
    carry->n = 0;
    /* Look back at most 3 bytes for the lead byte of an unfinished sequence. */
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        unsigned char c = buf[len - back];
        if ((c & 0xC0) == 0x80)
            continue; /* continuation byte: keep looking for the lead */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (need > back) {
            size_t inc;
            (void)utf8_valid_prefix(buf + len - back, back, &inc);
            if (inc == back) { /* a valid beginning: hold it for the next read */
                memcpy(carry->b, buf + len - back, back);
                carry->n = back;
                return len - back;
            }
        }
        break;
    }
    return len;
}

int event_encode_exit(char *dst, size_t cap, int wstatus, bool timed_out, uint64_t duration_ms)
{
    char code[16] = "null", sig[16] = "null";
    if (WIFEXITED(wstatus))
        (void)snprintf(code, sizeof code, "%d", WEXITSTATUS(wstatus));
    else if (WIFSIGNALED(wstatus))
        (void)snprintf(sig, sizeof sig, "%d", WTERMSIG(wstatus));
    return snprintf(dst, cap,
                    "{\"event\":\"exit\",\"exit_code\":%s,\"signal\":%s,\"timed_out\":%s,"
                    "\"duration_ms\":%llu}\n",
                    code, sig, timed_out ? "true" : "false", (unsigned long long)duration_ms);
}
