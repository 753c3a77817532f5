# SPDX-License-Identifier: MIT
"""The control plane crashes at a named step of a lifecycle transition (SBX_TEST_CRASH_AT=
control:<step>: the process ends with status 137 there, between a node's answer and the
store's record of it) and a new control process on the same store takes over.

After each: the job converges to the stage it should, with the files written before the fault,
on one run (the interrupted install's owner is gone, so it is tried again at once as the same
generation, from the same root; a pause or a cancel the node already did is idempotent)."""
import secrets

import pytest

from conftest import wait_until
from sbxplatform import Control, Job, Platform

STEPS = [
    ("create", "install:claimed"),
    ("create", "install:done"),
    ("resume", "install:claimed"),
    ("resume", "install:done"),
    ("move", "install:done"),
    ("pause", "pause:done"),
    ("cancel", "cancel:retired"),
]


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("cf-a", "cf-b"))
    yield p
    p.stop()


def swap_control(plat, env=None):
    """Stop the control process (or reap one that crashed) and start another on the same
    store and port."""
    old = plat.control
    if old.proc.alive():
        old.proc.stop()
    else:
        old.proc.proc.wait()
        old.proc.crashed = False  # we made it crash
        old.proc.stop()
    plat._retired.append(old)
    c = Control(plat, f"control-{len(plat._retired)}", plat.ctl_state, port=old.port, env=env)
    plat.controls[0] = plat.control = c
    return c


@pytest.mark.parametrize("action,step", STEPS, ids=[f"{a}-{s}" for a, s in STEPS])
def test_a_control_crash_converges(plat, action, step):
    job = None
    if action != "create":
        job = plat.create_on("cf-a")
        assert job.exec("echo before > /root/before.txt").code == 0
        if action == "resume":
            assert job.action("pause").status == 202
            job.wait_stage("PAUSED")
    gen = job.inspect()["run"]["generation"] if job else 0
    swap_control(plat, {"SBX_TEST_CRASH_AT": f"control:{step}"})
    ns = "cf" + secrets.token_hex(3)
    tok = secrets.token_hex(16)
    try:
        if action == "create":  # the answer may be cut: the job is found in the store after
            r = plat.request("POST", f"/v1/jobs/{ns}", {"secrets": {"SBX_TOKEN": tok}})
            assert r.status == 201, r
            job = Job(plat, ns, r.json(), tok)
        elif action == "move":
            job.action("move", {"node": "cf-b"})
        else:
            job.action(action)
    except OSError:
        pass  # the crash may cut the answer
    crashed = wait_until(lambda: not plat.control.proc.alive(), 20)
    assert crashed, f"the control plane never reached {step}:\n{plat.control.log()[-2000:]}"
    assert plat.control.proc.proc.returncode == 137
    swap_control(plat)
    if job is None:
        listed = plat.request("GET", f"/v1/jobs/{ns}").json()
        jobs = listed if isinstance(listed, list) else listed.get("jobs", [])
        assert len(jobs) == 1, listed
        job = Job(plat, ns, jobs[0], tok)
    want = {"create": "RUNNING", "resume": "RUNNING", "move": "RUNNING", "pause": "PAUSED",
            "cancel": "CANCELED"}[action]
    job.wait_stage(want, timeout=30)  # at once: not after a stale-install timeout (60 s)
    j = job.inspect()
    if action in ("resume", "move"):
        assert j["run"]["generation"] > gen, j
        assert job.exec("cat /root/before.txt").out == "before\n", \
            f"files written before the crash are lost ({action} at {step})"
    if action == "move":
        assert j["run"]["node"] == "cf-b", j
    if want == "RUNNING":
        node = plat.node(j["run"]["node"])
        rec = node.run_record(job.id)
        assert rec and rec["state"] == "running", rec
        assert job.exec("echo after").out == "after\n"
        other = plat.node("cf-b" if node.name == "cf-a" else "cf-a").run_record(job.id)
        assert not other or other["state"] != "running", \
            f"ORPHAN: a second run of the job runs on the other node: {other}"
    if action == "cancel":
        for n in plat.nodes:
            rec = n.run_record(job.id)
            assert not rec or rec["state"] != "running", f"ORPHAN: the canceled run runs: {rec}"
    if want != "CANCELED":
        job.cancel()
