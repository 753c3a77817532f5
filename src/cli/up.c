/* SPDX-License-Identifier: MIT */
/* sbx up | down | status: the embedded local platform. One sbx-control (SQLite store, loopback)
 * and one sbx-node, both daemons found next to the sbx binary, started in sessions of their own
 * with their logs and pid files under the state directory; the client configuration
 * ($SBX_HOME: endpoint, token, ca.crt) written for every later command. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"

#define DEFAULT_STATE "/var/lib/sbx"
#define DEFAULT_PORT 49980
#define DEFAULT_IMAGES "/var/lib/sbx/images" /* sbx-node's default --images */
#define START_WAIT_MS 60000
#define STOP_WAIT_MS 15000

typedef struct {
    char state_dir[PATH_MAX];
    unsigned port;
    const char *images;
    const char *default_image;
    const char *id_range;
    unsigned wait_s;
} up_opts_t;

static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    (void)nanosleep(&ts, NULL);
}

static int path_join(char *out, size_t cap, const char *a, const char *b)
{
    int n = snprintf(out, cap, "%s/%s", a, b);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

static int mkdir_p(const char *path, mode_t mode)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0755) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return -errno;
    return chmod(tmp, mode) < 0 ? -errno : 0;
}

/* The whole of a small file, NUL-terminated, or NULL. */
static char *slurp(const char *path, size_t *ret_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    size_t cap = 65536, len = 0;
    char *buf = malloc(cap + 1);
    while (buf && len < cap) {
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    (void)close(fd);
    if (buf) {
        buf[len] = 0;
        if (ret_len)
            *ret_len = len;
    }
    return buf;
}

/* Write path atomically (temporary file, rename) with mode. */
static int put_file(const char *path, const char *data, size_t len, mode_t mode)
{
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid()) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0)
        return -errno;
    int r = fchmod(fd, mode) < 0 ? -errno : 0;
    for (size_t off = 0; r == 0 && off < len;) {
        ssize_t n = write(fd, data + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            r = n < 0 ? -errno : -EIO;
        else
            off += (size_t)n;
    }
    if (r == 0 && fsync(fd) < 0)
        r = -errno;
    (void)close(fd);
    if (r == 0 && rename(tmp, path) < 0)
        r = -errno;
    if (r < 0)
        (void)unlink(tmp);
    return r;
}

static int parse_num(const char *s, unsigned long max, unsigned long *ret)
{
    unsigned long v = 0;
    if (!*s)
        return -EINVAL;
    for (; *s && *s != '\n'; s++) {
        if (*s < '0' || *s > '9' || v > (max - (unsigned long)(*s - '0')) / 10)
            return -EINVAL;
        v = v * 10 + (unsigned long)(*s - '0');
    }
    *ret = v;
    return 0;
}

/* One `sbx up` or `sbx down` at a time per state directory: <state>/up.lock, held (flock) until
 * the command ends. Another waits for it, saying so, then finds what the first left (so two
 * `sbx up` at once start one control and one node). Close-on-exec: the daemons never hold it.
 * Returns the descriptor, or -1 when the directory does not exist (create == false). */
static int state_lock(const char *state, bool create)
{
    char path[PATH_MAX];
    if (path_join(path, sizeof path, state, "up.lock") < 0)
        return -1;
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600);
    if (fd < 0)
        return -1;
    if (flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK) {
        fprintf(stderr, "sbx: waiting for another `sbx up` or `sbx down` on %s\n", state);
        while (flock(fd, LOCK_EX) < 0 && errno == EINTR)
            ;
    }
    return fd;
}

/* The pid in <state>/<name>.pid when that process is alive and runs the binary `name`; else 0. */
static pid_t running_pid(const char *state, const char *name)
{
    char path[PATH_MAX], file[64];
    (void)snprintf(file, sizeof file, "%s.pid", name);
    if (path_join(path, sizeof path, state, file) < 0)
        return 0;
    char *text = slurp(path, NULL);
    unsigned long pid = 0;
    int r = text ? parse_num(text, INT32_MAX, &pid) : -ENOENT;
    free(text);
    if (r < 0 || pid == 0 || kill((pid_t)pid, 0) < 0)
        return 0;
    char exe_link[64], exe[PATH_MAX];
    (void)snprintf(exe_link, sizeof exe_link, "/proc/%lu/exe", pid);
    ssize_t n = readlink(exe_link, exe, sizeof exe - 1);
    if (n <= 0)
        return 0;
    exe[n] = 0;
    const char *base = strrchr(exe, '/');
    base = base ? base + 1 : exe;
    /* a rebuilt binary reads "sbx-node (deleted)" */
    size_t nl = strlen(name);
    if (strncmp(base, name, nl) != 0 || (base[nl] != 0 && base[nl] != ' '))
        return 0;
    /* not a zombie */
    char stat_path[64];
    (void)snprintf(stat_path, sizeof stat_path, "/proc/%lu/stat", pid);
    char *st = slurp(stat_path, NULL);
    const char *rp = st ? strrchr(st, ')') : NULL;
    bool zombie = rp && rp[1] == ' ' && rp[2] == 'Z';
    free(st);
    return zombie ? 0 : (pid_t)pid;
}

/* The directory of this binary (where sbx-control and sbx-node are looked for). */
static int self_dir(char *out, size_t cap)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return -errno;
    exe[n] = 0;
    return snprintf(out, cap, "%s", dirname(exe)) >= (int)cap ? -ENAMETOOLONG : 0;
}

/* Start argv[0] as a daemon: a session of its own, stdin /dev/null, stdout and stderr appended
 * to log; its pid written to pidfile. SBX_HOME and SBX_TOKEN are not passed on. */
static int spawn_daemon(char *const argv[], const char *log, const char *pidfile, pid_t *ret)
{
    int lfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (lfd < 0)
        return -errno;
    int nfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nfd < 0) {
        (void)close(lfd);
        return -errno;
    }
    pid_t pid = fork();
    if (pid < 0) {
        (void)close(lfd);
        (void)close(nfd);
        return -errno;
    }
    if (pid == 0) {
        (void)setsid();
        if (dup2(nfd, 0) < 0 || dup2(lfd, 1) < 0 || dup2(lfd, 2) < 0)
            _exit(127);
        (void)unsetenv("SBX_TOKEN");
        (void)unsetenv("SBX_NAMESPACE");
        execv(argv[0], argv);
        dprintf(2, "sbx up: cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    (void)close(lfd);
    (void)close(nfd);
    char text[32];
    int n = snprintf(text, sizeof text, "%d\n", (int)pid);
    int r = put_file(pidfile, text, (size_t)n, 0644);
    *ret = pid;
    return r;
}

/* A child that died: print the end of its log. */
static bool died(pid_t pid, const char *name, const char *log)
{
    int status;
    if (waitpid(pid, &status, WNOHANG) != pid)
        return false;
    fprintf(stderr, "sbx: %s exited at start (status %d); the end of %s:\n", name,
            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), log);
    size_t len = 0;
    char *text = slurp(log, &len);
    if (text) {
        fputs(text + (len > 3000 ? len - 3000 : 0), stderr);
        free(text);
    }
    return true;
}

static int parse_up(int argc, char **argv, up_opts_t *o, bool up)
{
    static const struct option lo[] = { { "state", required_argument, 0, 's' },
                                        { "port", required_argument, 0, 'p' },
                                        { "images", required_argument, 0, 'i' },
                                        { "default-image", required_argument, 0, 'd' },
                                        { "wait", required_argument, 0, 'w' },
                                        { "id-range", required_argument, 0, 'r' },
                                        { 0, 0, 0, 0 } };
    const char *state = DEFAULT_STATE;
    unsigned long v;
    int c;
    o->port = 0;
    o->wait_s = START_WAIT_MS / 1000;
    optind = 0;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 's': state = optarg; break;
        case 'p':
            if (!up || parse_num(optarg, 65534, &v) < 0 || v == 0)
                return cli_usage("--port %s: a port 1..65534 (the node takes the next one)",
                                 optarg);
            o->port = (unsigned)v;
            break;
        case 'i':
            if (!up)
                return cli_usage("--images belongs to up");
            o->images = optarg;
            break;
        case 'd':
            if (!up)
                return cli_usage("--default-image belongs to up");
            o->default_image = optarg;
            break;
        case 'r':
            if (!up)
                return cli_usage("--id-range belongs to up");
            o->id_range = optarg;
            break;
        case 'w':
            if (!up || parse_num(optarg, 3600, &v) < 0)
                return cli_usage("--wait %s: seconds expected", optarg);
            o->wait_s = (unsigned)v;
            break;
        default: return EXIT_USAGE;
        }
    }
    if (optind != argc)
        return cli_usage("%s: unexpected argument %s", argv[0], argv[optind]);
    if (state[0] != '/') {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd) ||
            path_join(o->state_dir, sizeof o->state_dir, cwd, state) < 0)
            return cli_usage("--state %s: cannot make it absolute", state);
    } else if (snprintf(o->state_dir, sizeof o->state_dir, "%s", state) >=
               (int)sizeof o->state_dir) {
        return cli_usage("--state: too long");
    }
    return 0;
}

/* The port recorded by the last `sbx up` of this state directory (0 if none). */
static unsigned recorded_port(const char *state)
{
    char path[PATH_MAX];
    unsigned long v = 0;
    if (path_join(path, sizeof path, state, "port") < 0)
        return 0;
    char *t = slurp(path, NULL);
    if (!t || parse_num(t, 65534, &v) < 0)
        v = 0;
    free(t);
    return (unsigned)v;
}

static char *sbx_home_dir(void)
{
    const char *h = getenv("SBX_HOME");
    if (h && *h)
        return strdup(h);
    const char *home = getenv("HOME");
    char *out = NULL;
    if (asprintf(&out, "%s/.sbx", home && *home ? home : "/root") < 0)
        return NULL;
    return out;
}

/* $SBX_HOME/{endpoint, token, ca.crt} from the state directory. */
static int write_home(const up_opts_t *o, const char *home)
{
    char tokfile[PATH_MAX], ca[PATH_MAX], path[PATH_MAX];
    if (path_join(tokfile, sizeof tokfile, o->state_dir, "admin.token") < 0 ||
        path_join(ca, sizeof ca, o->state_dir, "control/tls/ca.crt") < 0)
        return -ENAMETOOLONG;
    size_t tl = 0, cl = 0;
    char *token = slurp(tokfile, &tl);
    char *cacert = slurp(ca, &cl);
    int r = 0;
    if (!token || !tl) {
        fprintf(stderr,
                "sbx: %s is missing: sbx-control writes the admin token there only on the first "
                "start of an empty store; restore it, or start over with a new --state\n",
                tokfile);
        r = -ENOENT;
    } else if (!cacert || !cl) {
        fprintf(stderr, "sbx: %s is missing (sbx-control makes it at start)\n", ca);
        r = -ENOENT;
    }
    if (r == 0)
        r = mkdir_p(home, 0700);
    char endpoint[64];
    int el = snprintf(endpoint, sizeof endpoint, "https://127.0.0.1:%u\n", o->port);
    if (r == 0 && path_join(path, sizeof path, home, "endpoint") == 0)
        r = put_file(path, endpoint, (size_t)el, 0600);
    if (r == 0 && path_join(path, sizeof path, home, "token") == 0)
        r = put_file(path, token, tl, 0600);
    if (r == 0 && path_join(path, sizeof path, home, "ca.crt") == 0)
        r = put_file(path, cacert, cl, 0644);
    if (token)
        memset(token, 0, tl);
    free(token);
    free(cacert);
    if (r < 0 && r != -ENOENT)
        fprintf(stderr, "sbx: cannot write %s: %s\n", home, strerror(-r));
    return r;
}

/* A client built from the state directory itself (not $SBX_HOME). */
static int state_client(const up_opts_t *o, sbx_client_t **ret, sbx_error_t *e)
{
    char endpoint[64], ca[PATH_MAX], tokfile[PATH_MAX];
    (void)snprintf(endpoint, sizeof endpoint, "https://127.0.0.1:%u", o->port);
    if (path_join(ca, sizeof ca, o->state_dir, "control/tls/ca.crt") < 0 ||
        path_join(tokfile, sizeof tokfile, o->state_dir, "admin.token") < 0)
        return -ENAMETOOLONG;
    char *token = slurp(tokfile, NULL);
    if (!token)
        return -ENOENT;
    token[strcspn(token, "\r\n")] = 0;
    sbx_config_t cfg = {
        .endpoint = endpoint, .token = token, .ca_file = ca, .io_timeout_ms = 5000
    };
    int r = sbx_client_new(&cfg, ret, e);
    free(token);
    return r;
}

/* Is a node registered and live? 1 yes, 0 not yet, < 0 cannot ask. */
/* Is a node live that was heard from at or after since_ms (wall clock; 0: any time)? 1 yes,
 * 0 not yet, < 0 cannot ask. A node that was just killed still reads live for a few seconds:
 * since_ms, the restart's time, tells its successor's heartbeats from its last ones. */
static int node_live(const up_opts_t *o, int64_t since_ms)
{
    sbx_client_t *c;
    sbx_error_t e;
    if (state_client(o, &c, &e) < 0)
        return -1;
    char *text = NULL;
    int r = sbx_nodes_list(c, &text, &e);
    sbx_client_free(c);
    if (r < 0)
        return -1;
    json_t *nodes = json_loads(text, 0, NULL);
    sbx_free(text);
    size_t i;
    json_t *n;
    r = 0;
    json_array_foreach(nodes, i, n) {
        if (json_is_true(json_object_get(n, "live")) &&
            json_integer_value(json_object_get(n, "last_seen_ms")) >= since_ms)
            r = 1;
    }
    json_decref(nodes);
    return r;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char up_help[] =
    "usage: sbx up [--state DIR] [--port P] [--images DIR] [--default-image NAME] [--wait S]\n"
    "              [--id-range START:COUNT]\n"
    "Start the local platform: one sbx-control on 127.0.0.1:P (default 49980; its SQLite store\n"
    "in DIR/control, default /var/lib/sbx) and one sbx-node on P+1, logs and pid files in DIR;\n"
    "wait until the node is live; write $SBX_HOME (default ~/.sbx, 0700): endpoint, token\n"
    "(0600), ca.crt. Running again when it runs says so and rewrites $SBX_HOME. Needs root.\n"
    "--images, --id-range: passed to sbx-node; --default-image: to sbx-control. When the\n"
    "default image is debian (the default) and the images directory (default\n"
    "/var/lib/sbx/images) lacks it, sbx-build-image (next to sbx) builds it first, log in\n"
    "DIR/image.log; if that fails, nothing is started.\n";

typedef struct {
    char dir[PATH_MAX], ctl_bin[PATH_MAX], node_bin[PATH_MAX], ctl_state[PATH_MAX],
        node_state[PATH_MAX], ctl_log[PATH_MAX], node_log[PATH_MAX], ctl_pid[PATH_MAX],
        node_pid[PATH_MAX], tokfile[PATH_MAX], join[PATH_MAX], portfile[PATH_MAX];
    char listen[32], nlisten[32];
} up_paths_t;

static int up_paths(const up_opts_t *o, up_paths_t *p)
{
    const char *st = o->state_dir;
    if (self_dir(p->dir, sizeof p->dir) < 0 ||
        path_join(p->ctl_bin, sizeof p->ctl_bin, p->dir, "sbx-control") < 0 ||
        path_join(p->node_bin, sizeof p->node_bin, p->dir, "sbx-node") < 0 ||
        path_join(p->ctl_state, sizeof p->ctl_state, st, "control") < 0 ||
        path_join(p->node_state, sizeof p->node_state, st, "node") < 0 ||
        path_join(p->ctl_log, sizeof p->ctl_log, st, "control.log") < 0 ||
        path_join(p->node_log, sizeof p->node_log, st, "node.log") < 0 ||
        path_join(p->ctl_pid, sizeof p->ctl_pid, st, "sbx-control.pid") < 0 ||
        path_join(p->node_pid, sizeof p->node_pid, st, "sbx-node.pid") < 0 ||
        path_join(p->tokfile, sizeof p->tokfile, st, "admin.token") < 0 ||
        path_join(p->join, sizeof p->join, p->ctl_state, "node-join.token") < 0 ||
        path_join(p->portfile, sizeof p->portfile, st, "port") < 0)
        return -ENAMETOOLONG;
    (void)snprintf(p->listen, sizeof p->listen, "127.0.0.1:%u", o->port);
    (void)snprintf(p->nlisten, sizeof p->nlisten, "127.0.0.1:%u", o->port + 1);
    return 0;
}

static int start_control(const up_opts_t *o, const up_paths_t *p, pid_t *ret)
{
    char *argv[12] = { (char *)p->ctl_bin,   "--state",
                       (char *)p->ctl_state, "--listen",
                       (char *)p->listen,    "--admin-token-file",
                       (char *)p->tokfile,   NULL };
    if (o->default_image) {
        argv[7] = "--default-image";
        argv[8] = (char *)o->default_image;
    }
    (void)unlink(p->join); /* so that the wait that follows sees this process's */
    int r = spawn_daemon(argv, p->ctl_log, p->ctl_pid, ret);
    if (r < 0)
        fprintf(stderr, "sbx: cannot start sbx-control: %s\n", strerror(-r));
    else
        fprintf(stderr, "sbx: started sbx-control (pid %d) on %s, log %s\n", (int)*ret, p->listen,
                p->ctl_log);
    return r;
}

static int start_node(const up_opts_t *o, const up_paths_t *p, pid_t *ret)
{
    char *argv[16] = { (char *)p->node_bin,
                       "--state",
                       (char *)p->node_state,
                       "--listen",
                       (char *)p->nlisten,
                       "--control",
                       (char *)p->listen,
                       "--join-token-file",
                       (char *)p->join,
                       "--name",
                       "node-1",
                       NULL };
    int k = 11;
    if (o->images) {
        argv[k++] = "--images";
        argv[k++] = (char *)o->images;
    }
    if (o->id_range) {
        argv[k++] = "--id-range";
        argv[k++] = (char *)o->id_range;
    }
    int r = spawn_daemon(argv, p->node_log, p->node_pid, ret);
    if (r < 0)
        fprintf(stderr, "sbx: cannot start sbx-node: %s\n", strerror(-r));
    else
        fprintf(stderr, "sbx: started sbx-node (pid %d) on %s, log %s\n", (int)*ret, p->nlisten,
                p->node_log);
    return r;
}

/* Wait until the control plane answers (want_live false) or a node heard from since since_ms
 * is live (true), while the daemon pid that this waits on runs; *waited counts against
 * o->wait_s. Exit code. */
static int wait_up(const up_opts_t *o, const up_paths_t *p, bool want_live, pid_t pid,
                   int64_t since_ms, long *waited)
{
    const char *name = want_live ? "sbx-node" : "sbx-control";
    const char *log = want_live ? p->node_log : p->ctl_log;
    for (;;) {
        int live = node_live(o, since_ms);
        if (want_live ? live == 1 : access(p->join, R_OK) == 0 && live >= 0)
            return EXIT_OK;
        if (died(pid, name, log))
            return EXIT_FAIL;
        if (*waited > (long)o->wait_s * 1000) {
            fprintf(stderr, "sbx: %s is not %s after %u s; see %s\n", name,
                    want_live ? "live" : "answering", o->wait_s, log);
            return EXIT_TIMEOUT;
        }
        sleep_ms(100);
        *waited += 100;
    }
}

static int up_locked(up_opts_t *op);

int cmd_up(const cli_t *cli, int argc, char **argv)
{
    (void)cli;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return fputs(up_help, stdout), EXIT_OK;
    up_opts_t o = { 0 };
    int r = parse_up(argc, argv, &o, true);
    if (r)
        return r;
    if (geteuid() != 0) {
        fprintf(stderr, "sbx: up needs root (the node makes namespaces, mounts and cgroups): "
                        "run it with sudo\n");
        return EXIT_DENIED;
    }
    if ((r = mkdir_p(o.state_dir, 0700)) < 0) {
        fprintf(stderr, "sbx: cannot make %s: %s\n", o.state_dir, strerror(-r));
        return EXIT_FAIL;
    }
    int lock = state_lock(o.state_dir, true);
    r = up_locked(&o);
    if (lock >= 0)
        close(lock);
    return r;
}

/* The default image `debian` (Debian minbase + python3 from the Debian archive) is built by the
 * code that needs it: when the node's images directory lacks it, `sbx up` runs sbx-build-image
 * (scripts/build-image.sh, next to sbx) once, its output in DIR/image.log. Other default
 * images (`host`, or one the user put there) are not built. */
static int ensure_default_image(const up_opts_t *o, const up_paths_t *p)
{
    const char *name = o->default_image ? o->default_image : "debian";
    const char *images = o->images ? o->images : DEFAULT_IMAGES;
    char index[PATH_MAX], builder[PATH_MAX], log[PATH_MAX];
    if (strcmp(name, "debian") != 0)
        return 0;
    if (snprintf(index, sizeof index, "%s/%s/index.json", images, name) >= (int)sizeof index ||
        path_join(builder, sizeof builder, p->dir, "sbx-build-image") < 0 ||
        path_join(log, sizeof log, o->state_dir, "image.log") < 0)
        return -ENAMETOOLONG;
    if (access(index, F_OK) == 0)
        return 0;
    if (access(builder, R_OK) < 0) {
        fprintf(stderr,
                "sbx: the default image %s is not in %s and sbx-build-image is not next to sbx "
                "(%s): run scripts/build-image.sh, or start with --default-image host\n",
                name, images, p->dir);
        return -ENOENT;
    }
    fprintf(stderr,
            "sbx: building the default image %s in %s (Debian minbase + python3 from the Debian "
            "archive; once, a few minutes; log %s)\n",
            name, images, log);
    int64_t t0 = wall_ms();
    int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (lfd < 0)
        return -errno;
    pid_t pid = fork();
    if (pid < 0) {
        (void)close(lfd);
        return -errno;
    }
    if (pid == 0) {
        if (dup2(lfd, 1) < 0 || dup2(lfd, 2) < 0)
            _exit(127);
        char *const argv[] = { "bash",   builder,      "--out", (char *)images,
                               "--name", (char *)name, NULL };
        execv("/bin/bash", argv);
        _exit(127);
    }
    (void)close(lfd);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -errno;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr,
                "sbx: building the default image failed (see %s); fix that and run sbx up "
                "again, or start with --default-image host\n",
                log);
        return -EIO;
    }
    /* a builder that says it succeeded but left no image would start a platform whose every
     * sandbox is refused (no node offers the default image): stop here instead */
    if (access(index, F_OK) < 0) {
        fprintf(stderr,
                "sbx: sbx-build-image exited 0 but %s is missing (see %s); run sbx up again, "
                "or start with --default-image host\n",
                index, log);
        return -EIO;
    }
    fprintf(stderr, "sbx: default image %s built in %.0f s\n", name,
            (double)(wall_ms() - t0) / 1000);
    return 0;
}

/* sbx up, with <state>/up.lock held. */
static int up_locked(up_opts_t *op)
{
    up_opts_t o = *op;
    int r;
    unsigned rec = recorded_port(o.state_dir);
    pid_t cpid = running_pid(o.state_dir, "sbx-control"),
          npid = running_pid(o.state_dir, "sbx-node");
    if (cpid && npid && rec && o.port && rec != o.port)
        fprintf(stderr, "sbx: already running on port %u (not %u); `sbx down` first to change it\n",
                rec, o.port);
    if (!o.port || (cpid && rec))
        o.port = rec ? rec : DEFAULT_PORT;
    static up_paths_t p;
    char *home = sbx_home_dir();
    if (!home || up_paths(&o, &p) < 0) {
        free(home);
        return cli_usage("paths too long");
    }
    if (cpid && npid) {
        r = write_home(&o, home) < 0 ? EXIT_FAIL : EXIT_OK;
        if (r == EXIT_OK)
            printf("sbx: already running (control pid %d, node pid %d, https://127.0.0.1:%u, "
                   "state %s); client configuration refreshed in %s\n",
                   (int)cpid, (int)npid, o.port, o.state_dir, home);
        free(home);
        return r;
    }
    if (access(p.ctl_bin, X_OK) < 0 || access(p.node_bin, X_OK) < 0) {
        fprintf(stderr,
                "sbx: sbx-control and sbx-node must sit next to sbx (%s): build them "
                "(bash scripts/build.sh) or install them together\n",
                p.dir);
        free(home);
        return EXIT_FAIL;
    }
    if (!cpid && ensure_default_image(&o, &p) < 0) {
        free(home);
        return EXIT_FAIL;
    }
    char port_text[16];
    int pl = snprintf(port_text, sizeof port_text, "%u\n", o.port);
    (void)put_file(p.portfile, port_text, (size_t)pl, 0644);
    long waited = 0;
    r = !cpid && start_control(&o, &p, &cpid) < 0 ? EXIT_FAIL : EXIT_OK;
    if (r == EXIT_OK)
        r = wait_up(&o, &p, false, cpid, 0, &waited);
    int64_t node_start = npid ? 0 : wall_ms();
    if (r == EXIT_OK && !npid && start_node(&o, &p, &npid) < 0)
        r = EXIT_FAIL;
    if (r == EXIT_OK)
        r = wait_up(&o, &p, true, npid, node_start, &waited);
    if (r == EXIT_OK)
        r = write_home(&o, home) < 0 ? EXIT_FAIL : EXIT_OK;
    if (r == EXIT_OK)
        printf("sbx: platform up at https://127.0.0.1:%u (state %s); client configuration in "
               "%s\n",
               o.port, o.state_dir, home);
    free(home);
    return r;
}

/* Wait up to ms for the process behind pidfd to have exited (a zombie or gone): its pidfd
 * turns readable then. 1 exited, 0 not yet, < 0 cannot tell. */
static int pidfd_wait_exit(int pidfd, int ms)
{
    struct pollfd pf = { .fd = pidfd, .events = POLLIN };
    int64_t end = wall_ms() + ms;
    for (;;) {
        int64_t left = end - wall_ms();
        int r = poll(&pf, 1, left > 0 ? (int)left : 0);
        if (r >= 0 || errno != EINTR)
            return r > 0 ? 1 : r == 0 ? 0 : -errno;
    }
}

/* SIGTERM, then wait until it has exited (SIGKILL after STOP_WAIT_MS). The daemon is held by a
 * pidfd, checked to still be it once open, and "stopped" means that process has exited: its
 * /proc/PID/exe goes earlier, while the kernel still tears it down (a sanitizer build's
 * mappings take a while), and a daemon seen gone by that was still alive after "stopped". */
static int stop_one(const char *state, const char *name)
{
    pid_t pid = running_pid(state, name);
    char pidfile[PATH_MAX], file[64];
    (void)snprintf(file, sizeof file, "%s.pid", name);
    (void)path_join(pidfile, sizeof pidfile, state, file);
    if (!pid) {
        (void)unlink(pidfile);
        return 0;
    }
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0), r = 1;
    if (pidfd < 0 && errno != ESRCH) {
        fprintf(stderr, "sbx: cannot hold %s (pid %d) to stop it: %s\n", name, (int)pid,
                strerror(errno));
        return 1;
    }
    if (pidfd >= 0 && running_pid(state, name) == pid) {
        (void)syscall(SYS_pidfd_send_signal, pidfd, SIGTERM, NULL, 0);
        r = pidfd_wait_exit(pidfd, STOP_WAIT_MS);
        if (r == 0) {
            fprintf(stderr, "sbx: %s (pid %d) did not stop within %d s: SIGKILL\n", name, (int)pid,
                    STOP_WAIT_MS / 1000);
            (void)syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
            (void)pidfd_wait_exit(pidfd, STOP_WAIT_MS);
        } else if (r < 0)
            fprintf(stderr, "sbx: waiting for %s (pid %d): %s\n", name, (int)pid, strerror(-r));
    }
    if (pidfd >= 0)
        close(pidfd);
    if (r > 0) /* exited, by our signal or just before it */
        printf("sbx: stopped %s (pid %d)\n", name, (int)pid);
    (void)unlink(pidfile);
    return 1;
}

static const char down_help[] =
    "usage: sbx down [--state DIR]\nStop the local platform's sbx-node, then its sbx-control\n"
    "(SIGTERM, then a wait). The store and every job record are kept; `sbx up` starts them "
    "again.\n";

int cmd_down(const cli_t *cli, int argc, char **argv)
{
    (void)cli;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return fputs(down_help, stdout), EXIT_OK;
    up_opts_t o = { 0 };
    int r = parse_up(argc, argv, &o, false);
    if (r)
        return r;
    int lock = state_lock(o.state_dir, false);
    int n = stop_one(o.state_dir, "sbx-node") + stop_one(o.state_dir, "sbx-control");
    if (lock >= 0)
        close(lock);
    if (n == 0)
        printf("sbx: not running (state %s)\n", o.state_dir);
    return EXIT_OK;
}

static const char status_help[] =
    "usage: sbx status [--state DIR]\nWhether the local platform's daemons run and its node is\n"
    "live. Exit 0 when all is up, 4 when not.\n";

int cmd_status(const cli_t *cli, int argc, char **argv)
{
    (void)cli;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return fputs(status_help, stdout), EXIT_OK;
    up_opts_t o = { 0 };
    int r = parse_up(argc, argv, &o, false);
    if (r)
        return r;
    o.port = recorded_port(o.state_dir);
    if (!o.port)
        o.port = DEFAULT_PORT;
    pid_t c = running_pid(o.state_dir, "sbx-control"), n = running_pid(o.state_dir, "sbx-node");
    printf("state     %s\n", o.state_dir);
    printf("control   %s", c ? "running" : "stopped");
    if (c)
        printf(" (pid %d, https://127.0.0.1:%u)", (int)c, o.port);
    printf("\nnode      %s", n ? "running" : "stopped");
    if (n)
        printf(" (pid %d)", (int)n);
    int live = c ? node_live(&o, 0) : -1;
    printf("\nnode live %s\n", live == 1 ? "yes" : live == 0 ? "no" : "unknown");
    return c && n && live == 1 ? EXIT_OK : EXIT_UNREACHABLE;
}
