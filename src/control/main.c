/* SPDX-License-Identifier: MIT */
/* sbx-control: configuration from arguments, then the control plane's loop. */
#include <arpa/inet.h>
#include <getopt.h>
#include <stdio.h>
#include <sys/resource.h>

#include "cap/imagename.h"
#include "cap/purpose.h"
#include "common/buf.h"
#include "common/log.h"
#include "control/control.h"

/* long options without a short letter: the connection limits (src/http/connlimit.h) */
enum {
    OPT_MAX_CONNS = 0x100,
    OPT_PER_SOURCE,
    OPT_PER_PRINCIPAL,
    OPT_MAX_UNAUTH,
    OPT_UNAUTH_HEAD,
    OPT_CONTROL_SOURCE,
    OPT_E2B_DOMAIN,
    OPT_E2B_PORTS
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: sbx-control --state DIR [--listen ADDR:PORT] [--admin-token-file FILE]\n"
            "                   [--key-publish-delay-ms N] [--default-image NAME]\n"
            "                   [--tls-dir DIR] [--tls-san ADDR|NAME]... [--insecure-plain-http]\n"
            "                   [--secrets-key-file FILE] [--rotate-secrets-key]\n"
            "                   [--max-connections N] [--max-conns-per-source N]\n"
            "                   [--max-conns-per-principal N] [--max-unauth-conns N]\n"
            "                   [--unauth-head-timeout-ms N] [--e2b-domain DOMAIN]\n"
            "                   [--e2b-ports PORT,...]\n"
            "TLS 1.3 on the listener and to every node: the CA, key and certificate are made\n"
            "in DIR/tls (or --tls-dir, where an operator may put a CA of their own: ca.key +\n"
            "ca.crt) on the first start; clients trust DIR/tls/ca.crt. --insecure-plain-http\n"
            "(loopback addresses only) serves plain HTTP and talks plain HTTP to nodes.\n"
            "Connection limits (0 turns one off; docs/platform.md): at most 10000\n"
            "connections, 256 per source address (IPv6: per /64), 1024 per principal; at most\n"
            "half of --max-connections unauthenticated, each with 5000 ms to send a request\n"
            "head (the oldest waiting one is closed to make room for a new connection).\n"
            "Jobs that name no image run --default-image (default \"debian\", built by\n"
            "scripts/build-image.sh); \"host\" (the nodes' own /usr) is for admins unless it\n"
            "is the default.\n"
            "The sbx control plane (embedded SQLite store in DIR/store.db).\n"
            "Default listen 127.0.0.1:49980; the admin token goes to $SBX_HOME/token\n"
            "($SBX_HOME defaults to ~/.sbx) on the first start of an empty store.\n"
            "Signing keys and job secrets are sealed in the store under the secrets key file\n"
            "(default DIR/secrets.key, 0600, made on the first start); --rotate-secrets-key\n"
            "(every control stopped) replaces that key and re-seals the store, then exits.\n"
            "E2B's SDKs (docs/e2b.md): sandboxes are reached at <port>-<id>.DOMAIN, a name that\n"
            "must resolve to this control plane (default DOMAIN: localhost:<listen port>), and\n"
            "expose their agent and --e2b-ports (default 3000,5000,5173,8000,8080,8888; at\n"
            "most 15).\n");
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        { "state", required_argument, NULL, 's' },
        { "listen", required_argument, NULL, 'l' },
        { "admin-token-file", required_argument, NULL, 't' },
        { "key-publish-delay-ms", required_argument, NULL, 'd' },
        { "default-image", required_argument, NULL, 'i' },
        { "insecure-plain-http", no_argument, NULL, 'P' },
        { "node-dead-ms", required_argument, NULL, 'D' },
        { "tls-dir", required_argument, NULL, 'T' },
        { "tls-san", required_argument, NULL, 'S' },
        { "secrets-key-file", required_argument, NULL, 'K' },
        { "rotate-secrets-key", no_argument, NULL, 'R' },
        { "max-connections", required_argument, NULL, OPT_MAX_CONNS },
        { "max-conns-per-source", required_argument, NULL, OPT_PER_SOURCE },
        { "max-conns-per-principal", required_argument, NULL, OPT_PER_PRINCIPAL },
        { "max-unauth-conns", required_argument, NULL, OPT_MAX_UNAUTH },
        { "unauth-head-timeout-ms", required_argument, NULL, OPT_UNAUTH_HEAD },
        { "e2b-domain", required_argument, NULL, OPT_E2B_DOMAIN },
        { "e2b-ports", required_argument, NULL, OPT_E2B_PORTS },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    control_config_t cfg = { .publish_delay_ms = 2000,
                             .default_image = "debian",
                             .node_dead_ms = 30000,
                             .max_conns_per_principal = 1024,
                             .e2b_ports = { 3000, 5000, 5173, 8000, 8080, 8888 },
                             .n_e2b_ports = 6 };
    httpd_config_t scfg = { .head_timeout_ms = 10000,
                            .body_timeout_ms = 60000,
                            .write_timeout_ms = 120000,
                            .keepalive_ms = 75000,
                            .max_connections = 10000,
                            .max_conns_per_source = 256,
                            .unauth_head_timeout_ms = 5000,
                            .port = 49980 };
    bool unauth_set = false;
    const char *listen = "127.0.0.1:49980", *tokfile = NULL;
    bool rotate_secrets = false;
    int o;
    if (log_level_from_env() < 0)
        return 2;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        uint64_t v;
        switch (o) {
        case 's':
            if (strlen(optarg) >= sizeof cfg.state_dir || optarg[0] != '/') {
                log_error("--state takes an absolute path");
                return 2;
            }
            memcpy(cfg.state_dir, optarg, strlen(optarg) + 1);
            break;
        case 'l': listen = optarg; break;
        case 't': tokfile = optarg; break;
        case 'd':
            if (parse_u64_str(optarg, 3600000, &v) < 0) {
                log_error("--key-publish-delay-ms: a number of milliseconds");
                return 2;
            }
            cfg.publish_delay_ms = v;
            break;
        case 'i':
            if (strlen(optarg) >= sizeof cfg.default_image ||
                (!streq(optarg, "host") && !image_name_valid(optarg))) {
                log_error("--default-image: \"host\" or an image name");
                return 2;
            }
            memcpy(cfg.default_image, optarg, strlen(optarg) + 1);
            break;
        case 'P': cfg.plain_http = true; break;
        case 'D':
            if (parse_u64_str(optarg, 86400000, &v) < 0 || v < CTL_NODE_LIVE_MS) {
                log_error("--node-dead-ms: milliseconds, at least %d", CTL_NODE_LIVE_MS);
                return 2;
            }
            cfg.node_dead_ms = v;
            break;
        case 'T':
            if (strlen(optarg) >= sizeof cfg.tls_dir || optarg[0] != '/') {
                log_error("--tls-dir takes an absolute path");
                return 2;
            }
            memcpy(cfg.tls_dir, optarg, strlen(optarg) + 1);
            break;
        case 'S':
            if (cfg.n_tls_sans == (int)ELEMENTSOF(cfg.tls_sans) ||
                strlen(optarg) >= sizeof cfg.tls_sans[0] || !optarg[0] ||
                optarg[strspn(optarg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                      "0123456789.:-")]) {
                log_error("--tls-san takes an IP address or a DNS name (at most 8)");
                return 2;
            }
            memcpy(cfg.tls_sans[cfg.n_tls_sans++], optarg, strlen(optarg) + 1);
            break;
        case 'K':
            if (strlen(optarg) >= sizeof cfg.secrets_key_file || optarg[0] != '/') {
                log_error("--secrets-key-file takes an absolute path");
                return 2;
            }
            memcpy(cfg.secrets_key_file, optarg, strlen(optarg) + 1);
            break;
        case 'R': rotate_secrets = true; break;
        case OPT_MAX_CONNS:
        case OPT_PER_SOURCE:
        case OPT_PER_PRINCIPAL:
        case OPT_MAX_UNAUTH:
        case OPT_UNAUTH_HEAD:
            if (parse_u64_str(optarg, 10000000, &v) < 0 || (o == OPT_MAX_CONNS && v == 0)) {
                log_error("connection limits take a number, not %s", optarg);
                return 2;
            }
            *(o == OPT_MAX_CONNS       ? &scfg.max_connections
              : o == OPT_PER_SOURCE    ? &scfg.max_conns_per_source
              : o == OPT_PER_PRINCIPAL ? &cfg.max_conns_per_principal
              : o == OPT_MAX_UNAUTH    ? &scfg.max_unauth_conns
                                       : &scfg.unauth_head_timeout_ms) = v;
            unauth_set = unauth_set || o == OPT_MAX_UNAUTH;
            break;
        case OPT_E2B_PORTS: {
            cfg.n_e2b_ports = 0;
            for (sv_t rest = sv_make(optarg, strlen(optarg)); rest.len > 0;) {
                const char *comma = memchr(rest.p, ',', rest.len);
                sv_t one = sv_make(rest.p, comma ? (size_t)(comma - rest.p) : rest.len);
                rest = comma ? sv_make(comma + 1, rest.len - one.len - 1) : sv_make(rest.p, 0);
                if (cfg.n_e2b_ports == (int)ELEMENTSOF(cfg.e2b_ports) ||
                    parse_u64(one, 65535, &v) < 0 || v == 0 || v == CAP_AGENT_PORT) {
                    log_error("--e2b-ports: at most 15 port numbers (not 49983), comma-separated");
                    return 2;
                }
                cfg.e2b_ports[cfg.n_e2b_ports++] = (uint16_t)v;
            }
            break;
        }
        case OPT_E2B_DOMAIN:
            if (strlen(optarg) >= sizeof cfg.e2b_domain || !optarg[0] ||
                optarg[strspn(optarg, "abcdefghijklmnopqrstuvwxyz0123456789.:-")]) {
                log_error("--e2b-domain takes a DNS name (lower case), optionally with :PORT");
                return 2;
            }
            memcpy(cfg.e2b_domain, optarg, strlen(optarg) + 1);
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!cfg.state_dir[0]) {
        usage(stderr);
        return 2;
    }
    if (!unauth_set) /* unauthenticated connections: half of the table, by default */
        scfg.max_unauth_conns = MAX(scfg.max_connections / 2, 1);
    /* the table needs a descriptor per connection */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rotate_secrets)
        return secrets_rotate(&cfg) < 0 ? 1 : 0;
    uint16_t port;
    if (parse_hostport(listen, scfg.bind, sizeof scfg.bind, &port) < 0) {
        log_error("--listen takes IP:PORT (a numeric address; [IPv6]:PORT)");
        return 2;
    }
    scfg.port = port;
    (void)snprintf(cfg.listen_ip, sizeof cfg.listen_ip, "%s", scfg.bind);
    if (!cfg.e2b_domain[0])
        (void)snprintf(cfg.e2b_domain, sizeof cfg.e2b_domain, "localhost:%u", (unsigned)port);
    if (cfg.plain_http && !addr_is_loopback(scfg.bind)) {
        log_error("--insecure-plain-http serves only a loopback address (127.0.0.0/8 or ::1); "
                  "%s is not one: drop the flag to serve TLS",
                  scfg.bind);
        return 2;
    }
    if (tokfile)
        (void)snprintf(cfg.admin_token_file, sizeof cfg.admin_token_file, "%s", tokfile);
    else {
        const char *home = getenv("SBX_HOME"), *h = getenv("HOME");
        if (home && *home)
            (void)snprintf(cfg.admin_token_file, sizeof cfg.admin_token_file, "%s/token", home);
        else
            (void)snprintf(cfg.admin_token_file, sizeof cfg.admin_token_file, "%s/.sbx/token",
                           h && *h ? h : "/root");
    }
    static control_t ctl;
    int r = control_init(&ctl, &cfg, &scfg);
    if (r < 0) {
        log_error("cannot start: %s", strerror(-r));
        control_done(&ctl);
        return 1;
    }
    log_info("sbx-control listening on %s:%u (state %s)", scfg.bind, scfg.port, cfg.state_dir);
    buf_keep_spares(BUF_SPARES_MAX); /* this thread runs the loop: its buffers start there */
    r = control_run(&ctl);
    control_done(&ctl);
    return r < 0 ? 1 : 0;
}
