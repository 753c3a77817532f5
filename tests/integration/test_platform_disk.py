# SPDX-License-Identifier: MIT
"""A run's disk: its root is a file system of the flavor's size (a sparse image on the node), so
a run that fills it gets ENOSPC and the node's disk is untouched; sparse files stay sparse
across pause, resume and a move to another node. Each refusal has a positive control."""
import os

import pytest

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
