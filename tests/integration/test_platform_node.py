# SPDX-License-Identifier: MIT
"""sbx-node restarts: a node that crashed (SIGKILL) leaves its runs running in their own
namespaces; started again on the same state directory it reloads its run records and keeps
serving the runs whose process is still the recorded one (pid + start time), with the same
bridge verification; a run whose process died meanwhile is not served."""
import os
import signal
import time

import pytest

from conftest import wait_until
from sbxplatform import Node, Platform


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("rs-a",))
    yield p
    p.stop()


def crash_and_restart(plat, node):
    node.proc.proc.kill()  # SIGKILL: the node cannot stop its runs
    node.proc.proc.wait()
    node.proc.crashed = False  # we did it
    node.proc.stop()
    return start_again(plat, node)


def start_again(plat, node):
    """The same node (name, state directory, port) as a new process; its log file is appended
    to, so wait for its own registration line."""
    before = node.log().count("registered with the control plane")
    again = Node(plat, node.name, plat.control.port, port=node.port)
    plat.nodes[plat.nodes.index(node)] = again
    assert wait_until(lambda: again.log().count("registered with the control plane") > before,
                      15), again.log()[-2000:]
    plat.wait_nodes_live()
    return again


def test_restarted_node_adopts_live_runs(plat):
    node = plat.node("rs-a")
    job = plat.create()
    job.sh("echo before > /root/f")
    rec = node.run_record(job.id)
    pid, gen = rec["pid"], job.run()["generation"]
    node = crash_and_restart(plat, node)
    assert f"loaded run {job.id} generation {gen} (running)" in node.log()
    # the run never stopped: same process, same generation, its files, served again
    assert os.path.exists(f"/proc/{pid}")
    assert job.sh("cat /root/f; echo $$") .startswith("before\n")
    assert node.run_record(job.id)["pid"] == pid and job.run()["generation"] == gen
    # a capability for that run goes straight to the restarted node too
    cap = job.mint("exec", job.run())
    r, res = node.exec(job, "echo direct", cap)
    assert r.status == 200 and res.out == "direct\n", (r, res)
    # and the lifecycle still works on an adopted run: pause stops it, resume is a new
    # generation with the files
    assert job.action("pause").status == 202
    job.wait_stage("PAUSED")
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}") or
                      open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z", 10)
    assert job.action("resume").status == 202
    job.wait_stage("RUNNING", generation=gen + 1)
    assert job.sh("cat /root/f") == "before\n"
    job.cancel()


def test_run_that_died_while_the_node_was_down_is_not_served(plat):
    node = plat.node("rs-a")
    job = plat.create()
    rec = node.run_record(job.id)
    node.proc.proc.kill()
    node.proc.proc.wait()
    os.kill(rec["pid"], signal.SIGKILL)  # the run dies while its node is down
    time.sleep(0.2)
    node.proc.crashed = False
    node.proc.stop()
    again = start_again(plat, node)
    assert f"loaded run {job.id} generation {job.run()['generation']} (exited)" in again.log()
    # positive control first: the node itself answers
    cap = job.mint("exec", job.run())
    r, _ = again.exec(job, "echo never", cap)
    assert r.status == 409 and r.json()["reason"] == "no_run", r
    # the control plane hears of it: the job failed (its exit status is unknown)
    j = job.wait_stage("ERROR")
    assert j["message"] == "the run ended while its node was down", j
    assert job.action("cancel").status == 202
    job.wait_stage("CANCELED")
    assert not os.path.exists(again.run_dir(job.id))


def test_node_keeps_serving_while_an_install_restores_a_large_root():
    """Installing a run prepares its root on a thread (here: fetching a moved 256 MiB root from
    the old node): the node forwards other runs' requests meanwhile."""
    p = Platform(nodes=("bg-a", "bg-b"))
    try:
        busy = p.create_on("bg-b")
        big = p.create_on("bg-a")
        big.sh("head -c 268435456 /dev/urandom > /root/big && echo done", timeout=120)
        g = big.run()["generation"]
        assert big.action("move", {"node": "bg-b"}).status == 202

        def installing():
            return big.inspect()["run"]["state"] == "installing"

        assert wait_until(installing, 30, 0.01), big.inspect()
        served_during = 0
        while installing():
            assert busy.sh("echo alive") == "alive\n"
            if installing():  # it was still restoring when that answer came back
                served_during += 1
        assert served_during >= 1, "no request was served while the install ran"
        big.wait_stage("RUNNING", generation=g + 1, node="bg-b", timeout=120)
        assert big.sh("wc -c < /root/big") == "268435456\n"
        # control: both jobs serve afterwards
        assert busy.sh("echo still") == "still\n"
    finally:
        p.stop()
