# SPDX-License-Identifier: MIT
"""The lifecycle under faults, as an operator sees it (issue 10): installs that fail because a
node is briefly away are tried again with a backoff, from the same root, until the node is back.

- A resume during a short node outage does not burn its attempts and end in ERROR: the job
  waits (SCHEDULING, the cause and the next try in its message) and comes back RUNNING with
  its files when the node returns.
- A move to a node that has just crashed does not stick: it is tried again on that node (never
  the one it leaves) and completes, with the job's files, when the node is back.
- A retried install carries the same restore source: the files written before are there."""
import time

import pytest

from conftest import wait_until
from sbxplatform import Node, Platform


@pytest.fixture
def plat():
    p = Platform(nodes=("lc-a", "lc-b"))
    yield p
    p.stop()


def restart(plat, node):
    """The same node (name, state directory, port) as a new process, registered again."""
    before = node.log().count("registered with the control plane")
    again = Node(plat, node.name, plat.control.port, port=node.port)
    plat.nodes[plat.nodes.index(node)] = again
    assert wait_until(lambda: again.log().count("registered with the control plane") > before,
                      20), again.log()[-2000:]
    plat.wait_nodes_live()
    return again


def retrying(job, what):
    def ok():
        j = job.inspect()
        assert j["stage"] != "ERROR", f"{what}: the job ended in ERROR: {j['message']}"
        return j["stage"] == "SCHEDULING" and "trying again" in j["message"]
    return ok


def test_a_resume_during_a_short_node_outage_comes_back_with_its_files(plat):
    job = plat.create_on("lc-a")
    assert job.exec("echo kept > /root/kept.txt").code == 0
    r = job.action("pause")
    assert r.status == 202, r
    job.wait_stage("PAUSED")
    node = plat.node("lc-a")
    node.proc.stop()  # SIGTERM: the node is away; the control plane still counts it live
    r = job.action("resume")
    assert r.status == 202, r
    assert wait_until(retrying(job, "resume during an outage"), 10), job.inspect()
    time.sleep(3)  # several backoffs: the old code had burnt its three attempts by now
    j = job.inspect()
    assert j["stage"] != "ERROR", f"resume during an outage: the job ended in ERROR: {j['message']}"
    restart(plat, node)
    job.wait_stage("RUNNING", timeout=60)
    # on its own node again, or on the other one from the root kept on its own (it was away
    # when a try came round): either way with its files
    assert job.exec("cat /root/kept.txt").out == "kept\n", "the retried install lost the files"


def test_a_move_to_a_node_that_just_crashed_completes_when_it_is_back(plat):
    job = plat.create_on("lc-a")
    assert job.exec("echo moved > /root/moved.txt").code == 0
    g = job.inspect()["run"]["generation"]
    b = plat.node("lc-b")
    b.proc.proc.kill()  # SIGKILL; for a few seconds the control plane still lists it live
    b.proc.proc.wait()
    b.proc.crashed = False
    b.proc.stop()
    r = job.action("move", {"node": "lc-b"})
    assert r.status == 202, r
    assert wait_until(retrying(job, "move to a crashed node"), 10), job.inspect()
    restart(plat, b)
    job.wait_stage("RUNNING", timeout=60, node="lc-b")
    j = job.inspect()
    assert j["run"]["node"] == "lc-b" and j["run"]["generation"] > g, j
    assert job.exec("cat /root/moved.txt").out == "moved\n", "the moved root was lost"
