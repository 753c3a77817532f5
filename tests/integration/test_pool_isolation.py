# SPDX-License-Identifier: MIT
"""Pool host isolation, attacked from inside: sandbox A (exec as A's uid, through the API)
tries to reach sandbox B, the host and the shared kernel, and every refusal is checked next to
a positive control (the same operation on A's own resource works, the target really exists, or
root on the host can do it), so no case can pass because the attack was never really made.

Needs root (the pool host sets uids) and the real sbx-server; uses one pool host per module and
fresh sandboxes per test."""
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import urllib.parse

import pytest

from conftest import HOME_SHARDS, POOL_UID_BASE, homes_in, uid_pids, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="pool host mode needs root")


@pytest.fixture
def pair(pool_host):
    """Two fresh sandboxes A and B; deleted (and checked empty) afterwards."""
    a, b = pool_host.create(2)
    yield a, b
    for sb in (a, b):
        sb.delete()


def rand_name(prefix="sbx-pt-"):
    return prefix + secrets.token_hex(6)


def bg_sleep(sb, env=None, secs=300):
    """A background `sleep` of sb; return its pid (the sleep itself: argv, no shell)."""
    j = sb.start(["sleep", str(secs)], env=env or {})
    assert wait_until(lambda: os.path.exists(f"/proc/{j['pid']}"), 2)
    return j


# Python run inside a sandbox: attempt(f) returns "ok" or the errno name.
PY_ATTEMPT = """
import errno, json, os, socket, sys
def attempt(f):
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
"""


def py_attempts(sb, body, *args):
    """Run PY_ATTEMPT + body in sb; the body prints one JSON document; return it."""
    r = sb.py(PY_ATTEMPT + body, *args)
    assert r.code == 0, r
    return json.loads(r.out.strip().splitlines()[-1])


# ---- socket families ---------------------------------------------------------------------------

def _host_vsock_bind():
    try:
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    except (OSError, AttributeError) as e:
        return getattr(e, "errno", "none")
    try:
        s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
        return "ok"
    finally:
        s.close()


VSOCK_BIND = """
import socket
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.bind((socket.VMADDR_CID_ANY, socket.VMADDR_PORT_ANY))
    print(json.dumps("ok"))
except OSError as e:
    print(json.dumps(errno.errorcode[e.errno]))
"""


@pytest.mark.skip_ok("a host without vsock has none to refuse")
def test_a_sandbox_opens_no_vsock_socket(pair):
    """vsock is the VM's one space, in no network namespace: a sandbox that bound a port there
    would take it from the whole host (and could reach the hypervisor at CID 2). Sandboxes get
    unix, IPv4, IPv6 and netlink sockets only (filter.c: socket_families)."""
    a, _ = pair
    if _host_vsock_bind() != "ok":
        pytest.skip("this host has no vsock to refuse")  # the control: root on the host binds
    assert py_attempts(a, VSOCK_BIND) == "EAFNOSUPPORT", "ATTACK: a sandbox bound a vsock port"
    assert py_attempts(a, "print(json.dumps(attempt(lambda: socket.socket().close())))") == "ok"


# ---- sibling homes ---------------------------------------------------------------------------

def test_read_sibling_home_file(pair):
    a, b = pair
    assert b.write("secret", b"B-SECRET")[0] == 200
    assert a.write("mine", b"A-OWN")[0] == 200
    r = a.run(f"cat {b.home}/secret; echo rc=$?; cat {a.home}/mine")
    assert "B-SECRET" not in r.out and "rc=1" in r.out and "Permission denied" in r.err, r
    assert r.out.endswith("A-OWN"), r  # positive control: A reads its own file
    assert b.run("cat secret").out == "B-SECRET"  # the target exists and B can read it


def test_list_sibling_home(pair):
    a, b = pair
    assert b.write("b-only-file", b"x")[0] == 200
    r = a.run(f"ls {b.home}; echo rc=$?; ls -a {a.home}")
    assert "b-only-file" not in r.out and "Permission denied" in r.err, r
    assert ".sbx" in r.out  # positive control: A lists its own home
    assert "b-only-file" in os.listdir(b.home)


def test_write_sibling_home(pair):
    a, b = pair
    name = rand_name()
    r = a.run(f"echo pwn > {b.home}/{name}; echo rc=$?; echo mine > {a.home}/{name} && echo wrote")
    assert "rc=1" in r.out or "rc=2" in r.out, r
    assert not os.path.exists(os.path.join(b.home, name))
    assert "wrote" in r.out and open(os.path.join(a.home, name)).read() == "mine\n"


def test_stat_and_traverse_sibling_home(pair):
    a, b = pair
    assert b.request("POST", "/files/mkdir?path=sub/deeper")[0] == 200
    res = py_attempts(a, """
print(json.dumps({"sib": attempt(lambda: os.stat(sys.argv[1] + "/sub")),
                  "own": attempt(lambda: os.stat(sys.argv[2] + "/.sbx"))}))
""", b.home, a.home)
    assert res == {"sib": "EACCES", "own": "ok"}
    assert os.path.isdir(os.path.join(b.home, "sub/deeper"))


def test_homes_are_in_shards_the_sandbox_cannot_list(pool_host, pair):
    """The homes directory holds the 256 shards, root's, 0711, and nothing else; each home is
    in the shard named by its id's first two digits. From inside: its own shard and the homes
    directory cannot be listed or written, another sandbox's home cannot be listed (positive
    controls: its own home can be stat'ed, listed and written)."""
    a, b = pair
    assert sorted(os.listdir(pool_host.homes)) == HOME_SHARDS
    for name in HOME_SHARDS:
        st_ = os.lstat(os.path.join(pool_host.homes, name))
        assert stat.S_ISDIR(st_.st_mode) and (st_.st_uid, stat.S_IMODE(st_.st_mode)) == (0, 0o711)
    for x in (a, b):
        assert x.home == os.path.join(pool_host.homes, x.id[:2], x.id)
        assert x.id[:2] + "/" + x.id in homes_in(pool_host.homes)
    res = py_attempts(a, """
shard, homes, other, own = sys.argv[1:5]
print(json.dumps({"ls_shard": attempt(lambda: os.listdir(shard)),
                  "ls_homes": attempt(lambda: os.listdir(homes)),
                  "mk_shard": attempt(lambda: os.mkdir(shard + "/x")),
                  "other": attempt(lambda: os.listdir(other)),
                  "own": attempt(lambda: os.stat(own)),
                  "ls_own": attempt(lambda: os.listdir(own)),
                  "mk_own": attempt(lambda: os.mkdir(own + "/x"))}))
""", os.path.dirname(a.home), pool_host.homes, b.home, a.home)
    assert res == {"ls_shard": "EACCES", "ls_homes": "EACCES", "mk_shard": "EACCES",
                   "other": "EACCES", "own": "ok", "ls_own": "ok", "mk_own": "ok"}, res


def test_read_file_outside_the_ruleset(pool_host, pair):
    """A world-readable file outside the home and the system dirs: only Landlock stops it."""
    a, _ = pair
    path = os.path.join(pool_host.homes, rand_name() + ".txt")
    with open(path, "w") as f:
        f.write("HOST-PUBLIC")
    os.chmod(path, 0o644)
    try:
        res = py_attempts(a, """
print(json.dumps({"out": attempt(lambda: open(sys.argv[1]).read()),
                  "sys": attempt(lambda: open("/etc/hostname").read())}))
""", path)
        assert res == {"out": "EACCES", "sys": "ok"}
    finally:
        os.unlink(path)


# ---- signals, ptrace, /proc -----------------------------------------------------------------

@pytest.mark.parametrize("sig", [0, signal.SIGUSR1])
def test_signal_sibling_process(pair, sig):
    a, b = pair
    bj = bg_sleep(b)
    aj = bg_sleep(a)  # started by an earlier exec of A: a different Landlock domain
    res = py_attempts(a, f"""
print(json.dumps({{"sib": attempt(lambda: os.kill({bj['pid']}, {int(sig)})),
                  "own": attempt(lambda: os.kill({aj['pid']}, {int(sig)}))}}))
""")
    assert res == {"sib": "EPERM", "own": "ok"}
    st, j = b.json("GET", f"/processes/{bj['id']}")
    assert st == 200 and j["running"] is True  # B's process survived
    if sig == signal.SIGUSR1:  # A's own signal really arrived
        assert wait_until(lambda: a.json("GET", f"/processes/{aj['id']}")[1]["running"] is False)


@pytest.mark.parametrize("target", ["init", "server"])
def test_signal_host_processes(pool_host, pair, target):
    a, _ = pair
    pid = 1 if target == "init" else pool_host.proc.pid
    res = py_attempts(a, f"""
print(json.dumps({{"host": attempt(lambda: os.kill({pid}, 0)),
                  "self": attempt(lambda: os.kill(os.getpid(), 0))}}))
""")
    assert res == {"host": "EPERM", "self": "ok"}
    assert pool_host.proc.poll() is None


def test_ptrace_sibling(pair):
    a, b = pair
    bj = bg_sleep(b)
    r = a.run(f"strace -p {bj['pid']} -e trace=none -o /dev/null; echo rc=$?")
    assert "rc=0" not in r.out and "Operation not permitted" in r.err, r
    res = py_attempts(a, f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def seize():
    if libc.ptrace(0x4206, {bj['pid']}, None, None) < 0:  # PTRACE_SEIZE
        raise OSError(ctypes.get_errno(), "ptrace")
print(json.dumps({{"seize": attempt(seize)}}))
""")
    assert res == {"seize": "EPERM"}
    # Positive control: the target is a live, traceable process (root on the host attaches;
    # the tracer exits at once, which detaches it).
    ctl = subprocess.run(["python3", "-c", f"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
sys.exit(0 if libc.ptrace(0x4206, {bj['pid']}, None, None) == 0 else 1)
"""], timeout=10)
    assert ctl.returncode == 0
    assert b.json("GET", f"/processes/{bj['id']}")[1]["running"] is True


def test_proc_mem_of_sibling(pair):
    a, b = pair
    bj = bg_sleep(b)
    res = py_attempts(a, f"""
import subprocess
child = subprocess.Popen(["sleep", "30"])
def own():
    open(f"/proc/{{child.pid}}/mem", "rb").close()
r = {{"sib": attempt(lambda: open("/proc/{bj['pid']}/mem", "rb").close()), "own": attempt(own)}}
child.kill()
print(json.dumps(r))
""")
    assert res["own"] == "ok", res
    assert res["sib"] in ("ENOENT", "EACCES", "EPERM"), res
    assert os.path.exists(f"/proc/{bj['pid']}/mem")


def test_environ_of_sibling(pair):
    a, b = pair
    secret = "S3CRET-" + secrets.token_hex(8)
    bj = bg_sleep(b, env={"SBX_PT_SECRET": secret})
    r = a.run(f"cat /proc/{bj['pid']}/environ; echo rc=$?; cat /proc/self/environ",
              env={"A_OWN": "own-value"})
    assert secret not in r.out and secret not in r.err, r
    assert "rc=1" in r.out, r
    assert "A_OWN=own-value" in r.out  # positive control: A reads its own environ
    with open(f"/proc/{bj['pid']}/environ", "rb") as f:  # the target holds the secret
        assert secret.encode() in f.read()


def test_hidepid_hides_sibling_processes(pair):
    a, b = pair
    bj = bg_sleep(b)
    # Own processes of this exec are visible. (Those of an earlier exec are not: each exec is
    # its own Landlock domain, and hidepid shows only what the reader could ptrace-read.)
    r = a.run("sleep 5 & echo self=$$ child=$!; ls /proc; kill $!")
    listed = set(r.out.split())
    own = r.out.split("self=")[1].split()[0]
    child = r.out.split("child=")[1].split()[0]
    assert own in listed and child in listed, r
    assert str(bj["pid"]) not in listed and "1" not in listed, r
    assert os.path.isdir(f"/proc/{bj['pid']}")  # the host sees it


def test_sibling_cmdline_and_status_hidden(pair):
    a, b = pair
    bj = bg_sleep(b)
    r = a.run(f"cat /proc/{bj['pid']}/cmdline; echo rc=$?; cat /proc/{bj['pid']}/status; "
              "echo rc=$?; grep -c '^Uid' /proc/self/status")
    assert r.out.count("rc=1") == 2 and "sleep" not in r.out, r
    assert r.out.strip().endswith("1")
    with open(f"/proc/{bj['pid']}/cmdline", "rb") as f:
        assert f.read().startswith(b"sleep")


# ---- the shared system ----------------------------------------------------------------------

@pytest.mark.parametrize("where", ["/tmp", "/dev/shm", "/etc", "/var/tmp"])
def test_write_outside_home(pair, where):
    a, _ = pair
    if not os.path.isdir(where):
        pytest.skip(f"{where} does not exist here")
    name = rand_name()
    r = a.run(f"echo x > {where}/{name}; echo rc=$?; echo y > $HOME/{name} && cat $HOME/{name}")
    assert "rc=0" not in r.out, r
    assert not os.path.exists(os.path.join(where, name))
    assert r.out.endswith("y\n"), r  # positive control: the same write in the home works


def test_write_world_writable_file_outside_home(pair):
    """A file outside every home that ordinary permissions let anyone write (0666): only
    Landlock stands between the sandbox and it, and it refuses the write."""
    a, _ = pair
    path = os.path.join("/tmp", rand_name("sbx-ww-"))
    with open(path, "w") as f:
        f.write("orig\n")
    os.chmod(path, 0o666)
    try:
        r = a.run(f"echo planted >> {path}; echo rc=$?")
        assert "rc=0" not in r.out, \
            f"Landlock write check: the sandbox wrote a 0666 file outside its home: {r}"
        with open(path) as f:
            assert f.read() == "orig\n", "Landlock write check: the file outside the home changed"
        # positive control: the sandbox's uid, unconfined, may write it (permissions allow it)
        w = subprocess.run(["setpriv", f"--reuid={a.uid}", f"--regid={a.uid}", "--clear-groups",
                            "sh", "-c", f"echo ok >> {path}"], capture_output=True)
        assert w.returncode == 0, w
        with open(path) as f:
            assert f.read() == "orig\nok\n"
    finally:
        os.unlink(path)


def test_posix_shm_refused(pair):
    a, _ = pair
    res = py_attempts(a, """
import mmap
def shm():
    fd = os.open("/dev/shm/" + sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
def home():
    fd = os.open(os.environ["HOME"] + "/" + sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
    os.close(fd)
print(json.dumps({"shm": attempt(shm), "home": attempt(home)}))
""", rand_name())
    assert res == {"shm": "EACCES", "home": "ok"}


def test_read_etc_shadow(pair):
    a, _ = pair
    r = a.run("cat /etc/shadow; echo rc=$?; head -1 /etc/passwd")
    assert "rc=1" in r.out and "root:" in r.out.split("rc=1")[1], r
    assert "root:" not in r.out.split("rc=1")[0]
    assert os.path.exists("/etc/shadow")


def test_write_dev_kmsg(pair):
    a, _ = pair
    r = a.run("echo sbx-pt > /dev/kmsg; echo rc=$?; echo fine > /dev/null && echo null-ok")
    assert "rc=0" not in r.out and "null-ok" in r.out, r


TCP_LISTENER = """
import socket, sys
fam = getattr(socket, sys.argv[1])
s = socket.socket(fam)
s.bind((sys.argv[2], 0))
s.listen(8)
# written whole, then renamed: the test waits for the name and reads the number at once
open(sys.argv[3] + ".port.tmp", "w").write(str(s.getsockname()[1]))
__import__("os").rename(sys.argv[3] + ".port.tmp", sys.argv[3] + ".port")
while True:
    c, _ = s.accept()
    c.sendall(b"from-B")
    c.close()
"""


@pytest.mark.parametrize("family,addr", [("AF_INET", "127.0.0.1"), ("AF_INET6", "::1")])
def test_a_tcp_listener_is_the_sandboxs_own(pair, family, addr):
    """A sandbox has a network namespace of its own: it may bind and listen on TCP there, and
    neither a sibling nor the host's namespace reaches that port."""
    a, b = pair
    mark = b.home + "/tcp-" + family
    proc = b.start(["python3", "-c", TCP_LISTENER, family, addr, mark])
    assert wait_until(lambda: os.path.exists(mark + ".port"), 5)
    port = int(open(mark + ".port").read())
    res = py_attempts(a, f"""
def sib():
    with socket.create_connection(("{addr}", {port}), timeout=2) as c:
        c.recv(10)
print(json.dumps({{"sib": attempt(sib)}}))
""")
    assert res == {"sib": "ECONNREFUSED"}, res  # A's loopback is its own
    with pytest.raises(OSError):
        socket.create_connection((addr, port), timeout=2).close()  # not the host's either
    # positive control: inside B's network namespace the listener answers
    code = (f"import socket; c=socket.create_connection(('{addr}', {port}), timeout=2); "
            "print(c.recv(10).decode())")
    r = subprocess.run(["nsenter", f"--net=/proc/{proc['pid']}/ns/net", "python3", "-c", code],
                       capture_output=True, text=True, timeout=10)
    assert r.stdout.strip() == "from-B", r


ABSTRACT_LISTENER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind("\\0" + sys.argv[1])
s.listen(8)
while True:
    c, _ = s.accept()
    data = c.recv(100)
    with open(sys.argv[2], "ab") as f:
        f.write(data + b"\\n")
    c.close()
"""


def nsenter_connect_abstract(pid, name):
    """Connect to an abstract unix socket from inside the network namespace of pid (as root)."""
    code = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
            "s.connect('\\0'+sys.argv[1]); s.sendall(b'host')")
    r = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "python3", "-c", code, name],
                       capture_output=True, timeout=10)
    return r.returncode == 0


def test_abstract_socket_outside_the_landlock_domain(pair):
    """Landlock's abstract unix scope, on its own: a listener in the sandbox's own network
    namespace but outside its Landlock domain (root, entered with nsenter) cannot be reached
    from the sandbox; root in the same namespace reaches it (the positive control)."""
    a, _ = pair
    name = rand_name("sbx-absd-")
    holder = bg_sleep(a)  # a process of a, for its network namespace
    got = os.path.join(tempfile.mkdtemp(prefix="sbx-absd-"), "got")
    lst = subprocess.Popen(["nsenter", f"--net=/proc/{holder['pid']}/ns/net", "python3", "-c",
                            ABSTRACT_LISTENER, name, got])
    try:
        assert wait_until(lambda: nsenter_connect_abstract(holder["pid"], name), 5), \
            "positive control: the listener is not reachable in the sandbox's namespace"
        res = py_attempts(a, """
def out():
    s = socket.socket(socket.AF_UNIX)
    s.connect("\\0" + sys.argv[1])
    s.sendall(b"sandbox")
print(json.dumps({"r": attempt(out)}))
""", name)
        assert res["r"] == "EPERM", \
            f"Landlock abstract unix scope: the sandbox reached a socket outside its domain: {res}"
        time.sleep(0.2)
        with open(got, "rb") as f:
            assert b"sandbox" not in f.read()
    finally:
        lst.kill()
        lst.wait()
        shutil.rmtree(os.path.dirname(got), ignore_errors=True)


def test_abstract_socket_of_sibling(pair):
    a, b = pair
    name = rand_name("sbx-abs-")
    proc = b.start(["python3", "-c", ABSTRACT_LISTENER, name, b.home + "/got"])
    # positive control: the socket exists, in B's own network namespace (abstract names are
    # per network namespace): root entering that namespace reaches it
    assert wait_until(lambda: nsenter_connect_abstract(proc["pid"], name), 5)
    # ... and not from the host's namespace any more
    with socket.socket(socket.AF_UNIX) as s:
        with pytest.raises(ConnectionRefusedError):
            s.connect("\0" + name)
    res = py_attempts(a, """
def sib():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect("\\0" + sys.argv[1])
        s.sendall(b"from-A")
def own():
    # the positive control listens and connects within this one process
    with socket.socket(socket.AF_UNIX) as l:
        l.bind("\\0" + sys.argv[1] + "-own")
        l.listen(1)
        with socket.socket(socket.AF_UNIX) as c:
            c.connect("\\0" + sys.argv[1] + "-own")
print(json.dumps({"sib": attempt(sib), "own": attempt(own)}))
""", name)
    # another network namespace (ECONNREFUSED); Landlock's scope would say EPERM
    assert res["own"] == "ok" and res["sib"] in ("ECONNREFUSED", "EPERM"), res
    assert wait_until(lambda: os.path.exists(b.home + "/got"))
    time.sleep(0.1)
    assert open(b.home + "/got", "rb").read() == b"host\n"


UDP_LISTENER = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
# written whole, then renamed: the test waits for the name and reads the number at once
open(sys.argv[1] + ".port.tmp", "w").write(str(s.getsockname()[1]))
__import__("os").rename(sys.argv[1] + ".port.tmp", sys.argv[1] + ".port")
while True:
    data, addr = s.recvfrom(100)
    with open(sys.argv[1], "ab") as f:
        f.write(data + b"\\n")
"""


def test_each_sandbox_has_its_own_loopback(pair):
    a, b = pair
    got = b.home + "/udp-got"
    proc = b.start(["python3", "-c", UDP_LISTENER, got])
    assert wait_until(lambda: os.path.exists(got + ".port"), 5)
    port = int(open(got + ".port").read())
    # A sends to B's UDP port and connects a TCP socket to a port A's sibling autobound with
    # listen(): neither arrives (A's loopback is its own)
    res = py_attempts(a, """
def udp():
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"from-A", ("127.0.0.1", int(sys.argv[1])))
def own_tcp():
    with socket.socket() as l:
        l.listen(1)  # autobind: the only way to listen under Landlock's TCP-bind refusal
        with socket.socket() as c:
            c.connect(l.getsockname())
def ifaces():
    names = [l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]]
    if names != ["lo"]:
        raise OSError(1, "interfaces: %s" % names)
print(json.dumps({"udp": attempt(udp), "own_tcp": attempt(own_tcp), "ifaces": attempt(ifaces)}))
""", str(port))
    assert res == {"udp": "ok", "own_tcp": "ok", "ifaces": "ok"}, res  # sent, to A's own lo
    # positive control: the same datagram sent inside B's namespace arrives
    code = ("import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
            "s.sendto(b'inside-B',('127.0.0.1',int(sys.argv[1])))")
    subprocess.run(["nsenter", f"--net=/proc/{proc['pid']}/ns/net", "python3", "-c", code,
                    str(port)], check=True, timeout=10)
    assert wait_until(lambda: os.path.exists(got), 5)
    time.sleep(0.2)
    assert open(got, "rb").read() == b"inside-B\n"  # A's datagram never reached B


@pytest.mark.parametrize("how", ["unshare-U", "unshare-Ur", "ctypes-unshare", "ctypes-clone"])
def test_user_namespaces_refused(pair, how):
    a, _ = pair
    if how == "unshare-U":
        cmd = "unshare -U true; echo rc=$?"
    elif how == "unshare-Ur":
        cmd = "unshare -Ur true; echo rc=$?"
    elif how == "ctypes-unshare":
        cmd = ("python3 -c 'import ctypes,sys; l=ctypes.CDLL(None); "
               "sys.exit(0 if l.unshare(0x10000000)==0 else 1)'; echo rc=$?")
    else:  # fork with CLONE_NEWUSER through the raw clone syscall
        cmd = ("python3 -c 'import ctypes,sys,os; l=ctypes.CDLL(None, use_errno=True); "
               "p=l.syscall(56, 0x10000000|17, 0, 0, 0, 0); "
               "os._exit(0) if p==0 else sys.exit(0 if p>0 else 1)'; echo rc=$?")
    r = a.run(cmd + "; python3 -c 'import os; p=os.fork(); os._exit(0) if p==0 else "
              "print(\"fork-ok\", os.waitpid(p,0)[1])'")
    assert "rc=1" in r.out, r
    assert "fork-ok 0" in r.out  # positive control: a plain fork still works
    # positive control: the kernel allows unprivileged user namespaces; the refusal is ours
    assert subprocess.run(["unshare", "-U", "true"], timeout=10).returncode == 0


@pytest.mark.parametrize("kind", ["-M 4096", "-Q", "-S 1"])
def test_sysv_ipc_refused(pair, kind):
    a, _ = pair
    r = a.run(f"ipcmk {kind}; echo rc=$?")
    assert "rc=0" not in r.out and "rc=" in r.out, r
    # positive control: the same object can be created on this kernel (by the host)
    out = subprocess.run(["ipcmk", *kind.split()], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out
    ident = out.stdout.strip().split()[-1]
    flag = {"-M": "-m", "-Q": "-q", "-S": "-s"}[kind.split()[0]]
    subprocess.run(["ipcrm", flag, ident], timeout=10)


SETNS_PROBE = r"""
import ctypes, errno, os
l = ctypes.CDLL(None, use_errno=True)
def t(fd, typ):
    r = l.syscall(308, ctypes.c_long(fd), ctypes.c_long(typ))  # setns
    return "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
net = os.open("/proc/self/ns/net", os.O_RDONLY)
mnt = os.open("/proc/self/ns/mnt", os.O_RDONLY)
for name, fd, typ in [("zero", -1, 0), ("user", -1, 0x10000000), ("pid", -1, 0x20000000),
                      ("uts", -1, 0x04000000), ("ipc", -1, 0x08000000),
                      ("cgroup", -1, 0x02000000), ("time", -1, 0x80),
                      ("mnt+net", -1, 0x40020000), ("high-zero", -1, 1 << 32),
                      ("net-bad-fd", -1, 0x40000000), ("mnt-bad-fd", -1, 0x20000),
                      ("net-own", net, 0x40000000), ("mnt-own", mnt, 0x20000)]:
    print(name, t(fd, typ))
"""


def test_setns_refused_but_for_the_two_types_the_spawn_needs(pair):
    """The spawn helper installs the filter in itself once and each child inherits it, so the
    child's first steps (entering the sandbox mount and network namespaces) run under it: the
    filter lets setns through for exactly those two types. Every other type is refused by the
    filter, before the kernel looks at the descriptor (EPERM for fd -1, where the kernel would
    say EBADF); the two it lets through reach the kernel (EBADF for fd -1: the positive
    control that the filter is precise) and the kernel refuses them to the sandbox uid."""
    a, _ = pair
    r = a.run("python3 -c '%s'" % SETNS_PROBE.replace("'", "'\\''"))
    assert r.code == 0, r
    got = dict(l.split() for l in r.out.split("\n") if l.strip())
    for name in ("zero", "user", "pid", "uts", "ipc", "cgroup", "time", "mnt+net", "high-zero"):
        assert got[name] == "EPERM", f"setns type {name} passed the filter: {got}"
    assert got["net-bad-fd"] == "EBADF" and got["mnt-bad-fd"] == "EBADF", got
    assert got["net-own"] == "EPERM" and got["mnt-own"] == "EPERM", got
    # one filter more than the server has (a pool host under a node has the run's too),
    # inherited: not a second one loaded per command
    def filters(text):
        return [int(l.split()[1]) for l in text.splitlines() if l.startswith("Seccomp_filters:")]
    with open(f"/proc/{a.server.proc.pid}/status") as f:
        server = filters(f.read())
    st = a.run("cat /proc/self/status")
    if server:  # the field exists since Linux 5.9
        assert filters(st.out) == [server[0] + 1], (server, st)


def test_confinement_state_inside(pair):
    a, _ = pair
    r = a.run("grep -E '^(Uid|Gid|Groups|CapEff|CapPrm|NoNewPrivs|Seccomp):' /proc/self/status")
    f = dict(l.split(":", 1) for l in r.out.strip().splitlines())
    f = {k: v.split() for k, v in f.items()}
    assert f["Uid"] == [str(a.uid)] * 4 and f["Gid"] == [str(a.uid)] * 4
    assert f["Groups"] == [str(a.uid)] or f["Groups"] == []
    assert f["CapEff"] == ["0000000000000000"] and f["CapPrm"] == ["0000000000000000"]
    assert f["NoNewPrivs"] == ["1"] and f["Seccomp"] == ["2"]


def test_supplementary_groups_are_dropped(make_host_server):
    """The server under test runs with supplementary groups of its own, so that a sandbox
    keeping them (setgroups skipped) can be seen; a sandbox has none of them."""
    host = make_host_server(popen_kw={"extra_groups": [4242, 4243]})

    def groups(status_text):
        line = [l for l in status_text.splitlines() if l.startswith("Groups:")][0]
        return line.split()[1:]
    with open(f"/proc/{host.proc.pid}/status") as f:
        mine = groups(f.read())
    assert {"4242", "4243"} <= set(mine), f"positive control: the server's groups are {mine}"
    sb = host.sandbox()
    try:
        r = sb.run("cat /proc/self/status")
        assert r.code == 0, r
        inside = groups(r.out)
        assert inside in ([], [str(sb.uid)]), \
            f"setgroups: the sandbox kept the server's supplementary groups: {inside}"
    finally:
        sb.delete()


# ---- the file API through planted symlinks -------------------------------------------------

@pytest.fixture
def linked(pair):
    """A plants links to /etc/passwd, /etc, B's home and B's file; B has a secret and a dir."""
    a, b = pair
    assert b.write("secret", b"B-SECRET")[0] == 200
    assert b.request("POST", "/files/mkdir?path=sub")[0] == 200
    r = a.run(f"ln -s /etc/passwd l_passwd && ln -s /etc l_etc && ln -s {b.home} l_bhome && "
              f"ln -s {b.home}/secret l_bsecret && mkdir -p real/sub && echo real > real/f")
    assert r.code == 0, r
    for link in ("l_passwd", "l_etc", "l_bhome", "l_bsecret"):  # vacuity guard: links exist
        st, j = a.json("GET", f"/files/stat?path={link}")
        assert st == 200 and j["type"] == "symlink", (link, st, j)
    with open("/etc/passwd", "rb") as f:
        passwd = f.read()
    yield a, b, passwd
    with open("/etc/passwd", "rb") as f:
        assert f.read() == passwd
    assert open(b.home + "/secret", "rb").read() == b"B-SECRET"


def b_unchanged(b):
    assert sorted(os.listdir(b.home)) == [".sbx", ".tmp", "secret", "sub"]
    assert open(b.home + "/secret", "rb").read() == b"B-SECRET"
    assert os.listdir(b.home + "/sub") == []


def q(p):
    return urllib.parse.quote(p, safe="")


LINK_FILES = ["l_passwd", "l_bsecret", "l_etc/passwd", "l_bhome/secret"]


@pytest.mark.parametrize("path", LINK_FILES)
def test_symlink_read(linked, path):
    a, b, _ = linked
    st, _, data = a.read(path)
    assert st == 400 and b"symlink" in data, (st, data)
    assert b"root:" not in data and b"B-SECRET" not in data
    st, _, data = a.read("real/f")
    assert (st, data) == (200, b"real\n")


@pytest.mark.parametrize("path", LINK_FILES)
def test_symlink_write(linked, path):
    a, b, _ = linked
    st, _, data = a.write(path, b"PWNED")
    assert st == 400, (st, data)
    b_unchanged(b)
    assert a.write("real/f", b"new")[0] == 200
    assert open(a.home + "/real/f", "rb").read() == b"new"


ETC_SUBDIR = next((d for d in ("ssl", "default", "apt", "X11") if os.path.isdir("/etc/" + d)),
                  "ssl")


@pytest.mark.parametrize("path", ["l_etc", "l_bhome", "l_bhome/sub", "l_etc/" + ETC_SUBDIR])
def test_symlink_list(linked, path):
    a, b, _ = linked
    st, j = a.json("GET", f"/files/list?path={q(path)}")
    assert st == 400, (st, j)
    assert "passwd" not in json.dumps(j) and "secret" not in json.dumps(j)
    st, j = a.json("GET", "/files/list?path=real")
    assert st == 200 and sorted(e["name"] for e in j["entries"]) == ["f", "sub"]


@pytest.mark.parametrize("path", ["l_etc/passwd", "l_bhome/secret"])
def test_symlink_stat_intermediate(linked, path):
    a, b, _ = linked
    st, j = a.json("GET", f"/files/stat?path={q(path)}")
    assert st == 400, (st, j)
    st, j = a.json("GET", "/files/stat?path=real/f")
    assert st == 200 and j["type"] == "file" and j["size"] == 5


@pytest.mark.parametrize("path", ["l_passwd", "l_bsecret"])
def test_symlink_stat_final_reports_the_link(linked, path):
    """lstat semantics: the link itself, never its target's type or size."""
    a, b, _ = linked
    st, j = a.json("GET", f"/files/stat?path={path}")
    target = os.readlink(os.path.join(a.home, path))
    assert st == 200 and j["type"] == "symlink" and j["size"] == len(target), j


@pytest.mark.parametrize("path", ["l_bhome/newdir", "l_etc/newdir", "l_bhome/sub/x/y", "l_bhome",
                                  "l_etc"])
def test_symlink_mkdir(linked, path):
    a, b, _ = linked
    st, j = a.json("POST", f"/files/mkdir?path={q(path)}")
    assert st == 400, (st, j)
    b_unchanged(b)
    assert not os.path.exists("/etc/newdir")
    st, j = a.json("POST", "/files/mkdir?path=real/newdir/x")
    assert st == 200 and os.path.isdir(a.home + "/real/newdir/x")


@pytest.mark.parametrize("path", ["l_etc/passwd", "l_bhome/secret", "l_bhome/sub"])
def test_symlink_delete_intermediate(linked, path):
    a, b, passwd = linked
    st, j = a.json("DELETE", f"/files/delete?path={q(path)}&recursive=true")
    assert st == 400, (st, j)
    b_unchanged(b)
    st, j = a.json("DELETE", "/files/delete?path=real/f")
    assert st == 200 and not os.path.exists(a.home + "/real/f")


@pytest.mark.parametrize("path", ["l_passwd", "l_bhome"])
def test_symlink_delete_final_removes_only_the_link(linked, path):
    a, b, _ = linked
    st, j = a.json("DELETE", f"/files/delete?path={path}&recursive=true")
    assert st == 200, (st, j)
    assert not os.path.lexists(os.path.join(a.home, path))
    b_unchanged(b)  # the fixture also checks /etc/passwd


@pytest.mark.parametrize("src,dst", [("l_bhome/secret", "stolen"), ("real/f", "l_bhome/planted"),
                                     ("l_etc/passwd", "stolen"), ("real/f", "l_etc/planted")])
def test_symlink_rename(linked, src, dst):
    a, b, _ = linked
    st, j = a.json("POST", "/files/rename", {"from": src, "to": dst})
    assert st == 400, (st, j)
    b_unchanged(b)
    assert not os.path.exists(a.home + "/stolen") and not os.path.exists("/etc/planted")
    st, j = a.json("POST", "/files/rename", {"from": "real/f", "to": "real/g"})
    assert st == 200 and os.path.exists(a.home + "/real/g")


def test_symlink_rename_moves_the_link_itself(linked):
    a, b, _ = linked
    st, j = a.json("POST", "/files/rename", {"from": "l_bhome", "to": "moved"})
    assert st == 200 and os.readlink(a.home + "/moved") == b.home
    b_unchanged(b)


def test_symlink_rename_onto_a_link_replaces_the_link(linked):
    a, b, _ = linked
    st, j = a.json("POST", "/files/rename", {"from": "real/f", "to": "l_passwd"})
    assert st == 409, (st, j)  # no overwrite: the link is there
    st, j = a.json("POST", "/files/rename", {"from": "real/f", "to": "l_passwd",
                                             "overwrite": True})
    assert st == 200 and not os.path.islink(a.home + "/l_passwd")
    assert open(a.home + "/l_passwd").read() == "real\n"  # /etc/passwd: checked by the fixture


@pytest.mark.parametrize("cwd", ["l_bhome", "l_etc", "l_bhome/sub", "l_etc/" + ETC_SUBDIR])
def test_symlink_exec_cwd(linked, cwd):
    a, b, _ = linked
    st, j = a.exec({"cmd": "pwd; ls; touch planted", "cwd": cwd})
    assert st == 400, (st, j)
    b_unchanged(b)
    r = a.run("pwd; touch planted", cwd="real/sub")
    assert r.code == 0 and r.out.strip() == a.home + "/real/sub"
    assert os.path.exists(a.home + "/real/sub/planted")


# ---- '..' and absolute paths ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["dotdot-sibling", "dotdot-etc", "abs-sibling", "abs-etc"])
def test_escape_read(pair, kind):
    a, b = pair
    assert b.write("secret", b"B-SECRET")[0] == 200
    path = {"dotdot-sibling": f"../{b.id}/secret", "dotdot-etc": "../../../../etc/passwd",
            "abs-sibling": f"{b.home}/secret", "abs-etc": "/etc/passwd"}[kind]
    st, _, data = a.read(path)
    assert st == 404 and b"B-SECRET" not in data and b"root:" not in data, (st, data)
    assert a.write("f", b"mine")[0] == 200  # positive controls: relative, absolute, dotted
    assert a.read(f"{a.home}/f")[2] == b"mine" and a.read("x/../f")[2] == b"mine"


@pytest.mark.parametrize("kind", ["dotdot-sibling", "abs-sibling", "abs-etc"])
def test_escape_write_stays_in_home(pair, kind):
    a, b = pair
    name = rand_name()
    path = {"dotdot-sibling": f"../{b.id}/{name}", "abs-sibling": f"{b.home}/{name}",
            "abs-etc": f"/etc/{name}"}[kind]
    st, _, data = a.write(path, b"X")
    assert st == 200, (st, data)
    assert not os.path.exists(os.path.join(b.home, name))
    assert not os.path.exists(f"/etc/{name}")
    # it landed inside A's home, at the path rooted there
    inside = {"dotdot-sibling": f"{b.id}/{name}", "abs-sibling": f"{b.home}/{name}".lstrip("/"),
              "abs-etc": f"etc/{name}"}[kind]
    assert open(os.path.join(a.home, inside), "rb").read() == b"X"


def test_escape_list_dotdot_is_the_home(pair):
    a, b = pair
    st, j = a.json("GET", "/files/list?path=" + q("../.."))
    names = sorted(e["name"] for e in j["entries"])
    assert st == 200 and names == [".sbx", ".tmp"], j
    assert b.id not in json.dumps(j)


@pytest.mark.parametrize("cwd,expect", [("..", ""), ("../..", ""), ("/", ""), ("/etc", "/etc"),
                                        ("{bhome}", None), ("../{bid}", None)])
def test_escape_exec_cwd(pair, cwd, expect):
    a, b = pair
    cwd = cwd.format(bhome=b.home, bid=b.id)
    if expect == "/etc":
        assert a.request("POST", "/files/mkdir?path=etc")[0] == 200
    st, ev = a.exec({"cmd": "pwd", "cwd": cwd})
    if expect is None:  # rooted at the home, where that directory does not exist
        assert st == 400, (st, ev)
        return
    assert st == 200, (st, ev)
    out = "".join(e.get("data", "") for e in ev if e.get("event") == "stdout")
    assert out.strip() == a.home + expect


# ---- lifecycle ------------------------------------------------------------------------------

def test_setsid_escapee_dies_with_delete(pool_host):
    a, b = pool_host.create(2)
    try:
        r = a.run("setsid sleep 1000 </dev/null >/dev/null 2>&1 & "
                  "setsid sh -c 'sleep 1001 & sleep 1002' </dev/null >/dev/null 2>&1 &")
        assert r.code == 0
        assert wait_until(lambda: len(uid_pids(a.uid)) >= 3, 3), uid_pids(a.uid)
        bj = bg_sleep(b)
        st, j = a.delete()
        assert st == 200 and j == {"id": a.id, "deleted": True}, (st, j)
        assert uid_pids(a.uid) == []
        assert not os.path.exists(a.home)
        assert b.json("GET", f"/processes/{bj['id']}")[1]["running"] is True  # bystander
    finally:
        b.delete()
        for pid in uid_pids(a.uid):  # whatever a failed teardown left (never on success)
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    assert uid_pids(b.uid) == []


def test_deep_tree_cannot_block_teardown(pool_host):
    """A directory chain deeper than a recursive delete walks must not leave the home (and a
    quarantined uid) behind."""
    a = pool_host.sandbox()
    r = a.py("import os\nfor i in range(600):\n    os.mkdir('d'); os.chdir('d')\n"
             "open('f', 'w').write('x')\nprint(len(os.getcwd()))")
    assert r.code == 0 and int(r.out) > 1200, r  # vacuity guard: the chain is really deep
    quarantined = pool_host.json("GET", "/health")[1]["uids"]["quarantined"]
    st, j = a.delete()
    assert (st, j) == (200, {"id": a.id, "deleted": True})
    assert not os.path.exists(a.home)
    assert pool_host.json("GET", "/health")[1]["uids"]["quarantined"] == quarantined
    homes_quiet(pool_host, 30)  # the janitor took the tree apart; the uid waits with a new home
    b = pool_host.sandbox()  # the uid is recycled (verified teardown) and works
    try:
        assert b.uid == a.uid and b.run("id -u").out.strip() == str(a.uid)
    finally:
        b.delete()


def test_no_server_descriptor_leaks_into_a_sandbox(pool_host, pair):
    a, b = pair
    # B has a file upload in flight (the server holds the file open) while A looks.
    s = socket.create_connection(("127.0.0.1", pool_host.port))
    s.sendall((f"PUT {b.path('/files/write?path=upload')} HTTP/1.1\r\nHost: x\r\n"
               f"X-Sandbox-Token: {b.token}\r\nContent-Length: 100\r\n\r\nhalf").encode())
    try:
        def server_has_upload():
            fd_dir = f"/proc/{pool_host.proc.pid}/fd"
            for f in os.listdir(fd_dir):
                try:  # the server opens and closes descriptors meanwhile
                    if os.readlink(os.path.join(fd_dir, f)).endswith("/upload"):
                        return True
                except FileNotFoundError:
                    pass
            return False
        assert wait_until(server_has_upload, 3)  # positive control: the descriptor exists
        # and a child, once it runs the new image (between fork and exec a shell holds
        # descriptors of its own for a moment)
        # (right after its exec the dynamic loader holds a library open for a moment: the
        # child's descriptors are read until they settle, for at most 2 s; a leaked one stays,
        # and its target is printed)
        r = a.run("ls /proc/self/fd; sleep 5 & p=$!; s=$(readlink -f /bin/sleep); "
                  "while [ \"$(readlink /proc/$p/exe)\" != \"$s\" ]; do :; done; "
                  "for i in $(seq 40); do [ \"$(ls /proc/$p/fd | tr '\\n' ' ')\" = '0 1 2 ' ] "
                  "&& break; sleep 0.05; done; "
                  "for f in $(ls /proc/$p/fd); do echo $f $(readlink /proc/$p/fd/$f); done; "
                  "kill $p")
        lines = r.out.splitlines()
        assert lines[:4] == ["0", "1", "2", "3"], r
        assert [ln.split()[0] for ln in lines[4:]] == ["0", "1", "2"], \
            ("ATTACK: a descriptor reached the sandbox's child", r)
    finally:
        s.close()


def test_fifo_in_home_does_not_block_the_server(pair):
    a, b = pair
    assert a.run("mkfifo ff && test -p ff").code == 0
    t0 = time.monotonic()
    assert a.read("ff")[0] == 400
    assert a.write("ff", b"x")[0] == 400
    assert time.monotonic() - t0 < 2
    assert b.run("echo ok").out == "ok\n"  # the one-threaded server is still serving
    assert a.write("regular", b"x")[0] == 200 and a.read("regular")[2] == b"x"


FORK_BOMB = """
import os, time
end = time.time() + 8
while time.time() < end:
    try:
        os.fork()
    except OSError:
        time.sleep(0.002)
"""


def test_fork_bomb_is_contained(pool_host):
    a = pool_host.sandbox(max_procs=32)
    b = pool_host.sandbox()
    try:
        a.start(["python3", "-c", FORK_BOMB], timeout=10)
        assert wait_until(lambda: len(uid_pids(a.uid)) >= 24, 5)  # the bomb really went off
        peak = 0
        for _ in range(3):
            t0 = time.monotonic()
            r = b.run("echo alive")
            assert r.out == "alive\n" and time.monotonic() - t0 < 3.0
            peak = max(peak, len(uid_pids(a.uid)))
        assert peak <= 32, peak
        st, j = a.delete()
        assert st == 200, (st, j)
        assert uid_pids(a.uid) == []
    finally:
        a.delete()
        b.delete()


def v1_groups(sb):
    """The cgroup v1 memory/pids/cpu groups of a command run in sb, from its /proc/self/cgroup."""
    out = sb.run("cat /proc/self/cgroup").out
    return {c: line.split(":", 2)[2] for line in out.splitlines()
            for c in ("memory", "pids", "cpu") if line.split(":")[1:2] == [c]}


def test_first_and_later_commands_join_the_sandbox_cgroups(pool_host):
    """The spawn helper makes a sandbox's groups at its first command and hands them back:
    that first command and every later one run in them, and two sandboxes never share."""
    a = pool_host.sandbox()
    b = pool_host.sandbox()
    try:
        if not a.info["limits"]["cgroup_memory_bytes"]:
            pytest.skip("no cgroup v1 memory controller on this host")
        first = v1_groups(a)
        assert set(first) >= {"memory", "pids"}, first
        slot = f"/s{a.uid - POOL_UID_BASE}"  # the pool_host fixture's uids
        assert all(g.endswith(slot) for g in first.values()), (first, slot)
        assert v1_groups(a) == first  # a later command: the descriptors the sandbox kept
        other = v1_groups(b)
        assert all(other[c] != first[c] for c in first), (first, other)
    finally:
        a.delete()
        b.delete()


CG_LOOK = """
import errno, json, os, sys
def groups():
    out = {}
    for line in open("/proc/self/cgroup").read().splitlines():
        n, ctrl, path = line.split(":", 2)
        if ctrl in ("memory", "pids", "cpu,cpuacct", "cpu"):
            out[ctrl.split(",")[0]] = "/sys/fs/cgroup/" + ctrl + path
        elif n == "0":
            out["unified"] = "/sys/fs/cgroup/unified" + path
    return out
def attempt(path, listing=False):
    try:
        return ("ok", sorted(os.listdir(path)) if listing else open(path).read().strip()[:200])
    except OSError as e:
        return (errno.errorcode[e.errno],)
g = groups()
names = {"memory": ["memory.max_usage_in_bytes", "memory.usage_in_bytes", "memory.limit_in_bytes",
                    "tasks", "cgroup.procs"],
         "pids": ["pids.current", "tasks"], "cpu": ["cpuacct.usage", "cpu.stat"],
         "unified": ["cpu.stat", "cgroup.procs", "cgroup.events"]}
res = {"groups": g, "own": {}, "sibling": {}, "parents": {},
       "control": attempt("/sys/fs/cgroup/memory/memory.limit_in_bytes")}
for ctrl, path in g.items():
    for f in names.get(ctrl, []):
        res["own"][ctrl + "/" + f] = attempt(path + "/" + f)
    parent = os.path.dirname(path)
    res["parents"][ctrl] = attempt(parent, listing=True)
    if len(sys.argv) > 1 and ctrl == "memory":  # a sibling's group, named as ours are
        res["sibling"]["memory"] = attempt(os.path.join(parent, sys.argv[1], "tasks"))
print(json.dumps(res))
"""


def test_a_sandbox_reads_no_pool_cgroup_its_own_or_a_siblings(pool_host):
    """A sandbox's cgroups are recycled with its uid, their counters never reset (the last
    tenant's CPU time and peak memory are in them), and a sibling's hold its pids and memory
    use: the host's parent groups are root's only, so a sandbox reads none of them, nor lists
    them. Positive controls: the files exist and root reads the last tenant's peak there, and
    the sandbox reads the rest of /sys/fs/cgroup."""
    a = pool_host.sandbox()
    if not a.info["limits"]["cgroup_memory_bytes"]:
        a.delete()
        pytest.skip("no cgroup v1 memory controller on this host")
    b = pool_host.sandbox()
    try:
        assert a.py("b = bytearray(48 << 20); b[::4096] = b'x' * len(b[::4096]); print('ok')"
                    ).out == "ok\n"
        slot_b = v1_groups(b)["memory"].rsplit("/", 1)[1]
        res = py_attempts(a, CG_LOOK, slot_b)
        mem = res["groups"]["memory"]
        # positive control: root reads A's peak in A's group (what its uid's next tenant would
        # inherit), and the sandbox reads a file of /sys/fs/cgroup outside the pool's groups
        with open(mem + "/memory.max_usage_in_bytes") as f:
            assert int(f.read()) >= 48 << 20
        assert res["control"][0] == "ok", res
        leaked = {k: v for k, v in res["own"].items() if v[0] != "EACCES"}
        assert not leaked, ("ATTACK: a sandbox read its pool cgroups' files", leaked)
        assert all(v == ["EACCES"] for v in res["parents"].values()), (
            "ATTACK: a sandbox listed the pool's cgroups", res["parents"])
        assert res["sibling"] == {"memory": ["EACCES"]}, (
            "ATTACK: a sandbox read a sibling's cgroup", res["sibling"])
    finally:
        a.delete()
        b.delete()


HOLD_4X30 = ("for i in 1 2 3 4; do python3 -c 'import time; b = b\"x\" * (30 << 20); "
             "time.sleep(1); print(\"held\")' & done; wait")


def test_memory_hog_is_contained(pool_host):
    a = pool_host.sandbox(max_mem_mb=64)
    b = pool_host.sandbox()
    try:
        r = a.py("b = bytearray(16 << 20); print('small-ok')")
        assert r.out == "small-ok\n", r  # positive control: A runs python under its limit
        r = a.py("b = bytearray(256 << 20); print('big-ok')")
        assert "big-ok" not in r.out and r.code != 0, r
        r = a.run("head -c 256M /dev/zero | tail -n 1 | wc -c")
        assert r.out.strip() != str(256 << 20), r
        # several processes, each under the per-process limit, together over it: the cgroup
        # (where the host has the memory controller)
        if a.info["limits"]["cgroup_memory_bytes"]:
            r = a.run(HOLD_4X30)
            assert r.out.count("held") < 4, r
            r = b.run(HOLD_4X30)  # positive control: B (2 GiB) holds all four
            assert r.out.count("held") == 4, r
        # B's 256 MiB promptly: within 5 s plus what a bare python3 in B costs right now (on a
        # loaded machine, e.g. test sessions running at once, that alone can take seconds)
        t0 = time.monotonic()
        assert b.py("print('base')").out == "base\n"
        base = time.monotonic() - t0
        t0 = time.monotonic()
        r = b.py("b = bytearray(256 << 20); print('big-ok')")
        took = time.monotonic() - t0
        assert r.out == "big-ok\n" and took < 5 + 4 * base, (r, took, base)
    finally:
        a.delete()
        b.delete()


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_output_flood_to_a_stalled_client(pool_host):
    a = pool_host.sandbox()
    b = pool_host.sandbox()
    try:
        before = rss_kb(pool_host.proc.pid)
        body = json.dumps({"cmd": "head -c 64M /dev/zero"}).encode()
        s = socket.create_connection(("127.0.0.1", pool_host.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall((f"POST {a.path('/exec')} HTTP/1.1\r\nHost: x\r\nX-Sandbox-Token: {a.token}"
                   f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
        s.settimeout(5)
        first = s.recv(4096)
        assert first.startswith(b"HTTP/1.1 200"), first  # the stream really started
        time.sleep(2)  # the client reads nothing more
        grown = rss_kb(pool_host.proc.pid) - before
        assert grown < 32 * 1024, f"server RSS grew by {grown} kB"
        assert uid_pids(a.uid), "the producer should be blocked, not finished"
        t0 = time.monotonic()
        assert b.run("echo ok").out == "ok\n" and time.monotonic() - t0 < 2
        s.close()
        assert wait_until(lambda: uid_pids(a.uid) == [], 5)  # cancelled with the client
    finally:
        a.delete()
        b.delete()


# ---- credentials on scoped and management routes --------------------------------------------

SCOPED = [
    ("POST", "/exec", {"cmd": "touch $HOME/ran"}),
    ("POST", "/processes", {"cmd": "touch $HOME/ran"}),
    ("GET", "/processes", None),
    ("GET", "/files/read?path=f", None),
    ("PUT", "/files/write?path=ran", b"x"),
    ("GET", "/files/list?path=.", None),
    ("GET", "/files/stat?path=f", None),
    ("DELETE", "/files/delete?path=f", None),
    ("POST", "/files/mkdir?path=ran", None),
    ("GET", "/proxy/8080/", None),
    ("DELETE", "", None),
]


@pytest.mark.parametrize("method,rest,body", SCOPED, ids=[f"{m} {r}" for m, r, _ in SCOPED])
def test_foreign_tokens_on_scoped_routes(pool_host, pair, method, rest, body):
    a, b = pair
    assert a.write("f", b"a-file")[0] == 200
    creds = {"sibling": b.token, "host": pool_host.token, "none": "",
             "wrong": secrets.token_hex(32), "prefix": a.token[:32], "upper": a.token.upper()}
    for name, tok in creds.items():
        st, _, data = a.request(method, rest, body, token=tok)
        assert st == 403, (name, st, data)
    assert not os.path.exists(a.home + "/ran") and os.path.exists(a.home + "/f")
    assert pool_host.json("GET", "/v1/sandboxes")[1] is not None
    # positive control: A's own token on the same route is not refused
    st, _, data = a.request(method, rest, body)
    assert st != 403, (st, data)
    if rest == "":
        assert st == 200 and not os.path.exists(a.home)


@pytest.mark.parametrize("rest", ["/exec", "/files/list?path=.", "", "/processes", "/token"])
def test_unknown_sandbox_id(pool_host, pair, rest):
    a, _ = pair
    method = {"/exec": "POST", "": "DELETE"}.get(rest, "GET")
    for bad in ["0123456789abcdef", a.id[:-1], a.id + "0", a.id.upper(), "..", "%2e%2e"]:
        for tok in (a.token, pool_host.token):
            st, _, data = pool_host.request(method, f"/v1/sandboxes/{bad}{rest}",
                                            {"cmd": "id"} if rest == "/exec" else None,
                                            headers={"X-Sandbox-Token": tok}, token=False)
            assert st in (403, 404) if bad in ("..", "%2e%2e") else st == 403, (bad, st, data)
    # positive control: the real id answers
    tok = pool_host.token if rest == "/token" else a.token
    st, _, _ = pool_host.request(method, a.path(rest), {"cmd": "id"} if rest == "/exec" else None,
                                 headers={"X-Sandbox-Token": tok}, token=False)
    assert st == 200


def test_sandbox_token_on_management_routes(pool_host, pair):
    a, b = pair
    h = {"X-Sandbox-Token": a.token}
    n_before = len(pool_host.list())
    for method, path, body in [("POST", "/v1/sandboxes", {"count": 1}),
                               ("GET", "/v1/sandboxes", None),
                               ("DELETE", "/v1/sandboxes", None),
                               ("GET", f"/v1/sandboxes/{a.id}/token", None),
                               ("GET", f"/v1/sandboxes/{b.id}/token", None),
                               ("GET", "/health?x", None)]:
        st, _, data = pool_host.request(method, path, body, headers=h, token=False)
        if path.startswith("/health"):
            assert st == 200 and b"sandboxes" not in data  # no detail for a sandbox token
            continue
        assert st == 403, (method, path, st, data)
        assert a.token.encode() not in data and b.token.encode() not in data
    # positive controls with the host token: nothing was created or deleted, tokens recover
    ids = {x["id"] for x in pool_host.list()}
    assert len(ids) == n_before and {a.id, b.id} <= ids
    st, j = pool_host.json("GET", f"/v1/sandboxes/{a.id}/token")
    assert st == 200 and j == {"id": a.id, "token": a.token}


# ---- uid reuse across delete + re-create ----------------------------------------------------

@pytest.mark.parametrize("route", ["/exec", "/processes"])
def test_uid_reuse_race(pool_host, route):
    a = pool_host.sandbox()
    old_uid = a.uid
    st, _, _ = a.request("POST", "/exec", {"cmd": "true"})  # a real uid with history
    assert st == 200
    length = 600
    s = socket.create_connection(("127.0.0.1", pool_host.port))
    s.settimeout(10)
    s.sendall((f"POST {a.path(route)} HTTP/1.1\r\nHost: x\r\nX-Sandbox-Token: {a.token}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
               '{"cmd":').encode())
    time.sleep(0.1)  # the head is authorized; the body is still coming
    st, j = a.delete()
    assert st == 200, (st, j)
    pool_host.homes_settled()  # the uid is back in the warm set with a home, next to be taken
    new = pool_host.sandbox()
    try:
        assert new.uid == old_uid  # vacuity guard: the uid really was reused
        rest = json.dumps(f"id -u > {new.home}/pwned; touch {new.home}/pwned2") + "}"
        rest = rest.encode() + b" " * (length - 7 - len(rest))
        s.sendall(rest)
        resp = b""
        while b"\r\n\r\n" not in resp or not resp.rstrip().endswith(b"}"):
            chunk = s.recv(65536)
            if not chunk:
                break
            resp += chunk
        s.close()
        assert resp.startswith(b"HTTP/1.1 400"), resp
        assert b"sandbox has been deleted" in resp, resp
        time.sleep(0.2)
        assert not os.path.exists(new.home + "/pwned") and not os.path.exists(new.home + "/pwned2")
        r = new.run("id -u")  # positive control: the new sandbox runs, as that uid
        assert r.out.strip() == str(old_uid)
    finally:
        new.delete()


# ---- the port proxy -------------------------------------------------------------------------

UNIX_HTTP = """
import http.server, os, socketserver, sys
path, log, tag = sys.argv[1], sys.argv[2], sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(log, "a") as f:
            f.write(self.path + "\\n")
        body = (tag + " " + self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
socketserver.UnixStreamServer(path, H).serve_forever()
"""


def serve(sb, port, tag):
    sock = f"{sb.home}/.sbx/proxy/{port}.sock"
    sb.start(["python3", "-c", UNIX_HTTP, sock, f"{sb.home}/log-{port}", tag])
    assert wait_until(lambda: os.path.exists(sock), 5)
    return f"{sb.home}/log-{port}"


def log_lines(path):
    try:
        return open(path).read().splitlines()
    except FileNotFoundError:
        return []


@pytest.fixture
def proxied(pair):
    a, b = pair
    serve(a, 8080, "A")
    b_log = serve(b, 8081, "B")
    st, _, data = a.request("GET", "/proxy/8080/hello?x=1")
    assert (st, data) == (200, b"A /hello?x=1")  # positive control: A reaches its own service
    return a, b, b_log


def test_proxy_symlink_to_sibling_socket(proxied):
    a, b, b_log = proxied
    assert a.run(f"ln -s {b.home}/.sbx/proxy/8081.sock .sbx/proxy/8081.sock").code == 0
    st, j = a.json("GET", "/files/stat?path=.sbx/proxy/8081.sock")
    assert j["type"] == "symlink"  # vacuity guard
    st, _, data = a.request("GET", "/proxy/8081/steal")
    assert st == 502 and not data.startswith(b"B"), (st, data)
    assert log_lines(b_log) == []  # B's service received nothing
    st, _, data = b.request("GET", "/proxy/8081/own")
    assert (st, data) == (200, b"B /own") and log_lines(b_log) == ["/own"]


def test_proxy_symlinked_proxy_dir(proxied):
    a, b, b_log = proxied
    r = a.run(f"mv .sbx/proxy .sbx/proxy.real && ln -s {b.home}/.sbx/proxy .sbx/proxy")
    assert r.code == 0, r
    st, _, data = a.request("GET", "/proxy/8081/steal")
    assert st == 502, (st, data)
    assert log_lines(b_log) == []
    assert b.request("GET", "/proxy/8081/own")[2] == b"B /own"


def test_proxy_regular_file_in_place_of_socket(proxied):
    a, b, b_log = proxied
    assert a.run("echo notasocket > .sbx/proxy/8082.sock").code == 0
    st, _, data = a.request("GET", "/proxy/8082/")
    assert st == 502, (st, data)
    assert a.request("GET", "/proxy/8080/ok")[2] == b"A /ok"


def test_proxy_socket_of_another_owner(proxied):
    """A socket the host (root) planted in A's proxy dir: refused by owner, and a root
    listener whose socket file was chowned to A: refused by SO_PEERCRED."""
    a, b, b_log = proxied
    got = []
    listeners = []
    for port, chown in ((8083, False), (8084, True)):
        path = f"{a.home}/.sbx/proxy/{port}.sock"
        ls = socket.socket(socket.AF_UNIX)
        ls.bind(path)
        ls.listen(4)
        if chown:
            os.chown(path, a.uid, a.uid)
        listeners.append(ls)

    def acceptor(ls):
        ls.settimeout(3)
        try:
            c, _ = ls.accept()
            c.settimeout(1)
            got.append(c.recv(100))
            c.close()
        except OSError:
            pass
    ts = [threading.Thread(target=acceptor, args=(ls,)) for ls in listeners]
    for t in ts:
        t.start()
    try:
        for port in (8083, 8084):
            st, _, data = a.request("GET", f"/proxy/{port}/x")
            assert st == 502, (port, st, data)
    finally:
        for t in ts:
            t.join()
        for ls in listeners:
            ls.close()
    assert all(g == b"" for g in got), got  # no request bytes reached a foreign listener


@pytest.mark.parametrize("path", ["/proxy/0/", "/proxy/65536/", "/proxy/-1/", "/proxy/08081x/",
                                  "/proxy/..%2F..%2F{bid}%2F.sbx%2Fproxy%2F8081/",
                                  "/proxy/8081%2F..%2F..%2F{bid}/", "/proxy/%38%30%38%31/"])
def test_proxy_bad_ports(proxied, path):
    a, b, b_log = proxied
    st, _, data = a.request("GET", path.format(bid=b.id))
    assert st == 404, (path, st, data)
    assert log_lines(b_log) == []


def test_proxy_sibling_token_cannot_use_a_service(proxied):
    a, b, b_log = proxied
    st, _, _ = a.request("GET", "/proxy/8080/x", token=b.token)
    assert st == 403
    st, _, _ = b.request("GET", "/proxy/8080/x")  # B's own route: B has no 8080 service
    assert st == 502
    assert a.request("GET", "/proxy/8080/y")[2] == b"A /y"


# ---- recycled network namespaces -------------------------------------------------------------
# A deleted sandbox's namespace goes to the next sandbox only when it shows nothing a fresh one
# would not (isolation/netns.c): the next tenant never sees the last one's traffic counters,
# sockets or TIME_WAIT entries.

NET_TRACE = """
import json, socket, sys
def lo():
    for l in open("/proc/net/dev").read().splitlines()[2:]:
        name, rest = l.split(":", 1)
        if name.strip() == "lo":
            return [int(x) for x in rest.split()][:2]  # rx bytes, rx packets
def udp_in():
    lines = [l.split() for l in open("/proc/net/snmp") if l.startswith("Udp:")]
    return int(lines[1][lines[0].index("InDatagrams")])
def tw():
    for l in open("/proc/net/sockstat"):
        if l.startswith("TCP:"):
            f = l.split()
            return int(f[f.index("tw") + 1])
if sys.argv[1] == "send":  # traffic on its own loopback, and a TCP connection closed first
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.sendto(b"x" * 100, s.getsockname())
        s.recv(200)
    with socket.socket() as l:
        l.listen(1)
        c = socket.create_connection(l.getsockname())
        a, _ = l.accept()
        c.close()  # the active closer keeps TIME_WAIT
        a.close()
print(json.dumps({"lo": lo(), "udp_in": udp_in(), "tw": tw(),
                  "ns": __import__("os").readlink("/proc/self/ns/net")}))
"""


def netns_counts(pool_host):
    """(recycled, discarded) once no deleted sandbox's namespace is still being checked (an
    earlier test's delete may still be in the janitor)."""
    assert wait_until(lambda: pool_host.json("GET", "/health")[1]["netns"]["checking"] == 0, 10)
    n = pool_host.json("GET", "/health")[1]["netns"]
    return n["recycled"], n["discarded"]


def delete_and_wait_checked(pool_host, sb):
    before = sum(netns_counts(pool_host))
    sb.delete()
    assert wait_until(lambda: sum(netns_counts(pool_host)) > before, 5)


def netns_settled(pool_host):
    """/health's netns once nothing is being checked or made (two equal reads 0.3 s apart)."""
    last = {}

    def settled():
        nonlocal last
        n = pool_host.json("GET", "/health")[1]["netns"]
        same = n == last and n["checking"] == 0 and n["making"] == 0
        last = n
        time.sleep(0.3)
        return same

    assert wait_until(settled, 15)
    return last


def test_namespaces_go_round_in_steady_use(pool_host):
    """Sandboxes created and deleted one after another reuse the namespaces that come back: none
    is made for them (refilling at every take made one per sandbox and tore the returned one
    down). Positive control: holding more than half the warm set at once makes new ones."""
    before = netns_settled(pool_host)
    for _ in range(20):
        (a,) = pool_host.create(1)
        assert a.run("true").code == 0
        delete_and_wait_checked(pool_host, a)
    after = netns_settled(pool_host)
    assert after["recycled"] == before["recycled"] + 20, (before, after)
    assert after["made"] == before["made"], (before, after)
    held = pool_host.create(after["warm"] // 2 + 1)
    try:
        # asked of the janitor at once (counted as making until it answers), then made
        n = pool_host.json("GET", "/health")[1]["netns"]
        assert n["making"] > 0 or n["made"] > after["made"], (after, n)
        assert wait_until(lambda: pool_host.json("GET", "/health")[1]["netns"]["made"]
                          > after["made"], 10)
    finally:
        for sb in held:
            sb.delete()


def test_a_used_network_namespace_is_never_handed_on(pool_host):
    (a,) = pool_host.create(1)
    res_a = py_attempts(a, NET_TRACE, "send")
    # positive control: what A did is visible in its namespace
    assert res_a["lo"][1] > 0 and res_a["udp_in"] > 0 and res_a["tw"] > 0, res_a
    recycled, discarded = netns_counts(pool_host)
    delete_and_wait_checked(pool_host, a)
    assert netns_counts(pool_host) == (recycled, discarded + 1)
    # B, made now, takes the namespace that came back last, if A's had: it starts clean
    (b,) = pool_host.create(1)
    try:
        res_b = py_attempts(b, NET_TRACE, "look")
        assert res_b["ns"] != res_a["ns"], (res_a, res_b)
        assert res_b["lo"] == [0, 0] and res_b["udp_in"] == 0 and res_b["tw"] == 0, res_b
    finally:
        b.delete()


def test_an_unused_network_namespace_is_handed_on_clean(pool_host):
    (a,) = pool_host.create(1)
    res_a = py_attempts(a, NET_TRACE, "look")  # runs a command, sends nothing
    recycled, discarded = netns_counts(pool_host)
    delete_and_wait_checked(pool_host, a)
    assert netns_counts(pool_host) == (recycled + 1, discarded)
    (b,) = pool_host.create(1)
    try:
        res_b = py_attempts(b, NET_TRACE, "look")
        assert res_b["ns"] == res_a["ns"], (res_a, res_b)  # the same namespace, reused
        assert res_b["lo"] == [0, 0] and res_b["udp_in"] == 0 and res_b["tw"] == 0, res_b
        # and it is still B's own: A's sibling cannot be reached from it (a fresh sandbox C)
        (c,) = pool_host.create(1)
        try:
            assert py_attempts(c, NET_TRACE, "look")["ns"] != res_b["ns"]
        finally:
            c.delete()
    finally:
        b.delete()


FLOW_LABEL = """
import json, socket, struct, sys
def labels():
    return [l.split() for l in open("/proc/net/ip6_flowlabel").read().splitlines()[1:]]
def udp6_inuse():
    for l in open("/proc/net/sockstat6"):
        if l.startswith("UDP6:"):
            return int(l.split()[2])
if sys.argv[1] == "leave":
    # an IPv6 flow label with an address of our choosing, shared and lingering: a setsockopt
    # that sends nothing and leaves no socket behind
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    # struct in6_flowlabel_req: dst, label, action (GET), share (ANY), flags (CREATE),
    # expires, linger (seconds)
    req = struct.pack("16sIBBHHHI", b"TENANT-A-SECRET!", socket.htonl(0x5EC12), 0, 255, 1,
                      150, 150, 0)
    s.setsockopt(socket.IPPROTO_IPV6, 32, req)  # IPV6_FLOWLABEL_MGR
    s.close()
print(json.dumps({"labels": labels(), "udp6": udp6_inuse(),
                  "ns": __import__("os").readlink("/proc/self/ns/net")}))
"""


def test_an_ipv6_flow_label_left_behind_is_never_handed_on(pool_host):
    """A flow label outlives its socket in the namespace (up to its linger), carrying an address
    its tenant chose: a namespace that holds one is not fresh, so it is torn down, not handed
    to the next sandbox (whatever its uid)."""
    (a,) = pool_host.create(1)
    res_a = py_attempts(a, FLOW_LABEL, "leave")
    # positive control: the label is there after the socket closed, and nothing else shows it
    secret = b"TENANT-A-SECRET!".hex()
    assert [l[0] for l in res_a["labels"]] == ["5EC12"], res_a
    assert res_a["labels"][0][6] == secret and res_a["udp6"] == 0, res_a
    recycled, discarded = netns_counts(pool_host)
    delete_and_wait_checked(pool_host, a)
    after = netns_counts(pool_host)
    assert after == (recycled, discarded + 1), (
        "ATTACK: a namespace holding a flow label was handed on", (recycled, discarded), after)
    (b,) = pool_host.create(1)
    try:
        res_b = py_attempts(b, FLOW_LABEL, "look")
        assert res_b["ns"] != res_a["ns"] and res_b["labels"] == [], (
            "ATTACK: the next tenant read the last one's flow label", res_a, res_b)
    finally:
        b.delete()


# ---- homes are never handed on -----------------------------------------------------------
# A deleted sandbox's home is removed, never given to the next sandbox of its uid, even when
# nothing in it changed (janitor.c, JAN_RECYCLE): the uid goes back to the warm set with a home
# made fresh for it. A sibling may hold descriptors or inotify watches on the old directories.

def homes_quiet(pool_host, timeout=5):
    """Wait until the janitor has answered every home asked of it; return homes' counts."""
    got = {}

    def quiet():
        got.update(pool_host.json("GET", "/health")[1]["homes"])
        return got["making"] == 0
    assert wait_until(quiet, timeout)
    return dict(got)


HOME_LOOK = """
import json, os
out = {}
for d in (".", ".tmp", ".sbx", ".sbx/proxy"):
    st = os.lstat(d)
    out[d] = {"mode": oct(st.st_mode & 0o7777), "uid": st.st_uid, "ino": st.st_ino,
              "entries": sorted(os.listdir(d)), "xattrs": os.listxattr(d, follow_symlinks=False)}
print(json.dumps(out))
"""

HOME_ATTACKS = {
    "a-file": "open('left-behind', 'w').write('secret')",
    "an-xattr": "os.setxattr('.sbx', 'user.note', b'secret')",
    "a-mode": "os.chmod('.tmp', 0o755)",
    "a-symlink": "os.symlink('/etc', '.sbx/proxy/link')",
    "a-dir-swapped": "os.rmdir('.sbx/proxy'); os.mkdir('.sbx/proxy', 0o755)",
}


def fresh_home(look, uid):
    return (look["."]["entries"] == [".sbx", ".tmp"] and look[".tmp"]["entries"] == []
            and look[".sbx"]["entries"] == ["proxy"] and look[".sbx/proxy"]["entries"] == []
            and all(v["mode"] == "0o700" and v["uid"] == uid and v["xattrs"] == []
                    for v in look.values()))


@pytest.mark.parametrize("attack", sorted(HOME_ATTACKS) + ["untouched"])
def test_a_deleted_home_is_never_handed_on(pool_host, attack):
    (a,) = pool_host.create(1)
    if attack != "untouched":
        r = a.py("import os\n" + HOME_ATTACKS[attack])
        assert r.code == 0, r
    look_a = py_attempts(a, HOME_LOOK)
    # positive control: A's home is changed by the attack, or exactly as made
    assert fresh_home(look_a, a.uid) == (attack == "untouched"), look_a
    # held open, A's home keeps its inode number: a fresh home cannot be given it again (ext4
    # hands a freed number straight back), so a different number means a different directory
    held = os.open(a.home, os.O_RDONLY | os.O_DIRECTORY)
    try:
        homes_quiet(pool_host)
        a.delete()
        homes_quiet(pool_host)
        (b,) = pool_host.create(1)
        try:
            assert b.uid == a.uid, (a.uid, b.uid)  # the uid came back (with a home for it)
            look_b = py_attempts(b, HOME_LOOK)
            assert look_b["."]["ino"] != look_a["."]["ino"], (look_a, look_b)
            assert fresh_home(look_b, b.uid), look_b
            assert wait_until(lambda: os.fstat(held).st_nlink == 0, 10), "A's home stayed"
        finally:
            b.delete()
    finally:
        os.close(held)


# A2 takes the descriptors A sends to a socket in its home, and lists them when told to (a file
# "go" appears in its home), into seen.json; bounded to a minute.
FD_KEEPER = r"""
import array, json, os, socket, time
home = os.environ["HOME"]
os.chmod(home, 0o711)
s = socket.socket(socket.AF_UNIX)
s.bind(home + "/rx.sock")
os.chmod(home + "/rx.sock", 0o777)
s.listen(1)
s.settimeout(60)
c, _ = s.accept()
_, anc, _, _ = c.recvmsg(16, socket.CMSG_SPACE(3 * 4))
fds = []
for lvl, typ, data in anc:
    a = array.array("i")
    a.frombytes(data[:len(data) - len(data) % 4])
    fds += list(a)
def listing():
    return [sorted(e.name for e in os.scandir(fd)) for fd in fds]
json.dump(listing(), open(home + "/first.json.tmp", "w"))
os.rename(home + "/first.json.tmp", home + "/first.json")
for _ in range(600):
    if os.path.exists(home + "/go"):
        json.dump(listing(), open(home + "/seen.json.tmp", "w"))
        os.rename(home + "/seen.json.tmp", home + "/seen.json")
        break
    time.sleep(0.1)
"""

FD_SENDER = r"""
import array, os, socket, sys
fds = [os.open(os.path.expanduser(d), os.O_RDONLY | os.O_DIRECTORY)
       for d in ("~", "~/.tmp", "~/.sbx/proxy")]
c = socket.socket(socket.AF_UNIX)
c.connect(sys.argv[1])
c.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
print("sent")
"""


def test_descriptors_a_sibling_kept_on_a_deleted_home_show_nothing_of_the_next_tenant(
        pool_host):
    """A hands its sibling A2 descriptors on its own home, .tmp and .sbx/proxy (a pathname
    unix socket in A2's home: Landlock ABI 7 leaves those to ordinary permissions) and leaves
    its home exactly as made. After A is deleted, the next sandbox of A's uid (B) must not be
    listed through them: its home is another directory."""
    a2, a = pool_host.create(2)
    try:
        a2.start(["python3", "-c", FD_KEEPER])
        sock = a2.home + "/rx.sock"
        assert wait_until(lambda: os.path.exists(sock), 10)
        r = a.py(FD_SENDER, sock)
        assert r.code == 0 and "sent" in r.out, r
        first = a2.home + "/first.json"
        assert wait_until(lambda: os.path.exists(first), 10)
        # positive control: the descriptors list A's home, .tmp and .sbx/proxy
        assert json.load(open(first)) == [[".sbx", ".tmp"], [], []]
        look_a = py_attempts(a, HOME_LOOK)
        assert fresh_home(look_a, a.uid), look_a  # untouched, as made
        homes_quiet(pool_host)
        assert a.delete()[0] == 200
        homes_quiet(pool_host)
        (b,) = pool_host.create(1)
        try:
            assert b.uid == a.uid, (a.uid, b.uid)
            r = b.run("echo s > victim-passwords.txt && mkdir .tmp/victim-dir && "
                      "python3 -c 'import socket; socket.socket(socket.AF_UNIX)"
                      ".bind(\".sbx/proxy/9000.sock\")' && ls -A . .tmp .sbx/proxy")
            assert r.code == 0 and "victim-passwords.txt" in r.out, r  # B's entries are there
            open(a2.home + "/go", "w").close()
            seen = a2.home + "/seen.json"
            assert wait_until(lambda: os.path.exists(seen), 10)
            got = json.load(open(seen))
            assert not any(n.startswith(("victim", "9000")) for names in got for n in names), (
                "ATTACK: a sibling listed the next tenant's home through kept descriptors", got)
        finally:
            b.delete()
    finally:
        a2.delete()
