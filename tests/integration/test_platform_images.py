# SPDX-License-Identifier: MIT
"""Images on the platform: OCI layouts a node verifies and unpacks (src/node/image.c), reports in
registration and heartbeats, and the control plane's refusal of jobs naming an image that no
live node offers.

The layouts are made here (tarfile + gzip + sha256, no debootstrap): a tiny image holding the
static agent binary from the build and a text file, and hostile or corrupted variants."""
import gzip
import hashlib
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile

import pytest

from conftest import wait_until
from sbxplatform import AGENT_BIN, Platform

MOTD = b"hello from the tiny image\n"


def _digest(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def make_layer(entries):
    """entries: (path, bytes | None for a directory | ("symlink", target) | ("chr",)).
    Returns (gzip'd blob, diff_id, regular files' total size)."""
    buf = io.BytesIO()
    size = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for path, data in entries:
            ti = tarfile.TarInfo(path)
            ti.mtime = 1700000000
            if data is None:
                ti.type, ti.mode = tarfile.DIRTYPE, 0o755
                t.addfile(ti)
            elif isinstance(data, tuple) and data[0] == "symlink":
                ti.type, ti.linkname = tarfile.SYMTYPE, data[1]
                t.addfile(ti)
            elif isinstance(data, tuple) and data[0] == "chr":
                ti.type, ti.devmajor, ti.devminor, ti.mode = tarfile.CHRTYPE, 1, 1, 0o666
                t.addfile(ti)
            else:
                ti.size, ti.mode = len(data), 0o755 if path.endswith("-static") else 0o644
                size += len(data)
                t.addfile(ti, io.BytesIO(data))
    raw = buf.getvalue()
    return gzip.compress(raw, mtime=0), _digest(raw), size


def write_layout(images, name, layers):
    """An OCI image layout images/name with these layers ([(blob, diff_id, size)]); returns the
    manifest digest and the layer digests."""
    d = os.path.join(images, name)
    blobs = os.path.join(d, "blobs", "sha256")
    os.makedirs(blobs)

    def put(data):
        dg = _digest(data)
        with open(os.path.join(blobs, dg[7:]), "wb") as f:
            f.write(data)
        return dg

    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers",
                                    "diff_ids": [l[1] for l in layers]}}).encode()
    ldesc = [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": put(l[0]),
              "size": len(l[0])} for l in layers]
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": put(config), "size": len(config)},
        "layers": ldesc}).encode()
    mdg = put(manifest)
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
             "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                            "digest": mdg, "size": len(manifest),
                            "annotations": {"org.opencontainers.image.ref.name": name}}]}
    with open(os.path.join(d, "index.json"), "w") as f:
        json.dump(index, f)
    with open(os.path.join(d, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion":"1.0.0"}')
    return mdg, [x["digest"] for x in ldesc]


def flip_byte(images, name, digest):
    p = os.path.join(images, name, "blobs", "sha256", digest[7:])
    with open(p, "r+b") as f:
        f.seek(os.path.getsize(p) // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 1]))


def tiny_entries(extra=b""):
    with open(AGENT_BIN, "rb") as f:
        agent = f.read()
    return [("./", None), ("etc/", None), ("etc/motd", MOTD + extra), ("bin/", None),
            ("bin/sbx-server-static", agent)]


@pytest.fixture(scope="module")
def env():
    images = tempfile.mkdtemp(prefix="sbx-imgs-")
    made = {}
    layer = make_layer(tiny_entries())
    made["tiny"] = (write_layout(images, "tiny", [layer]), layer[2])
    # a corrupted blob: one byte of its layer changed after the layout was written
    bad = make_layer(tiny_entries(b"broken\n"))
    mdg, ldg = write_layout(images, "broken", [bad])
    flip_byte(images, "broken", ldg[0])
    # layers the unpacker refuses
    write_layout(images, "escape", [make_layer([("etc/ok", b"x"), ("../../../escaped", b"x")])])
    write_layout(images, "devnode", [make_layer([("dev/", None), ("dev/mem", ("chr",))])])
    p = Platform(nodes=("img-a", "img-b"), images={"img-a": images})
    try:
        yield p, images, made
    finally:
        p.stop()
        shutil.rmtree(images, ignore_errors=True)


def node_rec(p, name):
    r = p.request("GET", "/v1/nodes")
    assert r.status == 200, r
    return next(n for n in r.json() if n["name"] == name)


def reported(p, node):
    return {i["name"]: i for i in node_rec(p, node).get("images", [])}


def test_node_reports_the_images_it_verified(env):
    p, images, made = env
    (mdg, _), size = made["tiny"]
    got = reported(p, "img-a")
    assert set(got) == {"tiny"}, got  # broken, escape and devnode are not offered
    assert got["tiny"]["digest"] == mdg
    assert got["tiny"]["size"] == size
    assert reported(p, "img-b") == {}  # a node with no images reports none
    log = p.node("img-a").log()
    assert "image broken: blob" in log and "does not match its digest" in log, log
    assert "image escape: layer 0: entry \"../../../escaped\"" in log, log
    assert "image devnode: layer 0: entry \"dev/mem\": device node" in log, log
    # the unpacked rootfs: the image's files, in a cache only root can enter
    rootfs = os.path.join(images, ".rootfs", mdg[7:], "rootfs")
    with open(os.path.join(rootfs, "etc", "motd"), "rb") as f:
        assert f.read() == MOTD
    assert os.access(os.path.join(rootfs, "bin", "sbx-server-static"), os.X_OK)
    assert stat.S_IMODE(os.stat(os.path.join(images, ".rootfs")).st_mode) == 0o700
    assert not os.path.exists(os.path.join(os.path.dirname(images), "escaped"))


@pytest.mark.parametrize("image", ["nosuch", "broken", "escape", "devnode"])
def test_a_job_naming_an_image_no_node_offers_is_refused(env, image):
    p, _, _ = env
    r = p.request("POST", "/v1/jobs/t", {"image": image, "command": ["true"]})
    assert r.status == 400, r
    assert r.json()["error"] == f"create: image {image}: not available on any node", r


def test_a_bad_image_name_is_refused(env):
    p, _, _ = env
    for bad in ["Tiny", "../tiny", "", ".rootfs", "a" * 64]:
        r = p.request("POST", "/v1/jobs/t", {"image": bad, "command": ["true"]})
        assert r.status == 400 and "image:" in r.json()["error"], (bad, r)


def test_a_job_naming_an_offered_image_is_placed_on_a_node_that_has_it(env):
    p, _, _ = env
    jobs = [p.create(image="tiny") for _ in range(3)]
    for j in jobs:
        assert j.inspect()["image"] == "tiny"
        assert j.inspect()["run"]["node"] == "img-a"  # img-b does not offer it
    for j in jobs:
        j.cancel()
    # "host" stays accepted, on any node
    assert p.create(image="host").cancel()["image"] == "host"


def test_images_added_or_corrupted_while_the_node_runs(env):
    p, images, made = env
    layer = make_layer([("etc/late", b"late\n")])
    mdg, _ = write_layout(images, "late", [layer])
    assert wait_until(lambda: reported(p, "img-a").get("late", {}).get("digest") == mdg, 20), \
        reported(p, "img-a")
    assert p.create(image="late").cancel()["image"] == "late"
    # its manifest changes on disk: the node stops offering it, jobs naming it are refused
    flip_byte(images, "late", mdg)
    assert wait_until(lambda: "late" not in reported(p, "img-a"), 20), reported(p, "img-a")
    r = p.request("POST", "/v1/jobs/t", {"image": "late", "command": ["true"]})
    assert r.status == 400 and "image late: not available on any node" in r.text, r
    assert "tiny" in reported(p, "img-a")  # the others stay
