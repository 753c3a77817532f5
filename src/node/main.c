/* SPDX-License-Identifier: MIT */
/* sbx-node: configuration from arguments, then the node's loop. */
#include <arpa/inet.h>
#include <getopt.h>
#include <libgen.h>
#include <sodium.h>
#include <stdio.h>
#include <sys/resource.h>

#include "common/buf.h"
#include "common/log.h"
#include "node/node.h"

/* long options without a short letter: the connection limits (src/http/connlimit.h) */
enum {
    OPT_MAX_CONNS = 0x100,
    OPT_PER_SOURCE,
    OPT_PER_PRINCIPAL,
    OPT_MAX_UNAUTH,
    OPT_UNAUTH_HEAD,
    OPT_CONTROL_SOURCE,
    OPT_DISK_OVERCOMMIT
};

static void usage(FILE *f)
{
    fprintf(f, "usage: sbx-node --state DIR --listen ADDR:PORT --control ADDR:PORT\n"
               "                (--join-token-file FILE | --join STRING) [--control-key B64]\n"
               "                [--name ID] [--advertise ADDR:PORT] [--agent PATH] [--capacity N]\n"
               "                [--id-range START:COUNT] [--images DIR] [--insecure-plain-http]\n"
               "                [--max-connections N] [--max-conns-per-source N]\n"
               "                [--control-source ADDR]... [--max-unauth-conns N]\n"
               "                [--unauth-head-timeout-ms N] [--disk-overcommit N]\n"
               "Runs sandbox runs for sbx-control on this machine (needs root).\n"
               "A run's disk (its flavor's size) is installed only where it fits beside the\n"
               "others, each counted as full, in N times the free space of DIR's file system\n"
               "less 256 MiB (--disk-overcommit N, 1..64, default 4: sparse disks rarely fill;\n"
               "1: no run filling its disk can fill the node's).\n"
               "The join material is the control plane's node-join.token:\n"
               "\"sbxjoin2.<token>.<control identity key>.<CA pin>\". The node speaks TLS 1.3\n"
               "(its key and certificate in DIR/tls) and trusts only the pinned CA.\n"
               "--insecure-plain-http (loopback only) speaks plain HTTP and also accepts\n"
               "\"sbxjoin1.<token>.<key>\" or a bare token with --control-key.\n"
               "Connection limits (0 turns one off; docs/platform.md): at most 10000\n"
               "connections, 256 per source address (IPv6: per /64) except the control plane's\n"
               "(--control-source, repeatable, default the --control address), at most half of\n"
               "--max-connections unauthenticated, each with 5000 ms to send a request head.\n");
}

static int read_token_file(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return negative_errno();
    size_t n = fread(out, 1, cap - 1, f);
    fclose(f);
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '))
        n--;
    out[n] = 0;
    return n > 0 ? 0 : -EINVAL;
}

/* "sbxjoin2.<token>.<base64url identity public key>.<base64url SHA-256 of the CA certificate>";
 * under --insecure-plain-http also "sbxjoin1.<token>.<key>" or a bare token with --control-key. */
static int parse_join(const char *text, const char *key_b64, node_config_t *cfg)
{
    const char *tok = text, *pk = key_b64;
    char pkbuf[64];
    size_t tl = strlen(text);
    bool v2 = strncmp(text, "sbxjoin2.", 9) == 0;
    if (!v2 && !cfg->plain_http) {
        log_error("the join material pins no TLS CA: use the control plane's node-join.token "
                  "(sbxjoin2.…), or --insecure-plain-http with a control plane that has it too");
        return -EINVAL;
    }
    if (v2 || strncmp(text, "sbxjoin1.", 9) == 0) {
        tok = text + 9;
        const char *dot = strchr(tok, '.');
        if (!dot)
            return -EINVAL;
        tl = (size_t)(dot - tok);
        const char *k = dot + 1, *end = v2 ? strchr(k, '.') : k + strlen(k);
        if (!end || (size_t)(end - k) >= sizeof pkbuf)
            return -EINVAL;
        memcpy(pkbuf, k, (size_t)(end - k));
        pkbuf[end - k] = 0;
        if (pk && !streq(pk, pkbuf)) {
            log_error("--control-key differs from the key in the join material");
            return -EINVAL;
        }
        pk = pkbuf;
        size_t pl = 0;
        if (v2 && (sodium_base642bin(cfg->ca_pin, TLS_PIN_BYTES, end + 1, strlen(end + 1), NULL,
                                     &pl, NULL, sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
                   pl != TLS_PIN_BYTES)) {
            log_error("malformed CA pin in the join material");
            return -EINVAL;
        }
    }
    if (!pk) {
        log_error("the join material names no control identity key: use the control plane's "
                  "node-join.token (sbxjoin1.…) or give --control-key");
        return -EINVAL;
    }
    size_t len = 0;
    if (tl == 0 || tl >= sizeof cfg->join_token || memchr(tok, '.', tl) ||
        sodium_base642bin(cfg->control_pk, CAP_PK_BYTES, pk, strlen(pk), NULL, &len, NULL,
                          sodium_base64_VARIANT_URLSAFE_NO_PADDING) != 0 ||
        len != CAP_PK_BYTES) {
        log_error("malformed join material or control identity key");
        return -EINVAL;
    }
    memcpy(cfg->join_token, tok, tl);
    cfg->join_token[tl] = 0;
    return 0;
}

static int copy_str(char *dst, size_t cap, const char *src)
{
    if (strlen(src) >= cap)
        return -ENAMETOOLONG;
    memcpy(dst, src, strlen(src) + 1);
    return 0;
}

static int parse_args(int argc, char **argv, node_config_t *cfg, httpd_config_t *scfg)
{
    static const struct option opts[] = {
        { "state", required_argument, NULL, 's' },
        { "listen", required_argument, NULL, 'l' },
        { "control", required_argument, NULL, 'c' },
        { "join-token-file", required_argument, NULL, 'j' },
        { "join", required_argument, NULL, 'J' },
        { "control-key", required_argument, NULL, 'K' },
        { "name", required_argument, NULL, 'n' },
        { "advertise", required_argument, NULL, 'a' },
        { "agent", required_argument, NULL, 'g' },
        { "capacity", required_argument, NULL, 'k' },
        { "id-range", required_argument, NULL, 'i' },
        { "images", required_argument, NULL, 'I' },
        { "insecure-plain-http", no_argument, NULL, 'P' },
        { "max-connections", required_argument, NULL, OPT_MAX_CONNS },
        { "max-conns-per-source", required_argument, NULL, OPT_PER_SOURCE },
        { "control-source", required_argument, NULL, OPT_CONTROL_SOURCE },
        { "max-unauth-conns", required_argument, NULL, OPT_MAX_UNAUTH },
        { "unauth-head-timeout-ms", required_argument, NULL, OPT_UNAUTH_HEAD },
        { "disk-overcommit", required_argument, NULL, OPT_DISK_OVERCOMMIT },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    const char *listen = NULL, *advertise = NULL, *control = NULL, *tokfile = NULL;
    const char *join = NULL, *control_key = NULL;
    bool unauth_set = false;
    int o;
    *cfg = (node_config_t){ .capacity = 64, .disk_overcommit = 4 };
    *scfg = (httpd_config_t){ .head_timeout_ms = 10000,
                              .body_timeout_ms = 60000,
                              .write_timeout_ms = 120000,
                              .keepalive_ms = 75000,
                              .max_connections = 10000,
                              .max_conns_per_source = 256,
                              .unauth_head_timeout_ms = 5000 };
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int r = 0;
        uint64_t v;
        switch (o) {
        case 's': r = copy_str(cfg->state_dir, sizeof cfg->state_dir, optarg); break;
        case 'l': listen = optarg; break;
        case 'c': control = optarg; break;
        case 'j': tokfile = optarg; break;
        case 'J': join = optarg; break;
        case 'K': control_key = optarg; break;
        case 'n': r = copy_str(cfg->name, sizeof cfg->name, optarg); break;
        case 'a': advertise = optarg; break;
        case 'g': r = copy_str(cfg->agent_bin, sizeof cfg->agent_bin, optarg); break;
        case 'k':
            r = parse_u64_str(optarg, 100000, &v);
            cfg->capacity = v;
            break;
        case 'i': r = idrange_parse(optarg, &cfg->id_start, &cfg->id_count); break;
        case OPT_DISK_OVERCOMMIT:
            r = parse_u64_str(optarg, 64, &v);
            if (r >= 0 && v == 0)
                r = -EINVAL;
            cfg->disk_overcommit = (uint32_t)v;
            break;
        case 'I': r = copy_str(cfg->images_dir, sizeof cfg->images_dir, optarg); break;
        case 'P': cfg->plain_http = true; break;
        case OPT_MAX_CONNS:
        case OPT_PER_SOURCE:
        case OPT_MAX_UNAUTH:
        case OPT_UNAUTH_HEAD:
            r = parse_u64_str(optarg, 10000000, &v);
            if (r >= 0 && o == OPT_MAX_CONNS && v == 0)
                r = -EINVAL;
            *(o == OPT_MAX_CONNS    ? &scfg->max_connections
              : o == OPT_PER_SOURCE ? &scfg->max_conns_per_source
              : o == OPT_MAX_UNAUTH ? &scfg->max_unauth_conns
                                    : &scfg->unauth_head_timeout_ms) = v;
            unauth_set = unauth_set || o == OPT_MAX_UNAUTH;
            break;
        case OPT_CONTROL_SOURCE:
            if (scfg->n_exempt >= CLIMIT_EXEMPT_MAX)
                r = -E2BIG;
            else
                r = climit_source_key_parse(optarg, scfg->exempt[scfg->n_exempt++]);
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -EINVAL;
        }
        if (r < 0) {
            log_error("bad value for an option: %s", optarg);
            return -EINVAL;
        }
    }
    if (!cfg->images_dir[0])
        (void)snprintf(cfg->images_dir, sizeof cfg->images_dir, "%s", IMAGE_DEFAULT_DIR);
    if (cfg->images_dir[0] != '/') {
        log_error("--images takes an absolute path");
        return -EINVAL;
    }
    if (!cfg->state_dir[0] || !listen || !control || !(tokfile || join) || (tokfile && join) ||
        cfg->state_dir[0] != '/') {
        usage(stderr);
        return -EINVAL;
    }
    uint16_t port;
    if (parse_hostport(listen, scfg->bind, sizeof scfg->bind, &port) < 0 ||
        parse_hostport(control, cfg->control_host, sizeof cfg->control_host, &cfg->control_port) <
            0) {
        log_error("--listen and --control take IP:PORT (numeric)");
        return -EINVAL;
    }
    scfg->port = port;
    if (cfg->plain_http &&
        (!addr_is_loopback(scfg->bind) || !addr_is_loopback(cfg->control_host))) {
        log_error("--insecure-plain-http: the listen and control addresses must be loopback "
                  "(127.0.0.0/8 or ::1)");
        return -EINVAL;
    }
    /* The control plane is the node's one legitimate peer, and it may hold many connections
     * (one per request or stream in flight, and the ones it keeps): no per-source cap for it.
     * Without --control-source, that is the --control address. */
    if (scfg->n_exempt == 0 &&
        climit_source_key_parse(cfg->control_host, scfg->exempt[scfg->n_exempt++]) < 0)
        return -EINVAL;
    if (!unauth_set) /* unauthenticated connections: half of the table, by default */
        scfg->max_unauth_conns = MAX(scfg->max_connections / 2, 1);
    (void)snprintf(cfg->advertise, sizeof cfg->advertise, "%s", advertise ? advertise : listen);
    char text[512];
    if (tokfile && read_token_file(tokfile, text, sizeof text) < 0) {
        log_error("cannot read the join material from %s", tokfile);
        return -EINVAL;
    }
    int jr = parse_join(tokfile ? text : join, control_key, cfg);
    sodium_memzero(text, sizeof text);
    if (jr < 0)
        return -EINVAL;
    /* Subordinate ids for the runs' user namespaces: --id-range, else root's entry in
     * /etc/subuid, else a fixed range far above ordinary uids. Two nodes on one machine need
     * ranges of their own. */
    if (!cfg->id_count &&
        idrange_from_subid_file("/etc/subuid", "root", &cfg->id_start, &cfg->id_count) < 0) {
        cfg->id_start = 1000000000u;
        cfg->id_count = 1024u * IDRANGE_BLOCK;
    }
    if (!cfg->name[0])
        (void)snprintf(cfg->name, sizeof cfg->name, "node-%u", port);
    if (!cap_id_valid(cfg->name)) {
        log_error("--name %s: use [A-Za-z0-9._:-], at most %d bytes", cfg->name, CAP_ID_MAX - 1);
        return -EINVAL;
    }
    if (!cfg->agent_bin[0]) { /* sbx-server-static next to this binary */
        char self[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0)
            return -EINVAL;
        self[n] = 0;
        /* the static agent runs in any root; a build without it (the sanitizer build) uses
         * the dynamic one, whose libraries every run sees under the host's /usr */
        const char *dir = dirname(self);
        (void)snprintf(cfg->agent_bin, sizeof cfg->agent_bin, "%s/sbx-server-static", dir);
        if (access(cfg->agent_bin, X_OK) < 0)
            (void)snprintf(cfg->agent_bin, sizeof cfg->agent_bin, "%s/sbx-server", dir);
    }
    return 0;
}

int main(int argc, char **argv)
{
    node_config_t cfg;
    httpd_config_t scfg;
    static node_t node;
    if (log_level_from_env() < 0)
        return 2;
    if (parse_args(argc, argv, &cfg, &scfg) < 0)
        return 2;
    if (geteuid() != 0) {
        log_error("sbx-node needs root (namespaces, mounts, cgroups)");
        return 2;
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    int r = node_init(&node, &cfg, &scfg);
    if (r < 0) {
        log_error("cannot start: %s", strerror(-r));
        node_done(&node);
        return 1;
    }
    log_info("sbx-node %s listening on %s:%u, control plane %s:%u, agent %s, images %s", cfg.name,
             scfg.bind, scfg.port, cfg.control_host, cfg.control_port, cfg.agent_bin,
             cfg.images_dir);
    buf_keep_spares(BUF_SPARES_MAX); /* this thread runs the loop: its buffers start there */
    r = node_run(&node);
    node_done(&node);
    return r < 0 ? 1 : 0;
}
