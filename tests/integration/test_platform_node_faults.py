# SPDX-License-Identifier: MIT
"""sbx-node under faults (issue 10, the node's side):

- a node that holds no key set from the control plane yet answers 503 with Retry-After to a
  capability whose key it does not know, never a final 403 Deny unknown_key; once it has the
  set, an unknown key is a 403 again and valid capabilities work;
- a node restarted after SIGTERM (it stopped its runs, roots kept) or SIGKILL (its runs lived
  on) serves its jobs again: adopted (SIGKILL: same generation) or resumed from the kept root as
  the next generation (SIGTERM), never a permanent 409 no_run;
- a node killed in the middle of an install (SBX_TEST_CRASH_AT, a test-only knob that makes
  sbx-node exit with status 137 at a named step) leaves no process of the half-installed run
  behind once it is back, and the job converges.
"""
import os
import signal
import time

import pytest

from conftest import ExecResult, free_port, wait_until
from sbxplatform import AGENT_PORT, Control, Node, Platform, parse_ndjson


def start_again(plat, node, env=None):
    """The same node (name, state directory, port) as a new process; its log is appended to,
    so wait for its own registration line."""
    before = node.log().count("registered with the control plane")
    again = Node(plat, node.name, plat.control.port, port=node.port, env=env)
    plat.nodes[plat.nodes.index(node)] = again
    assert wait_until(lambda: again.log().count("registered with the control plane") > before,
                      15), again.log()[-2000:]
    plat.wait_nodes_live()
    return again


def stop(p):
    """Stop the platform; then end whatever a failed check left behind: processes (runs, an
    egress run's helpers) still holding files under the platform's directory."""
    try:
        p.stop()
    finally:
        for pid in holders_of(p.dir):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def exec_out(job, cmd):
    """stdout of cmd through the edge, or None when the request was not served."""
    try:
        r = job.exec_raw(cmd, timeout=10)
    except OSError:
        return None
    if r.status != 200 or "ndjson" not in r.headers.get("content-type", ""):
        return None
    return ExecResult(parse_ndjson(r.body)).out


# ---- 503 until the node has a key set -----------------------------------------------------------

def test_node_without_a_key_set_answers_503_until_it_has_one():
    """(Plain HTTP: with TLS, a node that never registered has no certificate from the CA yet,
    so nobody reaches it; a restarted node holding only its kept set is the TLS case, in
    test_platform_trust.py.)"""
    p = Platform(nodes=(), tls=False)
    try:
        late = free_port()  # the node's control plane: nobody listens there yet
        node = Node(p, "ks-late", late)
        p.nodes.append(node)
        assert wait_until(lambda: node.health().get("status") == "ok", 15), node.log()
        assert node.health()["keyset_version"] == 0
        run = {"sandbox": "keyless", "generation": 1, "node": "ks-late",
               "substrate": "process", "activation": "a-0123456789abcdef",
               "instance": "i-0123456789ab"}
        target = f"/v1/runs/keyless/ports/{AGENT_PORT}/v1/exec"
        valid = p.mint(run)  # signed with the control plane's current key
        unknown = p.mint(run, forge=True, kid="k-neverissued")
        for what, cap in (("valid", valid), ("unknown key", unknown)):
            r = node.request("POST", target, cap, {"cmd": "true"})
            assert r.status == 503 and r.headers.get("retry-after") == "1" and \
                r.json().get("reason") == "no_keyset", \
                f"key set check: a node without a key set judged a {what} capability: {r}"
        # the control plane comes up where the node looks for it: the node registers
        ctl = Control(p, "control-late", p.ctl_state, port=late)
        p.controls.append(ctl)
        assert wait_until(lambda: node.health().get("keyset_version", 0) > 0, 15), node.log()
        # now an unknown key is a refusal, and the valid capability is judged (no such run here)
        r = node.request("POST", target, unknown, {"cmd": "true"})
        assert r.status == 403 and r.json().get("reason") == "unknown_key", \
            f"with a key set, an unknown key must be a 403: {r}"
        r = node.request("POST", target, p.mint(run), {"cmd": "true"})
        assert r.status == 409 and r.json().get("reason") == "no_run", r
        p.wait_nodes_live()
        job = p.create()  # placed on the only node
        assert job.sh("echo served") == "served\n"
        r, res = node.exec(job, "echo direct", job.mint("exec"))
        assert r.status == 200 and res.out == "direct\n", (r, res)
        job.cancel()
    finally:
        stop(p)


# ---- a restarted node serves its jobs again ---------------------------------------------------

@pytest.mark.parametrize("sig,network", [("SIGTERM", "none"), ("SIGKILL", "none"),
                                         ("SIGTERM", "egress"), ("SIGKILL", "egress")],
                         ids=["SIGTERM", "SIGKILL", "SIGTERM-egress", "SIGKILL-egress"])
def test_restarted_node_serves_its_jobs_again(sig, network):
    """(egress: the run's helpers, pasta and the namespace holder, outlive a killed node; they
    must not keep its listening socket, or the restarted node cannot bind its address.)"""
    p = Platform(nodes=("rt-a",))
    try:
        job = p.create(network=network)
        job.sh("echo kept > /root/f")
        gen = job.run()["generation"]
        node = p.node("rt-a")
        if sig == "SIGTERM":
            node.proc.stop()  # the node stops its runs, keeps their roots
        else:
            node.proc.proc.kill()
            node.proc.proc.wait()
            node.proc.crashed = False
            node.proc.stop()
        # positive control: while the node is down nothing serves the job
        assert exec_out(job, "cat /root/f") is None
        start_again(p, node)
        served = wait_until(lambda: exec_out(job, "cat /root/f") == "kept\n", 20, 0.2)
        assert served, (f"restart after {sig}: the job is not served again: {job.inspect()}\n"
                        f"{p.logs_tail()}")
        j = job.inspect()
        assert j["stage"] == "RUNNING" and j["run"]["node"] == "rt-a", j
        # SIGKILL: the run lived on and was adopted; SIGTERM: resumed from its kept root
        want = gen if sig == "SIGKILL" else gen + 1
        assert j["run"]["generation"] == want, (sig, j)
        job.cancel()
    finally:
        stop(p)


# ---- a node killed mid-install leaves no orphan --------------------------------------------------

def holders_of(path):
    """Pids of processes holding a file descriptor on something under path."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            for fd in os.listdir(f"/proc/{d}/fd"):
                if os.readlink(f"/proc/{d}/fd/{fd}").startswith(path + "/"):
                    out.append(int(d))
                    break
        except OSError:
            pass
    return out


def in_pid_ns(ns):
    """Live processes (not zombies: a dead pid 1 waits for its new parent to reap it) of the
    pid namespace ns."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink(f"/proc/{d}/ns/pid") != ns:
                    continue
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                        out.append(int(d))
            except (OSError, IndexError):
                pass
    return out


def alive(pid, start):
    """Whether pid is still the process that started at `start` (and not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] not in ("Z", "X") and int(fields[19]) == start
    except (OSError, IndexError, ValueError):
        return False


@pytest.mark.parametrize("step,network", [
    ("install:before_spawn", "none"), ("install:after_clone", "none"),
    ("install:after_spawn", "none"), ("install:after_spawn", "egress")],
    ids=["before_spawn", "after_clone", "after_spawn", "after_spawn-egress"])
def test_node_killed_mid_install_leaves_no_orphan(step, network):
    p = Platform(nodes=())
    try:
        node = Node(p, "mi-a", p.control.port, env={"SBX_TEST_CRASH_AT": step})
        p.nodes.append(node)
        p.wait_nodes_live()
        job = p.create(wait=False, network=network)
        assert wait_until(lambda: not node.proc.alive(), 30), node.log()[-2000:]
        node.proc.crashed = False  # on purpose
        assert node.proc.proc.returncode == 137 and f"SBX_TEST_CRASH_AT={step}" in node.log(), \
            node.log()[-2000:]
        run_dir = node.run_dir(job.id)
        ns = None
        if step == "install:after_spawn":
            # the run's pid 1 was recorded and lives on while the node is down (positive
            # control: the scans below would see it)
            rec = node.run_record(job.id) or {}
            assert rec.get("state") == "installing" and rec.get("pid", 0) > 0, \
                f"ORPHAN: the half-installed run's process is not recorded: {rec}, yet " \
                f"{holders_of(run_dir)} hold its files"
            ns = os.readlink(f"/proc/{rec['pid']}/ns/pid")
            assert in_pid_ns(ns) and holders_of(run_dir), "the half-installed run is not there"
            helpers = [(rec[k + "_pid"], rec[k + "_start"]) for k in ("pasta", "holder")
                       if rec.get(k + "_pid")]
            assert len(helpers) == (2 if network == "egress" else 0), rec
            assert all(alive(*h) for h in helpers), f"egress helpers not running: {helpers}"
        else:
            # before_spawn: nothing was started. after_clone: cloned, not yet recorded, it was
            # waiting for the node's go-ahead and ends itself
            time.sleep(0.5)
            left = holders_of(run_dir)
            assert not left, f"ORPHAN: an unrecorded run process lives on after the node " \
                             f"died at {step}: {left}"
        node.proc.stop()
        again = start_again(p, node)
        if ns:
            assert f"run {job.id} generation 1 was being installed when the node stopped: " \
                   f"its process is killed" in again.log(), again.log()[-2000:]
            left = in_pid_ns(ns)  # killed before the node serves anything: none is left
            assert not left, f"ORPHAN: processes of the half-installed run survive the " \
                             f"restart: {left}"
            left = [h for h in helpers if alive(*h)]
            assert not left, f"ORPHAN: the half-installed run's egress helpers survive the " \
                             f"restart: {left}"

        # the job converges: the control plane's retry installs it on the node that is back
        def settled():
            j = job.inspect()
            return j if j["stage"] in ("RUNNING", "ERROR") and \
                (j["stage"] == "ERROR" or (j.get("run") or {}).get("state") == "running") \
                else None
        j = wait_until(settled, 30, 0.1)
        assert j, f"the job did not converge after the restart: {job.inspect()}\n" \
                  f"{p.logs_tail()}"
        if j["stage"] == "RUNNING":
            assert job.sh("echo back") == "back\n"
        else:
            assert j["message"].startswith("could not start"), j
        job.cancel()
    finally:
        stop(p)
