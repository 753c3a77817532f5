# SPDX-License-Identifier: MIT
"""The process substrate, observed from inside a run (through the edge proxy, as a user would):
its own pid namespace and hostname, the host's /usr and /etc read-only, a writable root of its
own, no host filesystem beyond that, and with a -nonet flavor only loopback (which works). Every
refusal has a positive control that shows the observation method works."""
import os
import re
import secrets
import socket
import subprocess

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
    assert comms <= {"sbx-server", "sh", "ps"}, ps  # ... and only those
    assert nprocs <= 6, out
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


def test_usr_and_etc_are_read_only(plat, job):
    for d in ("/usr", "/etc", "/usr/bin", "/opt"):
        if d == "/opt" and not os.path.isdir("/opt"):
            continue
        res = job.exec(f"touch {d}/sbx-probe")
        assert res.code != 0 and "Read-only file system" in res.err, (d, res)
        assert not os.path.exists(f"{d}/sbx-probe")
    res = job.exec("echo x >> /etc/hostname")
    assert res.code != 0, res
    # positive control: the files are there and readable (the host's /usr and /etc)
    assert job.sh("test -x /usr/bin/env && test -r /etc/passwd && echo yes") == "yes\n"


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


def test_nonet_has_only_loopback(plat, job, nonet):
    def ifaces(j):
        out = j.sh("cat /proc/net/dev")
        return {m.group(1) for m in re.finditer(r"^\s*([^\s:]+):", out, re.M)}
    assert ifaces(nonet) == {"lo"}
    # positive control: the same probe in a job with the host network sees the host's interfaces
    with open("/proc/net/dev") as f:
        host = {m.group(1) for m in re.finditer(r"^\s*([^\s:]+):", f.read(), re.M)}
    dummy = None
    if host == {"lo"}:
        # the host has only loopback: give it a second interface for the positive control
        dummy = "sbxpc" + secrets.token_hex(3)
        r = subprocess.run(["ip", "link", "add", dummy, "type", "dummy"], capture_output=True)
        assert r.returncode == 0, f"no positive control possible: ip link add: {r.stderr!r}"
        host = host | {dummy}
    try:
        assert ifaces(job) == host
    finally:
        if dummy:
            subprocess.run(["ip", "link", "del", dummy], capture_output=True)
    res = nonet.exec("python3 -c 'import socket; s=socket.socket(); s.settimeout(2); "
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
    cap = nonet.mint("proxy", port=8081, protocol="http")
    r = node.request("GET", node.ports_path(nonet.id, 8081, "/hello.txt"), cap,
                     headers={"X-Sandbox-Token": nonet.token})
    assert r.status == 403 and r.headers.get("x-sbx-verdict") == "Deny", r
    assert r.json()["reason"] == "port"
    r = nonet.proxy("GET", 8081, "/hello.txt")  # through the edge: the same refusal
    assert r.status == 403 and r.json()["reason"] == "port", r
    # positive control: the exposed port, same way
    cap = nonet.mint("proxy", port=8080, protocol="http")
    r = node.request("GET", node.ports_path(nonet.id, 8080, "/hello.txt"), cap,
                     headers={"X-Sandbox-Token": nonet.token})
    assert r.status == 200 and r.body == b"from-inside\n", r
