# SPDX-License-Identifier: MIT
"""Probes for the hostile suite (test_run_boundary.py): attacks written as small Python
functions, run as one batch inside a dedicated run or a pooled sandbox, and run again as the
positive control where the control is "the same code works elsewhere" (on the host as root, in
the victim tenant's own run, in the sibling sandbox).

RUNNER is a self-contained script: `python3 runner.py CTX.json [--host]`. It runs every probe of
CTX["probes"] ({case id: source defining `probe(C)`}) in a forked child of its own (so a probe
that dies, hangs or changes its process state cannot spoil another), 16 at a time, each under an
alarm, and prints one JSON object {case id: {"r": result} | {"exc": text}}. With --host, every
child first makes itself a private mount namespace, so that the mount probes run as the host's
root never change the host's mounts.

Probes return "ok" (or "ok:<what was read>") when the operation went through and the errno name
when it was refused; a few return small dicts. x86_64 syscall numbers.
"""
import os

RUNNER = r'''
import ctypes, errno, json, os, select, signal, socket, struct, sys, time

assert os.uname().machine == "x86_64", "the probes use x86_64 syscall numbers"
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def en(n):
    return errno.errorcode.get(n, str(n))


def _arg(x):
    if isinstance(x, bool):
        return ctypes.c_long(int(x))
    if isinstance(x, int):
        return ctypes.c_long(x)
    if isinstance(x, bytes):
        return ctypes.c_char_p(x)
    return x


def sc(nr, *args):
    """A raw system call: "ok" (a returned descriptor is left open) or the errno name."""
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    return "ok" if r >= 0 else en(ctypes.get_errno())


def sc_val(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    return r if r >= 0 else en(ctypes.get_errno())


def attempt(f):
    try:
        v = f()
        return "ok" if v is None else v
    except OSError as e:
        return en(e.errno)


def read_file(path, n=65536):
    try:
        with open(path, "rb") as f:
            return "ok:" + f.read(n).decode(errors="replace")
    except OSError as e:
        return en(e.errno)


def write_same(path):
    """Open a host-global file for writing and write back what it holds (a no-op if it works)."""
    try:
        with open(path) as f:
            cur = f.read()
    except OSError:
        cur = None
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError as e:
        return en(e.errno)
    try:
        if cur is not None:
            os.write(fd, cur.encode())
        return "ok"
    except OSError as e:
        return "open-ok-write-" + en(e.errno)
    finally:
        os.close(fd)


def open_only(path, flags=os.O_WRONLY):
    try:
        os.close(os.open(path, flags))
        return "ok"
    except OSError as e:
        return en(e.errno)


def _fam(host):
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _answer(s):
    """"ok:" + what s answers: read until EOF, 400 bytes or a pause (an answer may come in
    several segments)."""
    data = b""
    try:
        while len(data) < 400:
            chunk = s.recv(400)
            if not chunk:
                break
            data += chunk
            s.settimeout(0.3)
    except socket.timeout:
        pass
    return "ok:" + data.decode(errors="replace")


def tcp(host, port, msg=b"", timeout=2.0, wrap=None):
    """Connect, send msg, return the answer ("ok:..."), "timeout" or the errno's name. wrap:
    a function that layers the connected socket (TLS)."""
    s = socket.socket(_fam(host), socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect((host, port))
        c = wrap(s) if wrap else s
        if msg:
            c.sendall(msg)
        return _answer(c)
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return en(e.errno) if e.errno else "tls-error"
    finally:
        s.close()


def tls(host, port, msg, timeout=2.0):
    """tcp() through TLS, the certificate unchecked (the platform's daemons speak TLS: what is
    probed is whether they can be reached at all)."""
    import ssl
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return tcp(host, port, msg, timeout, wrap=ctx.wrap_socket)


def udp(host, port, msg, timeout=1.5):
    s = socket.socket(_fam(host), socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        s.sendto(msg, (host, port))
        d, _ = s.recvfrom(200)
        return "ok:" + d.decode(errors="replace")
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return en(e.errno)
    finally:
        s.close()


def unix(addr, msg=b"probe\n", timeout=2.0):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(addr)
        s.sendall(msg)
        try:
            data = s.recv(200)
        except socket.timeout:
            data = b""
        return "ok:" + data.decode(errors="replace")
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return en(e.errno)
    finally:
        s.close()


def private_mounts():
    """--host: the probe runs in a mount namespace of its own, changes never propagate."""
    CLONE_NEWNS = 0x20000
    if libc.unshare(CLONE_NEWNS) != 0:
        raise SystemExit("unshare(CLONE_NEWNS) failed on the host")
    if libc.mount(None, b"/", None, ctypes.c_ulong(0x4000 | 0x40000), None) != 0:  # REC|PRIVATE
        raise SystemExit("making / private failed on the host")


def scratch():
    """A directory this probe may write: /tmp, or the working directory (a sandbox's home)."""
    d = "/tmp/sbx-hostile-scratch-%d" % os.getpid()
    try:
        os.mkdir(d)
        os.rmdir(d)
        return "/tmp"
    except OSError:
        return os.getcwd()


def enter_netns(path):
    """--host with C["netns"]: the control runs in that network namespace (a sandbox's)."""
    fd = os.open(path, os.O_RDONLY)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise SystemExit("setns(%s) failed: %s" % (path, en(ctypes.get_errno())))
    os.close(fd)


def child(name, src, C, host, w):
    signal.alarm(12)
    try:
        if host:
            private_mounts()
            if C.get("netns"):
                enter_netns(C["netns"])
        g = dict(globals())
        exec(compile(src, "probe:" + name, "exec"), g)
        out = {"r": g["probe"](C)}
    except BaseException as e:
        out = {"exc": repr(e)}
    data = json.dumps(out).encode()
    while data:
        n = os.write(w, data)
        data = data[n:]
    os._exit(0)


def main():
    C = json.load(open(sys.argv[1]))
    host = "--host" in sys.argv
    results = {}
    todo = list(C["probes"].items())
    running = {}  # read fd -> (name, pid, chunks)
    while todo or running:
        while todo and len(running) < 16:
            name, src = todo.pop(0)
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                child(name, src, C, host, w)
            os.close(w)
            running[r] = (name, pid, [])
        ready, _, _ = select.select(list(running), [], [], 20)
        if not ready:
            for r, (name, pid, _) in running.items():
                os.kill(pid, signal.SIGKILL)
        for r in ready:
            name, pid, chunks = running[r]
            b = os.read(r, 65536)
            if b:
                chunks.append(b)
                continue
            os.close(r)
            del running[r]
            _, st = os.waitpid(pid, 0)
            try:
                results[name] = json.loads(b"".join(chunks))
            except ValueError:
                results[name] = {"exc": "probe died: wait status %d" % st}
    print(json.dumps(results))


main()
'''

# ---- the host side: canary services (a process of their own) ---------------------------------

CANARY = r'''
import json, os, socket, sys, threading
log_path, secret, abs_name, sock_path = sys.argv[1:5]
lock = threading.Lock()


def note(what, data):
    with lock, open(log_path, "a") as f:
        f.write(json.dumps([what, data.decode(errors="replace")]) + "\n")


def serve_stream(s, what):
    while True:
        c, _ = s.accept()
        c.settimeout(1)
        try:
            data = c.recv(200)
        except OSError:
            data = b""
        note(what, data)
        try:
            c.sendall(("CANARY-" + secret + "\n").encode())
        except OSError:
            pass
        c.close()


def serve_dgram(s, what):
    while True:
        data, peer = s.recvfrom(200)
        note(what, data)
        s.sendto(("CANARY-" + secret + "\n").encode(), peer)


t4 = socket.socket(socket.AF_INET)
t4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t4.bind(("127.0.0.1", 0))
port = t4.getsockname()[1]
t6 = socket.socket(socket.AF_INET6)
t6.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
t6.bind(("::1", port))
u4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u4.bind(("127.0.0.1", 0))
u6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
u6.bind(("::1", 0))
ab = socket.socket(socket.AF_UNIX)
ab.bind("\0" + abs_name)
px = socket.socket(socket.AF_UNIX)
px.bind(sock_path)
os.chmod(sock_path, 0o777)
for s in (t4, t6, ab, px):
    s.listen(64)
for s, w in ((t4, "tcp4"), (t6, "tcp6"), (ab, "abstract"), (px, "path")):
    threading.Thread(target=serve_stream, args=(s, w), daemon=True).start()
for s, w in ((u4, "udp4"), (u6, "udp6")):
    threading.Thread(target=serve_dgram, args=(s, w), daemon=True).start()
print(json.dumps({"tcp": port, "udp4": u4.getsockname()[1], "udp6": u6.getsockname()[1]}),
      flush=True)
sys.stdin.read()  # until the test closes our stdin
'''

# ---- services a tenant runs in its own run (the victim) or sandbox (the sibling) --------------

# argv: port udp_port abstract_name secret [ready_file]. TCP on 0.0.0.0 and ::, UDP echo on
# 0.0.0.0, an abstract unix socket; each answers with the secret.
TENANT_SERVICES = r'''
import os, socket, sys, threading
port, uport, abs_name, secret = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
ready = sys.argv[5] if len(sys.argv) > 5 else None
reply = ("TENANT-" + secret + "\n").encode()


def serve(s):
    while True:
        c, _ = s.accept()
        try:
            c.settimeout(1)
            try:
                c.recv(200)
            except OSError:
                pass
            c.sendall(reply)
        except OSError:
            pass
        c.close()


def echo(s):
    while True:
        d, peer = s.recvfrom(200)
        s.sendto(reply, peer)


errors = []


def start(make, target):
    try:
        s = make()
    except OSError as e:  # each service on its own: one refused bind must not hide the others
        errors.append(repr(e))
        return None
    threading.Thread(target=target, args=(s,), daemon=True).start()
    return s


def stream(fam, addr):
    def make():
        s = socket.socket(fam)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if fam == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if addr is not None:
            s.bind(addr)
        s.listen(16)  # addr None: autobound by listen(), the kernel picks the port
        return s
    return make


def dgram():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", uport))
    return s


start(stream(socket.AF_INET, ("0.0.0.0", port)), serve)
start(stream(socket.AF_INET6, ("::", port)), serve)
start(stream(socket.AF_UNIX, "\0" + abs_name), serve)
auto = start(stream(socket.AF_INET, None), serve)
start(dgram, echo)
if ready:
    with open(ready + ".tmp", "w") as f:
        f.write("%d\n%s" % (auto.getsockname()[1] if auto else 0, errors))
    os.rename(ready + ".tmp", ready)
threading.Event().wait()
'''

# ---- the catalogue ----------------------------------------------------------------------------

# Errno names that mean "refused" for a system call the seccomp profile blocks.
DENIED = {"EPERM", "EACCES", "ENOSYS"}


class Case:
    """One attack. src defines probe(C); it runs in the dedicated attacker run ("ded") and/or a
    pooled sandbox ("pool"). refused(r, E) says the attack failed; the positive control is the
    same code (or host_src) run by `control`: "host" (root on the host), "victim" (the other
    tenant in its own run) or "sibling" (root on the host inside the sibling sandbox's network
    namespace: Landlock scopes abstract sockets per exec, so the sibling's own later exec could
    not be the control), for which works(c, E) must hold; after(E, who), when given, checks the
    host afterwards (nothing changed)."""

    def __init__(self, cid, src, where=("ded", "pool"), control="host", refused=None,
                 works=None, host_src=None, after=None):
        self.id = cid
        self.src = src
        self.where = where
        self.control = control
        self.refused = refused or (lambda r, E: not str(r).startswith("ok"))
        self.works = works or (lambda c, E: str(c).startswith("ok"))
        self.host_src = host_src
        self.after = after

    def __repr__(self):
        return self.id


def ret(expr):
    return "def probe(C):\n    return " + expr + "\n"


CASES = []


def add(*a, **kw):
    c = Case(*a, **kw)
    assert c.id not in {x.id for x in CASES}, c.id
    CASES.append(c)
    return c


def sysctl_unchanged(name):
    def after(E, who):
        with open("/proc/sys/" + name) as f:
            assert f.read() == E.sysctls[name], f"host {name} changed"
    return after


# /proc/sys: every write is a host-wide change (or, for a namespaced knob, still refused: the
# whole of /proc/sys is read-only in a run). The probe writes back the value it reads.
SYSCTLS = ["kernel/core_pattern", "kernel/panic", "kernel/pid_max", "net/ipv4/ip_forward",
           "kernel/sysrq", "vm/overcommit_memory", "fs/file-max", "kernel/randomize_va_space",
           "fs/inotify/max_user_watches", "fs/inotify/max_user_instances", "kernel/keys/maxkeys",
           "kernel/printk", "kernel/perf_event_paranoid", "kernel/kptr_restrict",
           "kernel/dmesg_restrict", "vm/swappiness", "fs/suid_dumpable",
           "kernel/io_uring_disabled", "net/core/somaxconn",
           "kernel/poweroff_cmd", "kernel/core_uses_pid"]
# Only what this host's kernel has: a knob the host lacks has no positive control (the case
# would pass for the wrong reason), so it is not a case here.
SYSCTLS = [n for n in SYSCTLS if os.path.exists("/proc/sys/" + n)]
for _n in SYSCTLS:
    add("sysctl-write-" + _n.replace("/", "."), ret(f'write_same("/proc/sys/{_n}")'),
        refused=lambda r, E: r != "ok", works=lambda c, E: c == "ok", after=sysctl_unchanged(_n))
add("sysctl-drop-caches", ret('open_only("/proc/sys/vm/drop_caches")'),
    refused=lambda r, E: r != "ok", works=lambda c, E: c == "ok")
if os.path.exists("/proc/sysrq-trigger"):
    add("proc-sysrq-trigger", ret('open_only("/proc/sysrq-trigger")'),
        refused=lambda r, E: r != "ok", works=lambda c, E: c == "ok")


def _nonempty_read(path, n):
    return ("def probe(C):\n"
            f"    r = read_file({path!r}, {n})\n"
            "    return r if not r.startswith('ok:') else 'ok:%d' % (len(r) - 3)\n")


def _got_bytes(r, E):
    return str(r).startswith("ok:") and r != "ok:0"


for _p, _n in (("/proc/kcore", 4096), ("/proc/kpageflags", 64), ("/proc/kpagecount", 64),
               ("/proc/kpagecgroup", 64), ("/proc/timer_list", 4096)):
    if not os.path.exists(_p):
        continue
    add("proc-read-" + _p.split("/")[-1], _nonempty_read(_p, _n),
        refused=lambda r, E: not _got_bytes(r, E), works=_got_bytes)
add("proc-read-kallsyms-addresses", """
def probe(C):
    r = read_file("/proc/kallsyms", 1 << 20)
    if not r.startswith("ok:"):
        return r
    return "ok:%d" % sum(1 for l in r[3:].splitlines() if l and l.split()[0].strip("0"))
""", refused=lambda r, E: not _got_bytes(r, E), works=_got_bytes)
add("proc-keys-host-root-key", ret("read_file('/proc/keys')"),
    refused=lambda r, E: E.key_desc not in str(r), works=lambda c, E: E.key_desc in c)
add("proc-kmsg", """
def probe(C):
    # Opening /proc/kmsg is the kernel's CAP_SYSLOG check; a file masked by /dev/null opens but
    # is a character device that holds nothing. (Never read it: a read takes the host's messages.)
    try:
        fd = os.open("/proc/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        return en(e.errno)
    st = os.fstat(fd)
    os.close(fd)
    return "masked" if (st.st_mode & 0o170000) == 0o020000 else "ok"
""", refused=lambda r, E: r != "ok", works=lambda c, E: c == "ok")
add("dev-kmsg", ret("open_only('/dev/kmsg', os.O_RDONLY | os.O_NONBLOCK)"),
    refused=lambda r, E: r != "ok", works=lambda c, E: c == "ok")
add("syslog-read-all", """
def probe(C):
    buf = ctypes.create_string_buffer(4096)
    return sc(103, 3, buf, 4096)
""", refused=lambda r, E: r in DENIED, works=lambda c, E: c == "ok")


def denied(r, E):
    return r in DENIED


def eperm(r, E):
    return r == "EPERM"


def reached(refusal):
    """Control: the call reached the kernel (a result other than the refusal)."""
    return lambda c, E: c not in refusal and not str(c).startswith("exc")


# -- system calls the default profile refuses --
add("io_uring-setup", """
def probe(C):
    params = ctypes.create_string_buffer(120)
    return sc(425, 8, params)
""", refused=denied, works=lambda c, E: c == "ok")
add("io_uring-enter", ret("sc(426, -1, 0, 0, 0, None, 0)"), refused=denied,
    works=reached(DENIED))
add("io_uring-register", ret("sc(427, -1, 0, None, 0)"), refused=denied, works=reached(DENIED))
add("keyctl-user-keyring", ret("sc(250, 0, -4, 0)"), refused=denied,
    works=lambda c, E: c == "ok")
add("keyctl-search-host-root-key", ret("sc_val(250, 10, -4, b'user', C['key_desc'].encode(), 0)"),
    refused=lambda r, E: not isinstance(r, int), works=lambda c, E: isinstance(c, int))
add("add_key", ret("sc(248, b'user', b'sbx-hostile-probe', b'x', 1, -2)"), refused=denied,
    works=lambda c, E: c == "ok")
add("request_key", ret("sc(249, b'user', b'sbx-hostile-none', None, 0)"), refused=denied,
    works=reached(DENIED))
# POSIX message queues: a pooled sandbox shares the host's IPC namespace, where a queue would
# outlive the sandbox (the next tenant of its uid could open it) and reach the host's; the
# syscalls are not in the filter, Landlock refuses the mqueue mount (not in its rules). A
# dedicated run has an IPC namespace of its own (its queues are its own), so pool only.
add("mq_open-create", """
def probe(C):
    r = sc_val(240, b'sbx-hostile-mq', os.O_CREAT | os.O_RDWR, 0o600, None)
    if isinstance(r, int):
        os.close(r)
        sc(241, b'sbx-hostile-mq')
        return "ok"
    return r
""", where=("pool",), refused=denied, works=lambda c, E: c == "ok")
add("bpf-map-create", """
def probe(C):
    attr = ctypes.create_string_buffer(struct.pack("IIII", 2, 4, 4, 1), 128)
    return sc(321, 0, attr, 128)
""", refused=denied, works=lambda c, E: c == "ok")
add("perf_event_open", """
def probe(C):
    attr = ctypes.create_string_buffer(
        struct.pack("IIQQQQQ", 1, 128, 0, 0, 0, 0, 1 | 32 | 64), 128)
    return sc(298, attr, 0, -1, -1, 0)
""", refused=denied, works=lambda c, E: c == "ok")
add("userfaultfd", ret("sc(323, 0o2000000)"), refused=denied, works=lambda c, E: c == "ok")
add("kexec_load", ret("sc(246, 0, 0, 0, 0x7f000000)"), refused=eperm,
    works=reached({"EPERM"}))
add("kexec_file_load", ret("sc(320, -1, -1, 0, b'', 0)"), refused=eperm,
    works=reached({"EPERM"}))
add("init_module", ret("sc(175, None, 0, b'')"), refused=eperm, works=reached({"EPERM"}))
add("finit_module", ret("sc(313, -1, b'', 0)"), refused=eperm, works=reached({"EPERM"}))
add("delete_module", ret("sc(176, b'sbx_hostile_none', 0)"), refused=eperm,
    works=reached({"EPERM"}))
add("clock_settime-realtime", """
def probe(C):
    ts = ctypes.create_string_buffer(16)
    libc.clock_gettime(0, ts)
    return sc(227, 0, ts)
""", refused=denied, works=lambda c, E: c == "EINVAL", host_src="""
def probe(C):
    ts = ctypes.create_string_buffer(16)
    libc.clock_gettime(1, ts)
    return sc(227, 1, ts)   # CLOCK_MONOTONIC cannot be set: EINVAL once past the checks
""")
add("settimeofday", """
def probe(C):
    tv = ctypes.create_string_buffer(16)
    libc.gettimeofday(tv, None)
    return sc(164, tv, None)
""", refused=denied, works=lambda c, E: c == "EINVAL", host_src="""
def probe(C):
    tv = ctypes.create_string_buffer(struct.pack("qq", 0, 2000000), 16)  # tv_usec out of range
    return sc(164, tv, None)
""")
add("adjtimex-tick", """
def probe(C):
    tx = ctypes.create_string_buffer(208)
    struct.pack_into("I", tx, 0, 0x4000)      # ADJ_TICK
    struct.pack_into("q", tx, 96, 10000)      # tick: the default (no change)
    return sc(159, tx)
""", refused=denied, works=lambda c, E: c == "ok", host_src="""
def probe(C):
    tx = ctypes.create_string_buffer(208)     # modes 0: read the clock's state
    return sc(159, tx)
""")
CLONE_NEWUSER = 0x10000000
add("unshare-newuser", ret(f"sc(272, {CLONE_NEWUSER})"), refused=denied,
    works=lambda c, E: c == "ok")
add("unshare-newuser-newns", ret(f"sc(272, {CLONE_NEWUSER | 0x20000})"), refused=denied,
    works=lambda c, E: c == "ok")
add("clone-newuser", f"""
def probe(C):
    r = sc_val(56, {CLONE_NEWUSER} | 17, 0, 0, 0, 0)
    if r == 0:
        os._exit(0)
    if isinstance(r, int):
        os.waitpid(r, 0)
        return "ok"
    return r
""", refused=denied, works=lambda c, E: c == "ok")
add("clone3-newuser", f"""
def probe(C):
    args = ctypes.create_string_buffer(struct.pack("QQQQQQQQ", {CLONE_NEWUSER}, 0, 0, 0, 17,
                                                   0, 0, 0), 64)
    r = sc_val(435, args, 64)
    if r == 0:
        os._exit(0)
    if isinstance(r, int):
        os.waitpid(r, 0)
        return "ok"
    return r
""", refused=denied, works=lambda c, E: c == "ok")

# Namespaces of the run are the host's to make: a dedicated run makes none, a pool host only
# the ones the agent needs for sandboxes (never from a sandbox).
for _ns, _flag in (("mount", 0x20000), ("net", 0x40000000), ("uts", 0x4000000),
                   ("ipc", 0x8000000), ("pid", 0x20000000), ("cgroup", 0x2000000)):
    add(f"unshare-new{_ns}", ret(f"sc(272, {_flag})"), refused=denied,
        works=lambda c, E: c == "ok")
add("no-new-privs", """
def probe(C):
    for l in open("/proc/self/status"):
        if l.startswith("NoNewPrivs:"):
            return int(l.split()[1])
""", refused=lambda r, E: r == 1, works=lambda c, E: c == 0)
add("sethostname", ret("attempt(lambda: socket.sethostname(socket.gethostname()))"),
    refused=denied, works=lambda c, E: c == "ok")
add("ip-link-set-mtu", """
def probe(C):
    import fcntl
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ifr = bytearray(struct.pack("16si20x", b"lo", 0))
    try:
        fcntl.ioctl(s, 0x8921, ifr)          # SIOCGIFMTU
        fcntl.ioctl(s, 0x8922, ifr)          # SIOCSIFMTU: the same MTU (no change if it works)
        return "ok"
    except OSError as e:
        return en(e.errno)
""", refused=denied, works=lambda c, E: c == "ok")
add("umount-a-proc-mask", """
def probe(C):
    r = sc(166, b"/proc/keys", 2)
    return [r, read_file("/proc/keys")]
""", refused=lambda r, E: r[0] in DENIED and E.key_desc not in r[1],
    works=lambda c, E: E.key_desc in c, host_src=ret("read_file('/proc/keys')"))

add("setxattr-trusted-overlay", """
def probe(C):
    p = scratch() + "/sbx-hostile-xattr-%d" % os.getpid()
    os.mkdir(p)
    try:
        os.setxattr(p, "trusted.overlay.opaque", b"y")
        return "ok"
    except OSError as e:
        return en(e.errno)
    finally:
        os.rmdir(p)
""", refused=lambda r, E: r != "ok", works=lambda c, E: c == "ok")


def _mount_probe(fstype, source, opts="None", flags=0):
    return f"""
def probe(C):
    d = scratch() + "/sbx-hostile-mnt-%d" % os.getpid()
    os.makedirs(d, exist_ok=True)
    try:
        return sc(165, {source!r}.encode(), d.encode(), {fstype!r}.encode(), {flags}, {opts})
    finally:
        libc.umount2(d.encode(), 2)
        os.rmdir(d)
"""


add("mount-tmpfs", _mount_probe("tmpfs", "tmpfs"), refused=denied, works=lambda c, E: c == "ok")
add("mount-devtmpfs", _mount_probe("devtmpfs", "devtmpfs"), refused=denied,
    works=lambda c, E: c == "ok")
add("mount-sysfs", _mount_probe("sysfs", "sysfs"), refused=denied, works=lambda c, E: c == "ok")
add("mount-proc", _mount_probe("proc", "proc"), refused=denied, works=lambda c, E: c == "ok")
add("mount-cgroup-v1-release-agent", _mount_probe("cgroup", "cgroup", "b'none,name=sbxhostile'"),
    refused=denied, works=lambda c, E: c == "ok")
add("mount-bind-root", _mount_probe("", "/", flags=4096), refused=denied,
    works=lambda c, E: c == "ok")
add("umount-proc", ret("sc(166, b'/proc', 2)"), refused=denied, works=lambda c, E: c == "ok")
add("pivot_root", ret("sc(155, b'/tmp', b'/tmp')"), refused=denied, works=reached(DENIED))
add("fsopen", ret("sc(430, b'tmpfs', 0)"), refused=denied, works=lambda c, E: c == "ok")
add("open_tree-clone", ret("sc(428, -100, b'/', 1)"), refused=denied,
    works=lambda c, E: c == "ok")
add("move_mount", ret("sc(429, -1, b'', -1, b'', 0)"), refused=denied, works=reached(DENIED))
add("mount_setattr", ret("sc(442, -1, b'', 0x1000, None, 0)"), refused=denied,
    works=reached(DENIED))
add("swapon", ret("sc(167, b'/tmp/sbx-hostile-no-swap', 0)"), refused=denied,
    works=reached(DENIED))
add("acct", ret("sc(163, b'/tmp/sbx-hostile-no-acct')"), refused=denied, works=reached(DENIED))


def _mknod_probe(kind, major, minor):
    return f"""
def probe(C):
    p = scratch() + "/sbx-hostile-node-%d" % os.getpid()
    try:
        os.mknod(p, {kind} | 0o600, os.makedev({major}, {minor}))
        os.unlink(p)
        return "ok"
    except OSError as e:
        return en(e.errno)
"""


add("mknod-dev-mem", _mknod_probe("0o020000", 1, 1), refused=denied,
    works=lambda c, E: c == "ok")
add("mknod-block-disk", _mknod_probe("0o060000", 8, 0), refused=denied,
    works=lambda c, E: c == "ok")

# -- open_by_handle_at ("shocker"): a handle made on the host for a secret file of the host, on
# the filesystem that holds every run's root here --
add("open_by_handle_at-host-file", """
def probe(C):
    h = bytes.fromhex(C["handle"])
    out = []
    for m in ("/", "/tmp", "/.sbx/bin/sbx-server", "/usr", "/etc", "."):
        try:
            mfd = os.open(m, os.O_RDONLY)
        except OSError as e:
            out.append(en(e.errno))
            continue
        buf = ctypes.create_string_buffer(h, len(h))
        fd = sc_val(304, mfd, buf, 0)
        os.close(mfd)
        if isinstance(fd, int):
            out.append("ok:" + os.read(fd, 200).decode(errors="replace"))
            os.close(fd)
        else:
            out.append(fd)
    return out
""", refused=lambda r, E: isinstance(r, list) and not any(E.secret in x for x in r),
    works=lambda c, E: any(E.secret in x for x in c))

# -- the run's own agent (its pid 1): it holds the run's token (the bearer credential of the
# sandbox at the edge: E2B's envdAccessToken) and every request; the tenant's code, same uid,
# must not read its memory or take its descriptors (it is not dumpable). Control: root on the
# host does both to the host's pid 1. --
_AGENT_MEMORY = """
def probe(C):
    pid = PID
    try:
        with open("/proc/%d/maps" % pid) as f:
            first = f.readline().split()[0]
        start = int(first.split("-")[0], 16)
        with open("/proc/%d/mem" % pid, "rb") as f:
            f.seek(start)
            f.read(16)
        return "ok"
    except OSError as e:
        return en(e.errno)
"""
_AGENT_GETFD = """
def probe(C):
    pidfd = sc_val(434, PID, 0)
    if not isinstance(pidfd, int):
        return pidfd
    try:
        return sc(438, pidfd, 0, 0)
    finally:
        os.close(pidfd)
"""
add("run-agent-memory", _AGENT_MEMORY.replace("PID", "1"), where=("ded",),
    refused=lambda r, E: r in ("EACCES", "EPERM"), works=lambda c, E: c == "ok",
    host_src=_AGENT_MEMORY.replace("PID", "C['canary_pid']"))
add("run-agent-pidfd-getfd", _AGENT_GETFD.replace("PID", "1"), where=("ded",),
    refused=lambda r, E: r == "EPERM", works=lambda c, E: c == "ok",
    host_src=_AGENT_GETFD.replace("PID", "C['canary_pid']"))

# -- host processes: the node, the control plane, a canary process of the host --
add("ptrace-node", ret("sc(101, 0x4206, C['node_pid'], 0, 0)"),
    refused=lambda r, E: r in ("ESRCH", "EPERM"), works=lambda c, E: c == "ok",
    host_src=ret("attempt(lambda: os.kill(C['node_pid'], 0))"))
add("process_vm_readv-node", """
def probe(C):
    buf = ctypes.create_string_buffer(16)
    iov = struct.pack("QQ", ctypes.addressof(buf), 16)
    liov = ctypes.create_string_buffer(iov, 16)
    riov = ctypes.create_string_buffer(struct.pack("QQ", 0x400000, 16), 16)
    return sc(310, C["node_pid"], liov, 1, riov, 1, 0)
""", refused=lambda r, E: r in ("ESRCH", "EPERM"), works=reached({"ESRCH", "EPERM"}))
add("pidfd_open-node", ret("sc(434, C['node_pid'], 0)"),
    refused=lambda r, E: r in {"ESRCH"} | DENIED, works=lambda c, E: c == "ok")
add("proc-entry-of-node", ret("read_file('/proc/%d/cmdline' % C['node_pid'])"),
    refused=lambda r, E: "sbx-node" not in str(r), works=lambda c, E: "sbx-node" in c)
add("signal-control-plane", ret("attempt(lambda: os.kill(C['control_pid'], 0))"),
    refused=lambda r, E: r in ("ESRCH", "EPERM"), works=lambda c, E: c == "ok")
add("sigkill-host-canary", ret("attempt(lambda: os.kill(C['canary_pid'], 9))"),
    refused=lambda r, E: r in ("ESRCH", "EPERM"), works=lambda c, E: c == "ok",
    host_src=ret("attempt(lambda: os.kill(C['canary_pid'], 0))"),
    after=lambda E, who: E.canary_alive())

# -- the host's network --
def _net_after(kind):
    def after(E, who):
        assert not E.canary_saw(f"{who}-{kind}"), f"the host canary got the {who} probe"
    return after


for _kind, _expr in (("tcp4", "tcp('127.0.0.1', C['canary']['tcp'], M)"),
                     ("tcp6", "tcp('::1', C['canary']['tcp'], M)"),
                     ("udp4", "udp('127.0.0.1', C['canary']['udp4'], M)"),
                     ("udp6", "udp('::1', C['canary']['udp6'], M)"),
                     ("abstract", "unix('\\0' + C['canary_abs'], M)"),
                     ("unix-path", "unix(C['canary_path'], M)")):
    add(f"host-canary-{_kind}",
        f"def probe(C):\n    M = (C['who'] + '-{_kind}\\n').encode()\n    return {_expr}\n",
        refused=lambda r, E: not str(r).startswith("ok"),
        works=lambda c, E: c.startswith("ok:CANARY-" + E.secret), after=_net_after(_kind))
_HTTP = "b'GET /v1/health HTTP/1.0\\r\\n\\r\\n'"
add("control-api", ret(f"tls('127.0.0.1', C['control_port'], {_HTTP})"),
    works=lambda c, E: c.startswith("ok:HTTP/1.1 200"))
add("node-ingress-same-node", ret(f"tls('127.0.0.1', C['node_ports'][0], {_HTTP})"),
    works=lambda c, E: c.startswith("ok:HTTP/1."))
add("node-ingress-other-node", ret(f"tls('127.0.0.1', C['node_ports'][1], {_HTTP})"),
    works=lambda c, E: c.startswith("ok:HTTP/1."))
add("host-external-address", ret("tcp(C['host_ip'], C['free_port'])"),
    refused=lambda r, E: r in ("ENETUNREACH", "EHOSTUNREACH", "timeout"),
    works=lambda c, E: c == "ECONNREFUSED")
# metadata addresses: the host has a route to them (whatever answers there); a run has none
add("metadata-ipv4", ret("tcp('169.254.169.254', 80, timeout=1)"),
    refused=lambda r, E: r == "ENETUNREACH", works=lambda c, E: c != "ENETUNREACH")
add("metadata-ipv6", ret("tcp('fd00:ec2::254', 80, timeout=1)"),
    refused=lambda r, E: r == "ENETUNREACH", works=lambda c, E: c != "ENETUNREACH")
add("interfaces-only-loopback", """
def probe(C):
    names = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
    return names
""", refused=lambda r, E: r == ["lo"], works=lambda c, E: len(c) > 1)

# -- the host's files --
for _name, _key in (("etc-shadow", "/etc/shadow"), ("etc-gshadow", "/etc/gshadow")):
    add(f"read-host-{_name}", ret(f"read_file({_key!r})"),
        refused=lambda r, E, k=_key: E.host_file_line(k) not in str(r),
        works=lambda c, E, k=_key: E.host_file_line(k) in c)
for _key in ("etc_public", "etc_private", "opt", "tmp"):
    add(f"read-host-file-{_key.replace('_', '-')}", ret(f"read_file(C['host_files'][{_key!r}])"),
        refused=lambda r, E: E.secret not in str(r), works=lambda c, E: E.secret in c)
add("read-node-token", ret("read_file(C['node_token'])"),
    refused=lambda r, E: E.node_token not in str(r), works=lambda c, E: E.node_token in c)
add("read-control-store", ret("read_file(C['store'], 16)"),
    refused=lambda r, E: "SQLite" not in str(r), works=lambda c, E: "SQLite" in c)
add("read-admin-token", ret("read_file(C['admin_token_file'])"),
    refused=lambda r, E: E.admin not in str(r), works=lambda c, E: E.admin in c)
add("read-victim-root-by-host-path", """
def probe(C):
    return [read_file(p) for p in C["victim_paths"]]
""", refused=lambda r, E: not any(E.victim_secret in x for x in r),
    works=lambda c, E: any(E.victim_secret in x for x in c))
# The pool hosts' uid lock: the host's (a dedicated run) and the pool host's own (a sandbox).
# Control: root on the host opens (or makes, as a host-mode server does) the host's.
add("write-pool-uid-lock", ret("open_only('/run/sbx-pool-uids.lock', os.O_RDWR)"),
    refused=lambda r, E: r != "ok", works=lambda c, E: c == "ok",
    host_src=ret("attempt(lambda: os.close(os.open('/run/sbx-pool-uids.lock', "
                 "os.O_RDWR | os.O_CREAT, 0o600)))"))

# -- devices --
ALLOWED_DEV = {"null", "zero", "full", "random", "urandom", "tty", "pts", "shm", "ptmx", "fd",
               "stdin", "stdout", "stderr", "console", "mqueue"}
add("dev-only-harmless-nodes", """
def probe(C):
    out = []
    for root, dirs, files in os.walk("/dev"):
        if root.startswith("/dev/pts"):
            continue
        for n in files + dirs:
            p = os.path.join(root, n)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            kind = "c" if (st.st_mode & 0o170000) == 0o020000 else \
                   "b" if (st.st_mode & 0o170000) == 0o060000 else "o"
            out.append([p, kind, os.major(st.st_rdev), os.minor(st.st_rdev)])
    return out
""",
    refused=lambda r, E: all(p[0][len("/dev/"):].split("/")[0] in ALLOWED_DEV and p[1] != "b"
                             and (p[1] != "c" or (p[2], p[3]) in
                                  {(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2)})
                             for p in r),
    works=lambda c, E: any(p[1] == "b" for p in c) and len(c) > 20)
add("host-disk-node", ret("attempt(lambda: os.stat(C['disk']).st_rdev)"),
    refused=lambda r, E: not isinstance(r, int), works=lambda c, E: isinstance(c, int))

# -- cgroupfs --
add("cgroupfs-mkdir", """
def probe(C):
    out = []
    for base in ("/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids"):
        p = base + "/sbx-hostile-%d" % os.getpid()
        try:
            os.mkdir(p)
            os.rmdir(p)
            out.append("ok")
        except OSError as e:
            out.append(en(e.errno))
    return out
""", refused=lambda r, E: "ok" not in r, works=lambda c, E: "ok" in c)
add("cgroupfs-release-agent", """
def probe(C):
    out = []
    for root, dirs, files in os.walk("/sys/fs/cgroup"):
        for f in files:
            if f in ("release_agent", "notify_on_release"):
                out.append(write_same(os.path.join(root, f)))
        if len(out) > 40:
            break
    return out
""", refused=lambda r, E: "ok" not in r, works=lambda c, E: "ok" in c)
if os.path.exists("/sys/kernel/uevent_helper"):
    add("sysfs-uevent-helper", ret("write_same('/sys/kernel/uevent_helper')"),
        refused=lambda r, E: r != "ok", works=lambda c, E: c == "ok")
add("sysfs-host-data", """
def probe(C):
    try:
        return sorted(os.listdir("/sys/class/net"))
    except OSError as e:
        return en(e.errno)
""", refused=lambda r, E: not isinstance(r, list) or r in ([], ["lo"]),
    works=lambda c, E: isinstance(c, list) and len(c) > 1)
add("sysfs-block-devices", ret("attempt(lambda: sorted(os.listdir('/sys/block')))"),
    refused=lambda r, E: not isinstance(r, list) or r == [],
    works=lambda c, E: isinstance(c, list) and len(c) > 0)

# -- another tenant's services (victim: its own run on the same node) --
for _kind, _expr in (("tcp4", "tcp('127.0.0.1', C['victim']['tcp'], M)"),
                     ("tcp6", "tcp('::1', C['victim']['tcp'], M)"),
                     ("udp4", "udp('127.0.0.1', C['victim']['udp'], M)"),
                     ("abstract", "unix('\\0' + C['victim']['abs'], M)")):
    add(f"other-tenant-{_kind}",
        f"def probe(C):\n    M = (C['who'] + '-{_kind}\\n').encode()\n    return {_expr}\n",
        control="victim", refused=lambda r, E: not str(r).startswith("ok"),
        works=lambda c, E: c.startswith("ok:TENANT-" + E.victim_secret))

# -- a sibling sandbox of the same pool host --
for _kind, _expr in (("tcp4", "tcp('127.0.0.1', C['sibling']['tcp'], M)"),
                     ("tcp6", "tcp('::1', C['sibling']['tcp'], M)"),
                     ("udp4", "udp('127.0.0.1', C['sibling']['udp'], M)"),
                     ("abstract", "unix('\\0' + C['sibling']['abs'], M)"),
                     ("autobind-listen", "tcp('127.0.0.1', C['sibling']['auto'], M)")):
    add(f"sibling-sandbox-{_kind}",
        f"def probe(C):\n    M = (C['who'] + '-{_kind}\\n').encode()\n    return {_expr}\n",
        where=("pool",), control="sibling", refused=lambda r, E: not str(r).startswith("ok"),
        works=lambda c, E: c.startswith("ok:TENANT-" + E.sibling_secret))
# -- the pool host's own network namespace: a listener there (started by the host's root in
# that namespace: where the pool host's agent would listen) --
for _kind, _expr in (("tcp4", "tcp('127.0.0.1', C['poolhost']['tcp'], M)"),
                     ("tcp6", "tcp('::1', C['poolhost']['tcp'], M)"),
                     ("udp4", "udp('127.0.0.1', C['poolhost']['udp'], M)"),
                     ("abstract", "unix('\\0' + C['poolhost']['abs'], M)")):
    add(f"pool-host-port-{_kind}",
        f"def probe(C):\n    M = (C['who'] + '-{_kind}\\n').encode()\n    return {_expr}\n",
        where=("pool",), control="poolhost", refused=lambda r, E: not str(r).startswith("ok"),
        works=lambda c, E: c.startswith("ok:TENANT-" + E.poolhost_secret))
add("pool-sandbox-own-netns", """
def probe(C):
    names = sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:])
    return [os.readlink("/proc/self/ns/net"), names]
""", where=("pool",), control="sibling",
    refused=lambda r, E: r[1] == ["lo"] and r[0] != E.host_netns,
    works=lambda c, E: c[1] == ["lo"] and c[0] != E.host_netns)


# -- socket families no network namespace covers: vsock is the VM's one space (a port bound in a
# sandbox is the VM's; CID 2 is the hypervisor), so sandboxes and runs get unix, IPv4, IPv6 and
# netlink only (filter.c: socket_families). Only where the host has vsock (the control). --
def _host_has_vsock():
    import socket as _s
    try:
        _s.socket(_s.AF_VSOCK, _s.SOCK_STREAM).close()
        return True
    except (OSError, AttributeError):
        return False


if _host_has_vsock():
    add("socket-vsock-bind", """
def probe(C):
    try:
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except OSError as e:
        return en(e.errno)
    try:
        s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
        return "ok"
    except OSError as e:
        return "socket-ok-bind-" + en(e.errno)
    finally:
        s.close()
""", refused=lambda r, E: r == "EAFNOSUPPORT", works=lambda c, E: c == "ok")
add("socketpair-inet", ret("attempt(lambda: socket.socketpair(socket.AF_INET) and None)"),
    refused=lambda r, E: r == "EAFNOSUPPORT", works=lambda c, E: c in ("EOPNOTSUPP", "ENOTSUP"))


# -- an egress run (network "egress", an allow-list asking for everything): still never the
# host, its loopback, metadata, the platform or another run. Reused cases plus these two; the
# outside server of the test (EXT_IP, reached over a veth) is the egress path's own control --
EGRESS_REUSED = ["host-canary-tcp4", "host-canary-tcp6", "host-canary-udp4", "host-canary-udp6",
                 "host-canary-abstract", "control-api", "node-ingress-same-node",
                 "node-ingress-other-node", "other-tenant-tcp4", "other-tenant-tcp6",
                 "other-tenant-udp4", "ip-link-set-mtu", "unshare-newnet", "sethostname"]
_GET = "b'GET / HTTP/1.0\\r\\n\\r\\n'"
add("egress-host-own-address", ret(f"tcp(C['egress']['host_ip'], 8090, {_GET})"),
    where=("egress",), works=lambda c, E: "port 8090" in c)
add("egress-metadata-ipv4", ret(f"tcp('169.254.169.254', 80, {_GET}, timeout=2)"),
    where=("egress",), works=lambda c, E: c.startswith("ok"))
# not an attack: the egress path's own positive control (an allowed outside server answers)
EGRESS_CONTROL = ret(f"tcp(C['egress']['ext_ip'], 8080, {_GET})")
