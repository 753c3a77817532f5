# SPDX-License-Identifier: MIT
"""Signing-key rotation with overlap, and two control processes sharing one store.

Rotation: requests through the edge keep working across a rotation; the nodes receive the new
public key before it signs anything; capabilities signed with the old key stay valid for their
lifetime. Replicas: two sbx-control processes on one SQLite store each create jobs; the run
record's compare-and-swap makes every job's generation 1 be installed exactly once."""
import time

import pytest

from conftest import wait_until
from sbxplatform import Platform

PUBLISH_DELAY_MS = 1500  # a rotated key signs from 2 s on (rounded up to whole seconds)



@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("keys-n1",), publish_delay_ms=PUBLISH_DELAY_MS)
    yield p
    p.stop()


def rotate(plat):
    r = plat.request("POST", "/v1/admin/keys/rotate", {})
    assert r.status == 200, r
    keys = r.json()["keys"]
    new = [k for k in keys if k["retired"] == 0]
    old = [k for k in keys if k["retired"] != 0]
    assert len(new) == 1 and len(old) >= 1, keys
    new = new[0]
    assert all(k["kid"] != new["kid"] for k in old)
    assert new["activate"] > new["created"], keys  # published before it signs
    assert any(k["retired"] == new["activate"] for k in old), keys  # the old one signs until then
    return new, old


def test_key_rotation_through_the_edge(plat):
    """Rotate, keep using the edge across publication and activation; the node holds the new
    public key, and a capability signed by the old key (still the signer right after the
    rotation call) keeps working after the new key took over. Nothing outside the control
    opens the store before the rotation here: see test_old_key_capability_survives_rotation."""
    job = plat.create("k")
    node = job.node()
    assert job.sh("echo before") == "before\n"
    rotated_at = time.time()
    new, old = rotate(plat)
    # A capability signed with the old key while it is still the signer (what the control
    # issued just before the rotation took effect).
    run = job.run()
    old_kid = next(k["kid"] for k in old if k["retired"] == new["activate"])
    cap_old = plat.mint(run, "exec", kid=old_kid)
    r, res = node.exec(job, "echo old-key", cap_old)
    assert r.status == 200 and res.out == "old-key\n", (r, res)

    # Requests through the edge keep succeeding while the new key is published, then used.
    n = 0
    deadline = time.time() + max(new["activate"] - rotated_at, 0) + 2.5
    while time.time() < deadline:
        res = job.exec(f"echo {n}")
        assert res.code == 0 and res.out == f"{n}\n", (n, res)
        n += 1
    assert n >= 10
    assert time.time() > new["activate"] + 1  # the control signs with the new key by now

    # The node holds the new public key: a capability minted with it works.
    cap_new = plat.mint(run, "exec", kid=new["kid"])
    ok = wait_until(lambda: node.exec(job, "echo new-key", cap_new)[0].status == 200, 5, 0.1)
    r, res = node.exec(job, "echo new-key", cap_new)
    assert ok and r.status == 200 and res.out == "new-key\n", (r, res)
    # The old key's capability still works after the new key took over (overlap).
    r, res = node.exec(job, "echo old-key-again", cap_old)
    assert r.status == 200 and res.out == "old-key-again\n", (r, res)
    # negative control: a key id no node was ever given is refused
    r, _ = node.exec(job, "true", plat.mint(run, "exec", forge=True, kid="k-unpublished"))
    assert r.status == 403 and r.json()["reason"] == "unknown_key", r
    job.cancel()


def test_old_key_capability_survives_rotation():
    p = Platform(nodes=("keys-n2",), publish_delay_ms=PUBLISH_DELAY_MS)
    try:
        job = p.create("k")
        node = job.node()
        run = job.run()
        cap_old = job.mint("exec", run)  # signed by the key in use before the rotation
        r, res = node.exec(job, "echo old-key", cap_old)
        assert r.status == 200 and res.out == "old-key\n", (r, res)
        new, _ = rotate(p)
        assert wait_until(lambda: time.time() > new["activate"] + 0.5, 5)
        assert job.sh("echo edge") == "edge\n"  # the control signs with the new key
        # The capability signed with the old key before the rotation still works.
        r, res = node.exec(job, "echo old-key-again", cap_old)
        assert r.status == 200 and res.out == "old-key-again\n", (r, res)
        # ... and so does one minted with the new key (the node received it).
        cap_new = p.mint(run, "exec", kid=new["kid"])
        ok = wait_until(lambda: node.exec(job, "true", cap_new)[0].status == 200, 5, 0.1)
        assert ok, node.exec(job, "true", cap_new)[0]
        job.cancel()
    finally:
        p.stop()


# ---- two control processes, one store ---------------------------------------------------------

def test_two_controls_install_each_generation_once():
    p = Platform(nodes=(), controls=2)
    try:
        c0, c1 = p.controls
        assert c0.port != c1.port
        jobs = []
        # Five jobs while no node exists: both reconcilers wait on them, then race when the
        # node arrives; five more through both controls once it is live.
        for i in range(5):
            jobs.append(p.create("rep", wait=False, control=p.controls[i % 2],
                                 labels={"n": str(i)}))
        time.sleep(1.2)  # both reconcilers have passed over them at least once
        for j in jobs:
            assert j.inspect()["stage"] == "SCHEDULING"
        node = p.add_node("rep-n1")
        for i in range(5, 10):
            jobs.append(p.create("rep", wait=False, control=p.controls[i % 2],
                                 labels={"n": str(i)}))
        for j in jobs:
            j.wait_stage("RUNNING", timeout=30)
        time.sleep(1.5)  # a late second install would show up by now
        node_log = node.log()
        ctl_logs = c0.log() + c1.log()
        for j in jobs:
            a, b = j.inspect(control=c0), j.inspect(control=c1)
            assert a["run"] == b["run"] and a["run"]["generation"] == 1, (a, b)
            assert node_log.count(f"installed run {j.id} generation 1 ") == 1, node_log
            assert node_log.count(f"installed run {j.id} ") == 1, node_log
            assert ctl_logs.count(f"job rep/{j.id}: generation 1 running on") == 1, ctl_logs
        # both controls serve every job, whichever created it
        for i, j in enumerate(jobs[:4]):
            assert j.sh(f"echo {i}", control=p.controls[(i + 1) % 2]) == f"{i}\n"
        for j in jobs:
            j.cancel()
    finally:
        p.stop()


def test_restarted_replica_sees_the_other_replicas_writes():
    """Two controls on one store; one restarts. Everything the other wrote since must be there
    for the restarted one (and after both restart)."""
    p = Platform(nodes=("rep-n2",), controls=2)
    try:
        before = p.create("rep2")  # positive control: written before the restart
        p.restart_control(1)
        assert p.request("GET", before.path(), control=p.controls[1]).status == 200
        after = p.create("rep2")  # through control 0, after control 1 restarted
        r = p.request("GET", after.path(), control=p.controls[1])
        assert r.status == 200, r
        assert r.json()["stage"] == "RUNNING", r
        p.restart_control(0)
        r = p.request("GET", after.path(), control=p.controls[0])
        assert r.status == 200, r
        before.cancel()
        after.cancel()
    finally:
        p.stop()
