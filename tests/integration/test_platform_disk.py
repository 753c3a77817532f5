# SPDX-License-Identifier: MIT
"""A run's disk: its root is a file system of the flavor's size (a sparse image on the node), so
a run that fills it gets ENOSPC and the node's disk is untouched; sparse files stay sparse
across pause, resume and a move to another node; a run that failed to start lets go of its
disk (loop device and mount) at once and of its directory when cancelled; a run is placed only
on a node whose disk has room for its flavor's disk. Each refusal has a positive control."""
import glob
import os
import secrets
import signal
import subprocess
import time

import pytest

from conftest import wait_until
from sbxplatform import Platform


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("dk-n1", "dk-n2"))
    yield p
    p.stop()


def du_bytes(path):
    st = os.stat(path)
    return st.st_blocks * 512


def test_a_run_cannot_take_more_than_its_flavors_disk(plat):
    job = plat.create("dk", flavor="cpu-small")  # 4096 MiB of disk
    node = job.node()
    img = os.path.join(node.run_dir(job.id), "disk.img")
    assert os.path.getsize(img) == 4096 << 20
    # positive control: 1 GiB fits; 128 MiB written take real space on the node
    before = du_bytes(img)
    res = job.exec("fallocate -l 1G /root/big && stat -c %s /root/big && "
                   "dd if=/dev/zero of=/root/w bs=1M count=128 conv=fsync 2>/dev/null && echo ok")
    assert res.code == 0 and res.out.split() == [str(1 << 30), "ok"], res
    assert du_bytes(img) >= before + (128 << 20)
    job.sh("rm /root/big /root/w")
    # 5 GiB does not fit, whatever the node's own free space (here far more than that) ...
    st = os.statvfs(node.state)
    assert st.f_bavail * st.f_frsize > 6 << 30
    res = job.exec("fallocate -l 5G /root/huge")
    assert res.code != 0 and "No space left on device" in res.err, res
    # ... and writing past what is left fails the same way
    res = job.exec("fallocate -l 4000M /root/most && "
                   "dd if=/dev/zero of=/root/fill bs=1M count=256 conv=fsync")
    assert res.code != 0 and "No space left on device" in res.err, res
    assert du_bytes(img) <= (4096 << 20) + (64 << 20), du_bytes(img)
    job.sh("rm -f /root/most /root/fill")
    job.cancel()


def test_the_run_does_not_see_its_disk_image_or_the_nodes_mounts(plat):
    job = plat.create("dk", flavor="cpu-small")
    res = job.exec("cat /proc/self/mountinfo; ls -la /; df / | tail -1")
    assert "disk.img" not in res.out and job.node().state not in res.out, res
    assert res.code == 0 and "/dev/loop" in res.out  # its root is the loop-mounted disk
    job.cancel()


def test_sparse_files_stay_sparse_across_pause_and_move(plat):
    job = plat.create_on("dk-n1", "dk", flavor="cpu-small")
    job.sh("truncate -s 1G /root/sparse && echo tail >> /root/sparse && sync")
    j = job.inspect()
    gen = j["run"]["generation"]
    r = job.action("move", {"node": "dk-n2"})
    assert r.status == 202, r
    job.wait_stage("RUNNING", generation=gen + 1, node="dk-n2")
    out = job.sh("stat -c '%s %b %B' /root/sparse; tail -c 5 /root/sparse")
    size, blocks, bsize = (int(x) for x in out.splitlines()[0].split())
    assert size == (1 << 30) + 5, out
    assert blocks * bsize < 1 << 20, out  # still sparse on the new node
    assert out.splitlines()[1] == "tail"
    img = os.path.join(job.node().run_dir(job.id), "disk.img")
    assert du_bytes(img) < 256 << 20, du_bytes(img)  # the move did not write the hole out
    job.cancel()


# ---- a run that failed to start keeps nothing of the node's ----------------------------------

# A command that listens on the bridge itself (fd 3) but is not the agent: the node refuses it
# while its process is alive (the install stops it), unlike a command that exits at once.
NOT_THE_AGENT = ("import socket, time\n"
                 "s = socket.socket(fileno=3)\n"
                 "s.listen(16)\n"
                 "time.sleep(60)\n")


def disk_holds(under, ids):
    """(loop devices, mounts) of the host's mount namespace under `under` (the platform's
    directory), in all and for the runs of the job ids `ids` (their directories or trash)."""
    loops, mounts = [], []
    for f in glob.glob("/sys/block/loop*/loop/backing_file"):
        try:
            with open(f) as fh:
                back = fh.read().strip()
        except OSError:
            continue  # detached meanwhile
        if back.startswith(under + "/"):
            loops.append(back)
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            mp = line.split()[4]
            if mp.startswith(under + "/"):
                mounts.append(mp)

    def mine(paths):
        return [p for p in paths if any(f"/{i}/" in p or f"-{i}-" in p for i in ids)]
    return len(loops), len(mounts), len(mine(loops)), len(mine(mounts))


def test_runs_that_fail_to_start_or_exit_let_go_of_their_disks(plat):
    """Jobs whose command exits at once (or is refused by the bridge while it runs) end in
    ERROR; their runs' disks are unmounted and their loop devices released at once, and
    cancelling the jobs removes their run directories. A job that runs holds its disk until it
    is cancelled (the positive control)."""
    under = plat.dir
    base = disk_holds(under, [])
    ok = plat.create("dk", flavor="cpu-small")
    node = ok.node()
    root = os.path.join(node.run_dir(ok.id), "root")
    # positive control: a running job's disk is loop-attached and mounted on its root
    held = wait_until(lambda: disk_holds(under, [ok.id])[2:] == (1, 1), 10)
    assert held, f"the running job's disk is not mounted: {disk_holds(under, [ok.id])}"
    assert os.path.ismount(root)
    running = disk_holds(under, [ok.id])
    failed = [plat.create("dk", wait=False, flavor="cpu-small", command=["/bin/true"])
              for _ in range(5)]
    failed += [plat.create("dk", wait=False, flavor="cpu-small",
                           command=["/usr/bin/python3", "-c", NOT_THE_AGENT])
               for _ in range(2)]
    ids = [j.id for j in failed]
    for j in failed:
        st = j.wait_stage("ERROR", timeout=30)
        assert "install failed" in st["message"], st
    for j in failed[:5]:
        msg = j.inspect()["message"]  # the exit is seen before or after the install began
        assert "exited during start" in msg or "exited at once" in msg, msg
    for j in failed[5:]:
        assert "another executable" in j.inspect()["message"]
    # the node keeps each failed run's record and log, but none of its mounts
    dirs = [n.run_dir(i) for i in ids for n in plat.nodes if os.path.isdir(n.run_dir(i))]
    assert len(dirs) == len(ids), (dirs, ids)
    for d in dirs:
        assert os.path.exists(os.path.join(d, "log")), d
    now = wait_until(lambda: (lambda h: h if h[2:] == (0, 0) else None)(disk_holds(under, ids)),
                     10, 0.1)
    holds = disk_holds(under, ids)
    assert now, (f"LEAK: runs that failed to start keep {holds[2]} loop devices and {holds[3]} "
                 f"mounts of the node after ERROR")
    assert wait_until(lambda: disk_holds(under, [ok.id]) == running, 10), \
        (disk_holds(under, [ok.id]), running)
    # cancelling them removes their directories (trashed, then removed) and holds nothing
    for j in failed:
        assert j.action("cancel").status == 202
    for j in failed:
        j.wait_stage("CANCELED", timeout=30)
    gone = wait_until(lambda: not any(os.path.exists(n.run_dir(i)) for i in ids
                                      for n in plat.nodes) and
                      not any(f"-{i}-" in e for n in plat.nodes
                              for e in os.listdir(os.path.join(n.state, "runs")) for i in ids),
                      15, 0.1)
    assert gone, ("LEAK: cancelled failed runs keep their directories: " +
                  repr([os.listdir(os.path.join(n.state, "runs")) for n in plat.nodes]))
    assert disk_holds(under, ids)[2:] == (0, 0), disk_holds(under, ids)
    # a run that ran and then exited (its pid 1 killed from the host) lets go of its disk
    # too, before anyone cancels its job
    ended = plat.create("dk", flavor="cpu-small")
    enode = ended.node()
    assert disk_holds(under, [ended.id])[2:] == (1, 1), disk_holds(under, [ended.id])
    os.kill(enode.run_record(ended.id)["pid"], signal.SIGKILL)
    assert wait_until(lambda: (enode.run_record(ended.id) or {}).get("state") == "exited", 10)
    now = wait_until(lambda: disk_holds(under, [ended.id])[2:] == (0, 0), 10, 0.1)
    assert now, (f"LEAK: a run that exited keeps its disk mounted: "
                 f"{disk_holds(under, [ended.id])}")
    r = ended.action("cancel")
    assert r.status == 202, r
    ended.wait_stage("CANCELED")
    # the positive control still holds its disk, and lets go of it when cancelled
    assert os.path.ismount(root)
    ok.cancel()
    back = wait_until(lambda: disk_holds(under, [])[:2] == base[:2], 15, 0.1)
    assert back, (f"the node's loop devices and mounts did not return to what they were: "
                  f"{disk_holds(under, [])[:2]} != {base[:2]}")


# ---- placement by disk -------------------------------------------------------------------------

def test_runs_are_placed_only_where_their_flavors_disk_fits():
    """A node reports the room its disk has for runs' disks (free space less 256 MiB, times
    --disk-overcommit, less what every run's disk may still grow into); the control plane
    places a run only where its flavor's disk fits, and the node itself refuses (507) an
    install whose disk does not. Here the node's state is a 9 GiB tmpfs and it runs with
    --disk-overcommit 1: two cpu-small runs (4 GiB disks) fit, a third waits until one is
    cancelled (the positive control), and a direct install of a 4 GiB disk is refused while
    one of 128 MiB is taken. A node with the default promises four times its free space."""
    p = Platform(nodes=())
    try:
        state = os.path.join(p.dir, "dk-tight")
        os.makedirs(state)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=9g,mode=0700", "sbx-test-tight",
                        state], check=True)
        node = p.add_node("dk-tight", args=["--disk-overcommit", "1"])

        def room(name="dk-tight"):
            rec = [x for x in p._nodes_json() if x["name"] == name]
            return rec[0].get("disk_room_mb") if rec else None
        assert wait_until(lambda: (room() or 0) > 8 << 10, 10), room()
        empty = room()
        a = p.create("dk", flavor="cpu-small")
        b = p.create("dk", flavor="cpu-small")
        assert wait_until(lambda: room() is not None and room() < 4096, 10), \
            f"OVERCOMMIT: the node reports {room()} MiB of room with two 4 GiB disks on 9 GiB"
        assert 0 <= room() < 1024, room()  # 9 GiB - 256 MiB - 2 x (4 GiB - what mkfs wrote)
        assert node.health()["disk_room_mb"] == room() or abs(
            node.health()["disk_room_mb"] - room()) < 64
        # the control plane does not place a third: it waits, and the node hears of nothing
        c = p.create("dk", wait=False, flavor="cpu-small")
        waiting = wait_until(lambda: "4096 MiB of disk" in c.inspect().get("message", ""), 10)
        assert waiting, f"OVERCOMMIT: the control plane placed a run past the disk: {c.inspect()}"
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            j = c.inspect()
            assert "4096 MiB of disk" in j.get("message", "") and (
                j.get("run") or {}).get("state") != "running", \
                f"OVERCOMMIT: the control plane placed a run past the disk: {j}"
            time.sleep(0.1)
        assert not os.path.exists(node.run_dir(c.id))
        # the node refuses such an install itself (a control plane whose view is stale)
        tag = secrets.token_hex(4)
        direct = dict(a.run(), sandbox=f"dk-direct-{tag}", generation=1,
                      activation=f"a-d{tag}", instance=f"i-d{tag}")
        target = f"/v1/runs/{direct['sandbox']}"
        body = {"secrets": {"SBX_TOKEN": "x" * 32}}  # no flavor: the node's default, 4 GiB
        r = node.request("PUT", target, p.mint(direct, "manage", method="PUT", target=target,
                                                body=body), body)
        assert r.status == 507 and "room for" in r.text and "4096 MiB" in r.text, \
            f"OVERCOMMIT: the node installed a disk past its room: {r}"
        assert not os.path.exists(node.run_dir(direct["sandbox"]))
        # positive control: a disk that fits is installed
        body = {"flavor": {"disk_mb": 128}, "secrets": {"SBX_TOKEN": "x" * 32}}
        r = node.request("PUT", target, p.mint(direct, "manage", method="PUT", target=target,
                                                body=body), body)
        assert r.status == 201, r
        r = node.request("DELETE", target, p.mint(direct, "manage", method="DELETE",
                                                  target=target, body=""))
        assert r.status in (200, 204), r
        # positive control: once a is cancelled, c is placed there and runs
        a.cancel()
        c.wait_stage("RUNNING", timeout=30, node="dk-tight")
        assert c.sh("echo placed") == "placed\n"
        b.cancel()
        c.cancel()
        # by default (--disk-overcommit 4) the same disk promises four times as much
        loose = os.path.join(p.dir, "dk-loose")
        os.makedirs(loose)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=9g,mode=0700", "sbx-test-loose",
                        loose], check=True)
        p.add_node("dk-loose", args=[])
        assert wait_until(lambda: room("dk-loose") is not None, 10)
        assert abs(room("dk-loose") - 4 * empty) < 64, (room("dk-loose"), empty)
    finally:
        p.stop()
