# SPDX-License-Identifier: MIT
"""Egress for runs (network "egress"): a firewall in the run's network namespace that the run
cannot change, and pasta carrying its connections out. The outside world here is a network
namespace this test makes, reached from the host over a veth pair (10.199.<n>.0/30): a server
in it stands for a public service. Every refusal has a positive control on the same server."""
import glob
import os
import secrets
import signal
import subprocess
import time

import pytest

from conftest import wait_until
from sbxplatform import Platform

NET = f"10.199.{secrets.randbelow(200) + 20}"
HOST_IP, EXT_IP = f"{NET}.1", f"{NET}.2"
# a second link to the outside on a network that is not private (TEST-NET-2): a neighbour of
# the host, as a gateway or the machines of a public subnet are
_Q = 4 * secrets.randbelow(64)
PUB_NET, PUB_HOST_IP, PUB_IP = f"198.51.100.{_Q}/30", f"198.51.100.{_Q + 1}", f"198.51.100.{_Q + 2}"


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)


SERVER = """
import http.server, socketserver, sys, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("port %d" % self.server.server_address[1]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
for port in (8080, 8081):
    s = socketserver.TCPServer((sys.argv[1], port), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
threading.Event().wait()
"""


@pytest.fixture(scope="module")
def outside():
    """A namespace with a veth to the host, serving HTTP on EXT_IP:8080 and :8081, and a canary
    on the host's own end of the veth."""
    ns = f"sbxt-eg-{secrets.token_hex(3)}"
    hv, nv = f"sbxh{secrets.token_hex(2)}", f"sbxn{secrets.token_hex(2)}"
    hv2, nv2 = f"sbxh{secrets.token_hex(2)}", f"sbxn{secrets.token_hex(2)}"
    sh("ip", "netns", "add", ns)
    procs = []
    try:
        sh("ip", "link", "add", hv, "type", "veth", "peer", "name", nv, "netns", ns)
        sh("ip", "addr", "add", f"{HOST_IP}/30", "dev", hv)
        sh("ip", "link", "set", hv, "up")
        sh("ip", "-n", ns, "addr", "add", f"{EXT_IP}/30", "dev", nv)
        sh("ip", "-n", ns, "link", "set", nv, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", hv2, "type", "veth", "peer", "name", nv2, "netns", ns)
        sh("ip", "addr", "add", f"{PUB_HOST_IP}/30", "dev", hv2)
        sh("ip", "link", "set", hv2, "up")
        sh("ip", "-n", ns, "addr", "add", f"{PUB_IP}/30", "dev", nv2)
        sh("ip", "-n", ns, "link", "set", nv2, "up")
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", SERVER,
                                       EXT_IP]))
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, "python3", "-c", SERVER,
                                       PUB_IP]))
        canary = subprocess.Popen(["python3", "-c", SERVER.replace("(8080, 8081)", "(8090,)"),
                                   HOST_IP])
        procs.append(canary)
        ok = wait_until(lambda: sh("curl", "-s", "-m", "2", f"http://{EXT_IP}:8080/",
                                   check=False).stdout == "port 8080", 10)
        assert ok, "the outside server does not answer from the host"
        assert wait_until(lambda: sh("curl", "-s", "-m", "2", f"http://{PUB_IP}:8080/",
                                     check=False).stdout == "port 8080", 10)
        assert wait_until(lambda: sh("curl", "-s", "-m", "2", f"http://{HOST_IP}:8090/",
                                     check=False).stdout == "port 8090", 10)
        yield ns
    finally:
        for p in procs:
            p.kill()
            p.wait()
        sh("ip", "link", "del", hv, check=False)
        sh("ip", "link", "del", hv2, check=False)
        sh("ip", "netns", "del", ns, check=False)


@pytest.fixture(scope="module")
def plat(outside):
    p = Platform(nodes=("eg-n1",))
    yield p
    p.stop()


FETCH = ("python3 -c 'import sys,urllib.request as u\n"
         "try: print(u.urlopen(sys.argv[1], timeout=3).read().decode())\n"
         "except Exception as e: print(\"refused\", type(e).__name__, e)' ")


def fetch(job, url):
    return job.sh(FETCH + url).strip()


def test_allow_list_reaches_exactly_its_entries(plat):
    job = plat.create("eg", flavor="cpu-small", network="egress",
                      egress_allow=[f"{EXT_IP}/32:8080", f"{NET}.0/30:8090"])
    assert wait_until(lambda: fetch(job, f"http://{EXT_IP}:8080/") == "port 8080", 10), \
        fetch(job, f"http://{EXT_IP}:8080/")  # positive control: the allowed entry works
    assert fetch(job, f"http://{EXT_IP}:8081/").startswith("refused")  # same host, other port
    # the host's own address is refused even though an entry covers it
    assert fetch(job, f"http://{HOST_IP}:8090/").startswith("refused")
    assert "nameserver 198.18.0.53" in job.sh("cat /etc/resolv.conf")
    job.cancel()


def test_without_a_list_private_ranges_and_the_host_stay_closed(plat):
    job = plat.create("eg", flavor="cpu-small", network="egress")
    assert wait_until(lambda: "eth" in job.sh("cat /proc/net/dev") or
                      len(job.sh("cat /proc/net/dev").splitlines()) > 3, 10)
    assert fetch(job, f"http://{EXT_IP}:8080/").startswith("refused")  # 10.0.0.0/8 is private
    assert fetch(job, f"http://{HOST_IP}:8090/").startswith("refused")
    for url in ("http://127.0.0.1:8090/", "http://169.254.169.254/", f"http://[::1]:8090/"):
        assert fetch(job, url).startswith("refused"), url
    # a neighbour of the host on a network that is not private (the host is on 198.51.100.x)
    got = fetch(job, f"http://{PUB_IP}:8080/")
    assert got.startswith("refused"), f"LEAK: a run reaches the host's neighbour: {got}"
    # positive control: the same servers through an allow-list (and the test above) answer
    job.cancel()
    job = plat.create("eg", flavor="cpu-small", network="egress",
                      egress_allow=[f"{PUB_IP}/32:8080"])
    assert wait_until(lambda: fetch(job, f"http://{PUB_IP}:8080/") == "port 8080", 10), \
        fetch(job, f"http://{PUB_IP}:8080/")
    job.cancel()


def test_the_run_cannot_change_its_firewall_or_interfaces(plat):
    job = plat.create("eg", flavor="cpu-small", network="egress", egress_allow=[f"{EXT_IP}/32"])
    assert wait_until(lambda: fetch(job, f"http://{EXT_IP}:8081/") == "port 8081", 10)
    res = job.exec("ip link set lo down 2>&1; echo rc=$?; "
                   "python3 -c 'import socket; s=socket.socket(socket.AF_NETLINK, "
                   "socket.SOCK_RAW, 12); s.bind((0,0)); print(\"netlink open\")'")
    assert "rc=0" not in res.out, res
    assert fetch(job, f"http://{EXT_IP}:8081/") == "port 8081"  # still exactly as before
    job.cancel()


def test_network_none_has_no_way_out(plat):
    job = plat.create("eg", flavor="cpu-small")  # network "none", the default
    assert fetch(job, f"http://{EXT_IP}:8080/").startswith("refused")
    assert job.sh("cat /etc/resolv.conf") == ""
    job.cancel()


@pytest.mark.parametrize("entry", ["10.0.0.1/8", "10.0.0.0/33", "300.1.1.1", "10.0.0.0/8:0",
                                   "10.0.0.0/8:65536", "host.example:443", "", "[::1/128",
                                   "2001:db8::/32:443"])
def test_allow_lists_that_do_not_parse_are_refused(plat, entry):
    r = plat.request("POST", "/v1/jobs/eg", {"network": "egress", "egress_allow": [entry]})
    assert r.status == 400 and "egress_allow" in r.text, (entry, r)


def test_allow_list_needs_egress_and_ipv6_entries_parse(plat):
    r = plat.request("POST", "/v1/jobs/eg", {"egress_allow": [f"{EXT_IP}/32"]})
    assert r.status == 400 and "egress_allow" in r.text, r
    r = plat.request("POST", "/v1/jobs/eg", {"network": "egress", "flavor": "cpu-small",
                                             "egress_allow": ["[2001:db8::/32]:443",
                                                              "2001:db8:1::/48"]})
    assert r.status == 201, r
    plat.request("POST", f"/v1/jobs/eg/{r.json()['id']}/cancel")


def loops_backing(job_id):
    """Loop devices whose backing file is the disk of run `job_id` (in its directory, or in
    the node's trash after a retire)."""
    found = []
    for f in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(f) as fh:
                back = fh.read().strip()
        except OSError:
            continue
        if f"/{job_id}/" in back or f"-{job_id}-" in back:
            found.append(back)
    return found


def test_pasta_holds_no_other_runs_disk(plat):
    """pasta lives in a mount namespace of its own, copied from the host's when its run starts:
    the disks of the runs already there are detached in it, so a cancelled run's disk (its
    mount and loop device) goes at once, not when the egress run ends. Positive control: the
    node's own mount namespace has that disk mounted while its run runs."""
    other = plat.create("eg", flavor="cpu-small")
    node = other.node()
    root = os.path.join(node.run_dir(other.id), "root")
    assert os.path.ismount(root) and loops_backing(other.id)  # positive control
    eg = plat.create("eg", flavor="cpu-small", network="egress")
    pasta = node.run_record(eg.id)["pasta_pid"]
    assert pasta > 0
    with open(f"/proc/{pasta}/mountinfo") as f:
        theirs = f.read()  # its own namespace (pasta may also have isolated itself further)
    assert root not in theirs, f"LEAK: pasta holds another run's disk mount ({root})"
    other.cancel()
    gone = wait_until(lambda: not loops_backing(other.id), 10, 0.1)
    assert gone, f"LEAK: a cancelled run's disk stays attached: {loops_backing(other.id)}"
    eg.cancel()


def alive(pid, start):
    """Whether process pid is still the one that started at `start` (clock ticks)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[19]) == start


def test_a_run_that_ends_by_itself_takes_its_network_helpers_along(plat):
    """An egress run whose process ends on its own (its agent exits: an idle timeout set in
    its environment, or here its pid 1 killed from the host) ends its pasta and its network
    namespace's holder with it; they outlived the run, and the node, before (a red-team pass).
    Positive control: both run while the run does."""
    job = plat.create("eg", flavor="cpu-small", network="egress")
    node = job.node()
    rec = node.run_record(job.id)
    helpers = [(rec["pasta_pid"], rec["pasta_start"]), (rec["holder_pid"], rec["holder_start"])]
    assert all(p > 0 and alive(p, s) for p, s in helpers), (rec, helpers)  # positive control
    os.kill(rec["pid"], signal.SIGKILL)
    assert wait_until(lambda: (node.run_record(job.id) or {}).get("state") == "exited", 10)
    gone = wait_until(lambda: not any(alive(p, s) for p, s in helpers), 10, 0.1)
    assert gone, f"LEAK: the network helpers of a run that ended still run: {helpers}"
    r = job.action("cancel")
    assert r.status == 202, r
