/* SPDX-License-Identifier: MIT */
/* sbx-server: configuration from the environment (drop-in for the reference server's knobs),
 * then the event loop. */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/resource.h>

#include "common/buf.h"
#include "common/log.h"
#include "server.h"
#include "spawner.h"

static int env_u64(const char *name, uint64_t def, uint64_t min, uint64_t max, uint64_t *ret)
{
    const char *v = getenv(name);
    if (!v) {
        *ret = def;
        return 0;
    }
    uint64_t n;
    if (parse_u64_str(v, max, &n) < 0 || n < min) {
        log_error("%s=%s: expected a whole number between %llu and %llu", name, v,
                  (unsigned long long)min, (unsigned long long)max);
        return -EINVAL;
    }
    *ret = n;
    return 0;
}

/* The pool knobs are validated in every mode: a bad value refuses to start even where it
 * would not be used (a typo is not silently ignored until the day the mode changes). */
static int parse_pool_knobs(server_config_t *cfg)
{
    if (env_u64("SBX_CAPACITY", 64, 1, 45000, &cfg->pool.capacity) < 0 ||
        env_u64("SBX_MIN_LANDLOCK_ABI", 6, 0, 1000, &cfg->pool.min_abi) < 0 ||
        env_u64("SBX_POOL_UID_BASE", POOL_UID_BASE, POOL_UID_BASE,
                POOL_UID_BASE + POOL_UID_COUNT - 1, &cfg->pool.uid_base) < 0 ||
        env_u64("SBX_POOL_UID_COUNT", POOL_UID_BASE + POOL_UID_COUNT - cfg->pool.uid_base, 1,
                POOL_UID_COUNT, &cfg->pool.uid_count) < 0)
        return -EINVAL;
    /* pool hosts that share a kernel take uids of the range by lock (/run/sbx-pool-uids.lock);
     * a range of its own keeps a host off the uids another one frees (tests running at once) */
    if (cfg->pool.uid_base + cfg->pool.uid_count > POOL_UID_BASE + POOL_UID_COUNT) {
        log_error("SBX_POOL_UID_BASE=%llu with SBX_POOL_UID_COUNT=%llu ends past uid %d",
                  (unsigned long long)cfg->pool.uid_base, (unsigned long long)cfg->pool.uid_count,
                  POOL_UID_BASE + POOL_UID_COUNT - 1);
        return -EINVAL;
    }
    const char *homes = getenv("SBX_HOMES_DIR");
    if (!homes || !*homes)
        homes = "/sbx/homes";
    if (homes[0] != '/' || strlen(homes) >= sizeof cfg->pool.homes_dir - 20) {
        log_error("SBX_HOMES_DIR=%s: expected an absolute path (at most %zu bytes)", homes,
                  sizeof cfg->pool.homes_dir - 21);
        return -EINVAL;
    }
    json_t *valid = json_string(homes); /* the homes are named in JSON answers */
    json_decref(valid);
    if (!valid) {
        log_error("SBX_HOMES_DIR is not valid UTF-8");
        return -EINVAL;
    }
    memcpy(cfg->pool.homes_dir, homes, strlen(homes) + 1);
    return 0;
}

static int parse_host_config(server_config_t *cfg)
{
    /* Sandboxes are uids: setting them up needs root (CAP_SETUID, CAP_SETGID, CAP_KILL). */
    if (geteuid() != 0) {
        log_error("SBX_HOST_MODE=1 needs root (it runs each sandbox as its own uid)");
        return -EPERM;
    }
    return 0;
}

static int parse_config(int argc, char **argv, server_config_t *cfg)
{
    bool allow_no_auth = false;
    uint64_t port, idle;
    *cfg = (server_config_t){ .http = { .head_timeout_ms = 10000,
                                        .body_timeout_ms = 60000,
                                        .write_timeout_ms = 120000,
                                        .keepalive_ms = 75000 } };
    for (int i = 1; i < argc; i++) {
        if (streq(argv[i], "--allow-no-auth"))
            allow_no_auth = true; /* argv only: a job's user-supplied env can never set it */
        else if (streq(argv[i], "--version")) {
            printf("sbx-server %s (protocol %d)\n", SBX_VERSION, SBX_PROTOCOL);
            exit(0);
        } else if (streq(argv[i], "--allow-unconfined")) {
            /* argv only, like --allow-no-auth: host mode may then run uid-only sandboxes */
            cfg->pool.allow_unconfined = true;
        } else {
            log_error("unknown argument %s (known: --allow-no-auth, --allow-unconfined, --version)",
                      argv[i]);
            return -EINVAL;
        }
    }
    if (env_u64("SBX_PORT", SBX_DEFAULT_PORT, 1, 65535, &port) < 0 ||
        env_u64("SBX_IDLE_TIMEOUT", 0, 0, 31536000, &idle) < 0 ||
        env_u64("SBX_MAX_CONNECTIONS", 512, 1, 1000000, &cfg->http.max_connections) < 0)
        return -EINVAL;
    cfg->http.port = (uint16_t)port;
    cfg->idle_timeout_ms = idle * 1000;
    const char *bind = getenv("SBX_BIND");
    if (!bind || !*bind)
        bind = "127.0.0.1";
    unsigned char addr[sizeof(struct in6_addr)];
    if (strlen(bind) >= sizeof cfg->http.bind ||
        (inet_pton(AF_INET, bind, addr) != 1 && inet_pton(AF_INET6, bind, addr) != 1)) {
        log_error("SBX_BIND=%s: expected an IPv4 or IPv6 address", bind);
        return -EINVAL;
    }
    memcpy(cfg->http.bind, bind, strlen(bind) + 1);
    const char *listen = getenv("SBX_LISTEN");
    if (listen && strncmp(listen, "fd:", 3) == 0) {
        uint64_t fd;
        if (parse_u64_str(listen + 3, 1000000, &fd) < 0 || fd < 3) {
            log_error("SBX_LISTEN=%s: expected fd:N (an inherited socket, N >= 3)", listen);
            return -EINVAL;
        }
        cfg->http.listen_inherited = true;
        cfg->http.inherited_fd = (int)fd;
    } else if (listen && *listen) {
        if (strncmp(listen, "unix:", 5) != 0 || strlen(listen + 5) == 0 ||
            strlen(listen + 5) >= sizeof cfg->http.unix_path || listen[5] != '/') {
            log_error("SBX_LISTEN=%s: expected unix:/absolute/path", listen);
            return -EINVAL;
        }
        memcpy(cfg->http.unix_path, listen + 5, strlen(listen + 5) + 1);
    }
    const char *hm = getenv("SBX_HOST_MODE");
    if (hm && *hm && !streq(hm, "0") && !streq(hm, "1")) {
        log_error("SBX_HOST_MODE=%s: expected 1 (pool host) or 0", hm);
        return -EINVAL;
    }
    cfg->host_mode = hm && streq(hm, "1");
    if (parse_pool_knobs(cfg) < 0 || (cfg->host_mode && parse_host_config(cfg) < 0))
        return -EINVAL;
    char *tok = getenv("SBX_TOKEN");
    if (tok && *tok) {
        cfg->token = strdup(tok);
        if (!cfg->token)
            return -ENOMEM;
    } else if (!allow_no_auth) {
        log_error("SBX_TOKEN is not set (or empty); refusing to start. Use --allow-no-auth for "
                  "development only");
        return -EINVAL;
    }
    /* Children must not inherit the token, and commands (of the same uid in a dedicated run)
     * must not read it in /proc/<pid>/environ: that shows the initial environment block, which
     * unsetenv leaves as it was, so the value is overwritten there first (getenv points into
     * it). */
    if (tok)
        explicit_bzero(tok, strlen(tok));
    (void)unsetenv("SBX_TOKEN");
    return 0;
}

/* Connections, pipes and (in host mode) a few descriptors per sandbox: take what we may. As
 * root the hard limit can go up to fs.nr_open too (bounded, so the fd table stays sane). */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return;
    if (geteuid() == 0) {
        uint64_t nr_open = 0;
        FILE *f = fopen("/proc/sys/fs/nr_open", "re");
        char line[32];
        if (f && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = '\0';
            if (parse_u64_str(line, UINT64_MAX, &nr_open) < 0)
                nr_open = 0;
        }
        if (f)
            fclose(f);
        rlim_t want = (rlim_t)MIN(nr_open, (uint64_t)262144);
        struct rlimit more = { want, want };
        if (want > rl.rlim_max && setrlimit(RLIMIT_NOFILE, &more) == 0)
            return; /* without CAP_SYS_RESOURCE this fails: fall back to the hard limit */
    }
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
}

int main(int argc, char **argv)
{
    server_config_t cfg;
    server_t srv;
    /* Before the token is read: the agent is not dumpable, so the code of its own run (same
     * uid, no CAP_SYS_PTRACE in a dedicated run) cannot read its memory (/proc/<pid>/mem,
     * process_vm_readv, ptrace) or take its descriptors (pidfd_getfd), which hold the token
     * and every request; the spawn helpers forked from it inherit this, and each command is
     * dumpable again after its execve. */
    if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
        log_warn("cannot make the agent non-dumpable: %s", strerror(errno));
    if (log_level_from_env() < 0 || parse_config(argc, argv, &cfg) < 0)
        return 2;
    raise_nofile();
    int r = server_init(&srv, &cfg);
    /* The spawn helpers, forked now while the server holds few descriptors and no clients. */
    if (r >= 0 && (r = spawner_new(&srv, &srv.spawner)) < 0)
        log_error("cannot start the spawn helpers: %s", strerror(-r));
    if (r < 0) {
        log_error("cannot start: %s", strerror(-r));
        server_done(&srv);
        free(cfg.token);
        return 1;
    }
    if (cfg.http.listen_inherited)
        log_info("listening on inherited socket fd %d (%s mode, auth %s)", cfg.http.inherited_fd,
                 cfg.host_mode ? "host" : "dedicated", cfg.token ? "required" : "DISABLED");
    else if (cfg.http.unix_path[0])
        log_info("listening on unix:%s (%s mode, auth %s)", cfg.http.unix_path,
                 cfg.host_mode ? "host" : "dedicated", cfg.token ? "required" : "DISABLED");
    else
        log_info("listening on %s:%u (%s mode, auth %s)", cfg.http.bind, cfg.http.port,
                 cfg.host_mode ? "host" : "dedicated", cfg.token ? "required" : "DISABLED");
    buf_keep_spares(BUF_SPARES_MAX); /* this thread runs the loop: its buffers start there */
    r = server_run(&srv);
    server_done(&srv);
    free(cfg.token);
    return r < 0 ? 1 : 0;
}
