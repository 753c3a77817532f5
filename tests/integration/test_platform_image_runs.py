# SPDX-License-Identifier: MIT
"""Runs in the default image (scripts/build-image.sh: Debian minbase + python3), the platform's
own default: the image read-only and shared, seen through the run's id mapping (its root files
belong to the run's root), under a writable layer on the run's disk that pause keeps and move
carries; the host's copy of the image never changes. Needs the image built (scripts/test.sh
builds it first); without it these tests fail, they do not skip."""
import glob
import os
import re

import pytest

from sbxplatform import AGENT_PORT, Platform, connection, fresh_pubkey

IMAGES = os.environ.get("SBX_IMAGES", "/var/lib/sbx/images")


@pytest.fixture(scope="module")
def plat():
    assert os.path.exists(os.path.join(IMAGES, "debian", "index.json")), \
        f"no default image in {IMAGES}: run scripts/build-image.sh"
    p = Platform(nodes=("ir-n1", "ir-n2"), images={"ir-n1": IMAGES, "ir-n2": IMAGES},
                 default_image="debian")
    yield p
    p.stop()


def host_rootfs():
    found = glob.glob(os.path.join(IMAGES, ".rootfs", "*", "rootfs"))
    assert found, "the image was not unpacked"
    return found


def test_the_default_image_is_debian_with_python(plat):
    job = plat.create("ir", flavor="cpu-small")  # no image named: the platform's default
    assert job.inspect()["image"] == "debian"
    out = job.sh("grep ^VERSION_CODENAME /etc/os-release; python3 -c 'print(6*7)'; "
                 "stat -c '%u %g' /usr/bin/python3 /etc/passwd; id -u")
    assert out.splitlines() == ["VERSION_CODENAME=bookworm", "42", "0 0", "0 0", "0"], out
    job.cancel()


def test_writes_land_in_the_runs_layer_never_in_the_image(plat):
    job = plat.create_on("ir-n1", "ir", flavor="cpu-small")
    job.sh("echo layer > /usr/bin/sbx-probe && rm /etc/issue && echo changed >> /etc/hosts")
    assert job.sh("cat /usr/bin/sbx-probe; test -e /etc/issue || echo gone") == "layer\ngone\n"
    for rootfs in host_rootfs():  # the shared image on the host is untouched
        assert not os.path.exists(os.path.join(rootfs, "usr/bin/sbx-probe"))
        assert os.path.exists(os.path.join(rootfs, "etc/issue"))
        hosts = os.path.join(rootfs, "etc/hosts")  # the image ships none; the run made its own
        assert not os.path.exists(hosts) or "changed" not in open(hosts).read()
    node = job.node()
    upper = os.path.join(node.run_dir(job.id), "root", "upper")
    st = os.stat(os.path.join(upper, "usr/bin/sbx-probe"))  # the run's layer, on its disk
    assert st.st_uid == node.id_start or node.id_start <= st.st_uid < node.id_start + node.id_count
    # another run of the same image sees the image as shipped (positive control: same path)
    other = plat.create("ir", flavor="cpu-small")
    assert other.sh("test -e /usr/bin/sbx-probe || echo absent; test -e /etc/issue && echo issue"
                    ) == "absent\nissue\n"
    other.cancel()
    job.cancel()


def test_the_layer_moves_with_the_run_deletions_included(plat):
    job = plat.create_on("ir-n1", "ir", flavor="cpu-small")
    job.sh("mkdir -p /srv/data && echo kept > /srv/data/f && rm /etc/issue.net "
           "&& truncate -s 512M /srv/sparse")
    gen = job.inspect()["run"]["generation"]
    r = job.action("move", {"node": "ir-n2"})
    assert r.status == 202, r
    job.wait_stage("RUNNING", generation=gen + 1, node="ir-n2")
    out = job.sh("cat /srv/data/f; test -e /etc/issue.net || echo deleted; test -e /etc/issue "
                 "&& echo image; stat -c '%s %b' /srv/sparse; stat -c '%u %g' /srv/data/f")
    lines = out.splitlines()
    assert lines[:3] == ["kept", "deleted", "image"], out
    size, blocks = (int(x) for x in lines[3].split())
    assert size == 512 << 20 and blocks < 2048, out
    # the layer was unpacked onto the new node's block of ids: the run's root owns its files
    assert lines[4] == "0 0", out
    job.cancel()


def test_setuid_files_of_the_image_give_no_privilege(plat):
    job = plat.create("ir", flavor="cpu-small")
    out = job.sh("cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id && "
                 "stat -c %A /usr/local/bin/suid-id; stat -c %A /usr/bin/su; "
                 "grep NoNewPrivs /proc/self/status; "
                 "setpriv --reuid=65534 --regid=65534 --clear-groups /usr/local/bin/suid-id -u")
    lines = out.splitlines()
    assert lines[0] == "-rwsr-xr-x" and lines[1] == "-rwsr-xr-x", out  # the bits are there
    assert lines[2].split() == ["NoNewPrivs:", "1"], out
    assert lines[3] == "65534", out  # ... and they lift nobody to root
    job.cancel()


def test_a_pool_host_runs_in_the_image(plat):
    job = plat.create("ir", mode="pool", flavor="cpu-small")
    r = job.proxy("POST", AGENT_PORT, "/v1/sandboxes", body={"count": 1},
                  headers={"X-Sandbox-Token": job.token})
    assert r.status == 200, r
    sb = r.json()["sandboxes"][0]
    r = job.proxy("POST", AGENT_PORT, f"/v1/sandboxes/{sb['id']}/exec",
                  body={"cmd": "id -u; python3 -c 'print(2+2)'"},
                  headers={"X-Sandbox-Token": sb["token"]})
    out = r.text.replace('"}\n{"event":"stdout","data":"', "")
    m = re.search(r'"data":"(\d+)\\n4\\n"', out)
    # a sandbox uid of the run (20000..64999), and the image's python3
    assert r.status == 200 and m and 20000 <= int(m.group(1)) < 65000, r
    job.cancel()


def test_host_image_is_for_admins_and_unknown_images_are_refused(plat):
    tok = plat.request("POST", "/v1/tokens", {"principal": "tenant", "namespace": "ir",
                                              "role": "write"}).json()["token"]
    r = plat.request("POST", "/v1/jobs/ir", {"image": "host"}, token=tok)
    assert r.status == 403 and "admins" in r.text, r
    r = plat.request("POST", "/v1/jobs/ir", {"image": "no-such-image"}, token=tok)
    assert r.status == 400 and "not available on any node" in r.text, r
    r = plat.request("POST", "/v1/jobs/ir", {"image": "Bad/Name"}, token=tok)
    assert r.status == 400, r
    # positive controls: the tenant may run the default image; an admin may run "host"
    r = plat.request("POST", "/v1/jobs/ir", {"image": "debian", "flavor": "cpu-small"}, token=tok)
    assert r.status == 201, r
    plat.request("POST", f"/v1/jobs/ir/{r.json()['id']}/cancel")
    r = plat.request("POST", "/v1/jobs/ir", {"image": "host", "flavor": "cpu-small"})
    assert r.status == 201, r
    plat.request("POST", f"/v1/jobs/ir/{r.json()['id']}/cancel")


def test_a_flavor_whose_disk_is_below_the_image_is_refused(plat):
    """An image larger than a flavor's disk cannot run on it: 400 at create. The image here
    is one a (test-made) node reports, of 5 GiB unpacked; cpu-small has 4 GiB of disk."""
    import http.client
    import json as _json
    with open(plat.join_token_file) as f:
        token = f.read().strip().split(".")[1]
    body = {"name": "ir-fake", "url": "127.0.0.1:9", "capacity": 1, "tls_pubkey": fresh_pubkey(),
            "images": [{"name": "huge", "digest": "sha256:" + "ab" * 32, "size": 5 << 30}]}
    c = connection(plat.control.port, timeout=10)
    c.request("POST", "/v1/nodes/register", body=_json.dumps(body),
              headers={"Authorization": f"Bearer {token}"})
    resp = c.getresponse()
    reg = _json.loads(resp.read())
    assert resp.status in (200, 201), reg
    c.request("POST", "/v1/nodes/ir-fake/heartbeat", body=_json.dumps({"images": body["images"]}),
              headers={"Authorization": f"Bearer {reg['node_token']}"})
    resp = c.getresponse()
    resp.read()
    assert resp.status == 200
    c.close()
    r = plat.request("POST", "/v1/jobs/ir", {"image": "huge", "flavor": "cpu-small"})
    assert r.status == 400 and "smaller than image huge" in r.text, r
    # positive control: a flavor with room passes the check (and waits for its node)
    r = plat.request("POST", "/v1/jobs/ir", {"image": "huge", "flavor": "cpu-large"})
    assert r.status == 201, r
    plat.request("POST", f"/v1/jobs/ir/{r.json()['id']}/cancel")
