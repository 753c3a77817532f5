# SPDX-License-Identifier: MIT
"""The process substrate, observed from inside a run (through the edge proxy, as a user would):
its own pid namespace and hostname, the host's /usr read-only, an /etc of its own (never the
host's), a writable root of its own, no host filesystem beyond that, and only loopback (which
works). Every
refusal has a positive control that shows the observation method works."""
import os
import re
import socket
import time

import pytest

from conftest import wait_until
from sbxplatform import AGENT_PORT, Platform


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("iso-n1",))
    yield p
    p.stop()


@pytest.fixture(scope="module")
def job(plat):
    j = plat.create("iso", flavor="cpu-small")
    yield j
    j.cancel()


@pytest.fixture(scope="module")
def nonet(plat):
    j = plat.create("iso", flavor="cpu-small-nonet",
                    expose=[{"port": AGENT_PORT, "protocol": "http"},
                            {"port": 8080, "protocol": "http"}])
    yield j
    j.cancel()


def test_own_pid_namespace(plat, job):
    out = job.sh("cat /proc/1/comm; echo $$; ls /proc | grep -c '^[0-9]*$'; ps -eo pid=,comm=")
    lines = out.splitlines()
    assert lines[0] == "sbx-server"  # the agent is pid 1 of the run
    shell_pid, nprocs = int(lines[1]), int(lines[2])
    ps = [l.split(None, 1) for l in lines[3:]]
    comms = {c for _, c in ps}
    assert ("1", "sbx-server") in {(p, c) for p, c in ps}, ps
    assert str(shell_pid) in {p for p, _ in ps}  # positive control: ps sees this run's processes
    # ... and only those (the agent's spawn helpers are its own children)
    assert comms <= {"sbx-server", "sbx-spawner", "sh", "ps"}, ps
    helpers = sum(1 for _, c in ps if c == "sbx-spawner")
    assert nprocs <= 6 + helpers, out
    # The host sees many more processes, among them the node and the control plane.
    host = [d for d in os.listdir("/proc") if d.isdigit()]
    assert len(host) > nprocs + 3
    node_pid = job.node().proc.proc.pid
    assert os.path.exists(f"/proc/{node_pid}")
    if node_pid > 64:  # a pid that cannot also be one of the run's few own pids
        assert job.exec(f"test -e /proc/{node_pid}").code != 0


def test_own_hostname(plat, job):
    assert job.sh("hostname").strip() == job.id
    assert socket.gethostname() != job.id  # the host's name is untouched


def test_usr_is_read_only_and_etc_is_the_runs_own(plat, job):
    for d in ("/usr", "/usr/bin"):
        res = job.exec(f"touch {d}/sbx-probe")
        assert res.code != 0 and "Read-only file system" in res.err, (d, res)
        assert not os.path.exists(f"{d}/sbx-probe")
    # positive control: the host's programs are there and run
    assert job.sh("test -x /usr/bin/env && /usr/bin/env true && echo yes") == "yes\n"
    # /etc is the run's: made fresh for it, writable by its root, never the host's files
    assert os.path.exists("/etc/shadow")
    res = job.exec("test -e /etc/shadow || echo absent; cat /etc/passwd; ls /opt 2>&1")
    assert res.out.startswith("absent\nroot:x:0:0:"), res
    with open("/etc/passwd") as f:
        host_passwd = f.read()
    assert host_passwd not in res.out
    job.sh("echo 10.9.8.7 probe-host >> /etc/hosts")
    assert "probe-host" in job.sh("cat /etc/hosts")
    with open("/etc/hosts") as f:
        assert "probe-host" not in f.read()  # the host's /etc/hosts is untouched
    with open(job.node().root_path(job.id, "/etc/hosts")) as f:
        assert "probe-host" in f.read()  # the write landed in the run's root


def test_root_is_writable_elsewhere(plat, job):
    out = job.sh("for d in /root /tmp /var /home /; do echo w > $d/probe-$$ && echo ok $d; done;"
                 " echo $$")
    lines = out.splitlines()
    assert lines[:5] == ["ok /root", "ok /tmp", "ok /var", "ok /home", "ok /"], out
    pid = lines[5]
    node = job.node()
    for d in ("root", "tmp", "var", "home", ""):
        p = node.root_path(job.id, os.path.join("/", d, f"probe-{pid}"))
        with open(p) as f:  # the writes land in the run's own root on the node
            assert f.read() == "w\n"
    for d in ("/root", "/tmp", "/var", "/home", "/"):
        assert not os.path.exists(os.path.join(d, f"probe-{pid}"))


def test_host_filesystem_is_not_visible(plat, job):
    node = job.node()
    assert os.path.isdir(node.state) and os.path.isdir(os.path.dirname(__file__))
    res = job.exec(f"ls {node.state}; ls {os.path.dirname(__file__)}")
    assert res.code != 0 and res.out == "", res
    assert "No such file" in res.err, res


def test_every_run_has_only_loopback(plat, job, nonet):
    def ifaces(j):
        out = j.sh("cat /proc/net/dev")
        return {m.group(1) for m in re.finditer(r"^\s*([^\s:]+):", out, re.M)}
    # the default flavor and the -nonet one alike: a network namespace with loopback only
    assert ifaces(job) == {"lo"}
    assert ifaces(nonet) == {"lo"}
    # positive control: the same probe on the host sees the host's interfaces
    with open("/proc/net/dev") as f:
        host = {m.group(1) for m in re.finditer(r"^\s*([^\s:]+):", f.read(), re.M)}
    assert host != {"lo"}, "the host itself has only loopback: no positive control"
    res = job.exec("python3 -c 'import socket; s=socket.socket(); s.settimeout(2); "
                   "s.connect((\"1.1.1.1\", 53))'")
    assert res.code != 0 and "unreachable" in res.err.lower(), res


def test_nonet_loopback_works_through_the_edge(plat, nonet):
    nonet.sh("mkdir -p /srv && echo from-inside > /srv/hello.txt")
    nonet.start_process("exec python3 -m http.server 8080 --bind 127.0.0.1 --directory /srv")
    ok = wait_until(lambda: nonet.proxy("GET", 8080, "/hello.txt").status == 200, 15, 0.1)
    r = nonet.proxy("GET", 8080, "/hello.txt")
    assert ok and r.body == b"from-inside\n", r
    # inside, loopback reaches it too
    assert nonet.sh("python3 -c 'import urllib.request as u; "
                    "print(u.urlopen(\"http://127.0.0.1:8080/hello.txt\").read().decode(), "
                    "end=\"\")'") == "from-inside\n"


def test_unexposed_port_is_denied_by_the_node(plat, nonet):
    node = nonet.node()
    # a service listens on 8081 inside, but the job does not expose it
    nonet.start_process("exec python3 -m http.server 8081 --bind 127.0.0.1 --directory /srv")
    assert wait_until(lambda: nonet.exec(
        "python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8081/\")'"
    ).code == 0, 15, 0.1)
    path = node.ports_path(nonet.id, 8081, "/hello.txt")
    cap = nonet.mint("proxy", port=8081, protocol="http", method="GET", target=path)
    r = node.request("GET", path, cap,
                     headers={"X-Sandbox-Token": nonet.token})
    assert r.status == 403 and r.headers.get("x-sbx-verdict") == "Deny", r
    assert r.json()["reason"] == "port"
    r = nonet.proxy("GET", 8081, "/hello.txt")  # through the edge: the same refusal
    assert r.status == 403 and r.json()["reason"] == "port", r
    # positive control: the exposed port, same way
    path = node.ports_path(nonet.id, 8080, "/hello.txt")
    cap = nonet.mint("proxy", port=8080, protocol="http", method="GET", target=path)
    r = node.request("GET", path, cap,
                     headers={"X-Sandbox-Token": nonet.token})
    assert r.status == 200 and r.body == b"from-inside\n", r


def test_a_pooled_commands_timeout_takes_its_setsid_descendants(plat):
    """Inside a pool run the run's cgroup2 group is delegated to it; each command of a sandbox
    gets a group of its own, so a timeout kills what left its process group too."""
    import secrets as _s
    job = plat.create("iso", mode="pool", flavor="cpu-small")
    h = {"X-Sandbox-Token": job.token}
    r = job.proxy("POST", AGENT_PORT, "/v1/sandboxes", body={"count": 1}, headers=h)
    sb = r.json()["sandboxes"][0]
    node = job.node()
    host_uid = None
    marker = "6" + str(_s.randbelow(10**6))

    def escapees():
        found = []
        for pid in os.listdir("/proc"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f"sleep 300 {marker}".encode() in f.read().replace(b"\0", b" "):
                        found.append(pid)
            except OSError:
                pass
        return found
    cmd = (f"setsid sh -c 'exec sleep 300 {marker}' </dev/null >/dev/null 2>&1 & "
           "sleep 0.3; echo started; exec sleep 200")
    r = job.proxy("POST", AGENT_PORT, f"/v1/sandboxes/{sb['id']}/exec",
                  body={"cmd": cmd, "timeout": 1}, headers={"X-Sandbox-Token": sb["token"]},
                  timeout=30)
    assert r.status == 200 and '"timed_out":true' in r.text and "started" in r.text, r
    assert wait_until(lambda: not escapees(), 5), escapees()
    # positive control: the same escapee from a command that ends on its own stays
    cmd2 = f"setsid sh -c 'exec sleep 300 {marker}' </dev/null >/dev/null 2>&1 & echo ok"
    r = job.proxy("POST", AGENT_PORT, f"/v1/sandboxes/{sb['id']}/exec", body={"cmd": cmd2},
                  headers={"X-Sandbox-Token": sb["token"]})
    assert r.status == 200

    def uid_of_escapee():  # (its cmdline reads empty for an instant while it execs sleep)
        for pid in escapees():
            try:
                with open(f"/proc/{pid}/status") as f:
                    return int(next(l for l in f if l.startswith("Uid:")).split()[1])
            except (OSError, StopIteration):
                pass
        return None
    assert wait_until(lambda: uid_of_escapee() is not None, 5)
    time.sleep(0.3)
    host_uid = uid_of_escapee()
    assert host_uid is not None  # still there: a command that ends leaves it alone
    # a sandbox uid (20000..64999) of the run's own block of the node's range
    assert node.id_start <= host_uid < node.id_start + node.id_count, host_uid
    assert 20000 <= (host_uid - node.id_start) % 65536 < 65000, host_uid
    job.cancel()
    assert wait_until(lambda: not escapees(), 10)


def test_masked_proc_files_read_empty(plat, job):
    """/proc files any host user may read but that describe the host (memory zones, the
    buddy allocator, I/O memory) are masked in a run: they read empty there."""
    import subprocess as _sp
    files = ("zoneinfo", "buddyinfo", "key-users")
    out = job.sh("for f in " + " ".join(files) + "; do printf '%s ' $(wc -c < /proc/$f); done")
    assert out.split() == ["0"] * len(files), f"masked /proc files not empty in a run: {out}"
    # positive control: on the host an unprivileged user reads them
    for f in files:
        r = _sp.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat",
                     f"/proc/{f}"], capture_output=True)
        assert r.returncode == 0 and len(r.stdout) > 0, (f, r)


def _capbnd(status_text):
    line = next(l for l in status_text.splitlines() if l.startswith("CapBnd:"))
    return int(line.split()[1], 16)


def test_capability_bounding_sets(plat, job):
    """A dedicated run keeps what a program running as root ordinarily needs; a pool host also
    what packing sandboxes takes (inherited by its sandboxes' commands, within its user
    namespace). Positive control: the host's own bounding set is wider than both."""
    bits = lambda *ns: sum(1 << n for n in ns)  # noqa: E731
    dedicated = bits(0, 1, 3, 4, 5, 6, 7, 10, 18, 29)  # CHOWN DAC_OVERRIDE FOWNER FSETID KILL
    # SETGID SETUID NET_BIND_SERVICE SYS_CHROOT AUDIT_WRITE
    pool = dedicated | bits(2, 12, 19, 21)  # DAC_READ_SEARCH NET_ADMIN SYS_PTRACE SYS_ADMIN
    assert _capbnd(job.sh("cat /proc/self/status")) == dedicated
    pj = plat.create("iso", mode="pool", flavor="cpu-small")
    r = pj.proxy("POST", AGENT_PORT, "/v1/sandboxes", body={"count": 1},
                 headers={"X-Sandbox-Token": pj.token})
    sb = r.json()["sandboxes"][0]
    r = pj.proxy("POST", AGENT_PORT, f"/v1/sandboxes/{sb['id']}/exec",
                 body={"cmd": "grep CapBnd /proc/self/status"},
                 headers={"X-Sandbox-Token": sb["token"]})
    m = re.search(r"CapBnd:\\t([0-9a-f]+)", r.text)
    assert m and int(m.group(1), 16) == pool, r
    with open("/proc/self/status") as f:
        host = _capbnd(f.read())
    assert host & ~pool and host & pool == pool  # the host's set holds more
    pj.cancel()


def test_a_run_binds_low_ports_and_pings_on_its_own_loopback(plat, job):
    """Its network namespace is the host's user namespace's, so the node sets what root of a
    run could not: low ports and ICMP echo sockets for every id of the run."""
    out = job.sh("python3 -c 'import socket\n"
                 "s = socket.socket(); s.bind((\"127.0.0.1\", 80)); s.listen(1)\n"
                 "p = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)\n"
                 "print(\"bound\", s.getsockname()[1], \"icmp\", p.fileno() > 0)'")
    assert out.strip() == "bound 80 icmp True", out
