# SPDX-License-Identifier: MIT
"""`sbx up` and the default image `debian` when the node's images directory lacks it: `sbx up`
runs sbx-build-image (scripts/build-image.sh, looked for next to the sbx binary) with
`--out IMAGES --name debian`, its output in STATE/image.log, before it starts anything.

A real build (debootstrap, about 90 s) is too slow here, so:
- the real builder is run where it refuses at once (IMAGES/debian exists and is no image):
  `sbx up` must say the build failed and where its log is, and start nothing;
- a copy of sbx in a directory of the test's, with sbx-control and sbx-node beside it (links
  to the build's) and a stand-in builder (the real one's arguments, a prepared tiny OCI layout
  copied in, or a failure): sbx up builds once, the platform's sandboxes run in that image, a
  second up does not build again; with no builder beside it, or one that exits 0 but leaves no
  image, sbx up says what to do and starts nothing."""
import os
import shutil
import signal
import stat

import pytest

from conftest import BUILD, assert_no_sanitizer_report
from sbxplatform import IMAGE_AGENT_BIN
from test_cli import ID_RANGE, SBX, Up, alive
from test_platform_images import MOTD, make_layer, tiny_entries, write_layout


class ImageUp(Up):
    """An Up whose `sbx up` names no default image (so: debian) and may run another sbx."""

    def __init__(self, sbx=SBX):
        super().__init__()
        self.images = os.path.join(self.dir, "images")
        self.bin = sbx

    def up(self):
        return self.sbx("up", "--state", self.state, "--port", str(self.port), "--images",
                        self.images, "--id-range", ID_RANGE, timeout=90)

    def log(self):
        with open(os.path.join(self.state, "image.log"), errors="replace") as f:
            return f.read()

    def close(self):
        self.down()
        for name in ("sbx-node", "sbx-control"):
            p = self.pid(name)
            if p and alive(p):
                os.kill(p, signal.SIGKILL)
        try:
            for log in ("control.log", "node.log"):  # the daemons `sbx up` started, if any
                if os.path.exists(os.path.join(self.state, log)):
                    with open(os.path.join(self.state, log), errors="replace") as f:
                        assert_no_sanitizer_report(f.read())
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def assert_nothing_started(u, r):
    assert "started sbx-" not in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(u.state, "sbx-control.pid"))
    assert not os.path.exists(os.path.join(u.state, "control.log"))
    s = u.sbx("status", "--state", u.state)
    assert s.returncode == 4 and "control   stopped" in s.stdout, s


def test_up_reports_the_real_builder_failing_and_starts_nothing():
    u = ImageUp()
    try:
        os.makedirs(os.path.join(u.images, "debian"))  # in the way: the builder refuses
        r = u.up()
        assert r.returncode == 1, r.stdout + r.stderr
        log = os.path.join(u.state, "image.log")
        assert f"sbx: building the default image debian in {u.images} (" in r.stderr, r.stderr
        assert f"sbx: building the default image failed (see {log}); fix that and run sbx up " \
               "again, or start with --default-image host\n" in r.stderr, r.stderr
        # what failed is the real builder, run with the images directory and the name
        assert f"build-image: {u.images}/debian exists and is not an image named debian; " \
               "remove it first" in u.log(), u.log()
        assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
        assert_nothing_started(u, r)
        # positive control: with the default image set to host the same up starts
        r = u.sbx("up", "--state", u.state, "--port", str(u.port), "--images", u.images,
                  "--id-range", ID_RANGE, "--default-image", "host", timeout=90)
        assert r.returncode == 0 and "building" not in r.stderr, r.stdout + r.stderr
    finally:
        u.close()


BUILDER = """#!/bin/bash
# A stand-in for scripts/build-image.sh: the same arguments; {what}
set -euo pipefail
echo "stand-in $*" >> {calls}
[[ $# == 4 && $1 == --out && $3 == --name ]] || {{ echo "bad arguments: $*" >&2; exit 2; }}
{body}
"""


def bin_dir(top, builder_body=None):
    """A directory holding a copy of sbx (it looks next to itself for its daemons and the
    builder), a link to the build's sbx-control, a copy of its sbx-node with the static agent
    beside it (a node takes the agent next to itself; runs in an image need the static one,
    which the sanitizer build lacks), and a builder when given."""
    d = os.path.join(top, "bin")
    os.mkdir(d)
    shutil.copy2(SBX, os.path.join(d, "sbx"))
    os.symlink(os.path.join(BUILD, "sbx-control"), os.path.join(d, "sbx-control"))
    shutil.copy2(os.path.join(BUILD, "sbx-node"), os.path.join(d, "sbx-node"))
    shutil.copy2(IMAGE_AGENT_BIN, os.path.join(d, "sbx-server-static"))
    calls = os.path.join(top, "builder-calls")
    if builder_body is not None:
        path = os.path.join(d, "sbx-build-image")
        with open(path, "w") as f:
            f.write(BUILDER.format(what=builder_body[0], calls=calls, body=builder_body[1]))
        os.chmod(path, 0o755)
    return os.path.join(d, "sbx"), calls


def calls_of(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def test_up_builds_the_missing_default_image_once_and_runs_sandboxes_in_it():
    u = ImageUp()
    prepared = os.path.join(u.dir, "prepared")
    write_layout(prepared, "debian", [make_layer(tiny_entries())])
    body = ("a prepared tiny layout copied in",
            f'echo "stand-in: building $4 in $2"\nmkdir -p "$2"\n'
            f'cp -r {prepared}/debian "$2/$4"')
    u.bin, calls = bin_dir(u.dir, body)
    try:
        r = u.up()
        assert r.returncode == 0, r.stdout + r.stderr
        assert calls_of(calls) == [f"stand-in --out {u.images} --name debian"]
        assert f"sbx: building the default image debian in {u.images} (" in r.stderr, r.stderr
        assert "sbx: default image debian built in " in r.stderr, r.stderr
        assert r.stderr.index("built in") < r.stderr.index("started sbx-control"), r.stderr
        assert f"stand-in: building debian in {u.images}" in u.log()
        # a sandbox that names no image runs in it: the platform's default is that image
        sid = u.sbx("create", check=0).stdout.strip()
        job = u.sbx("jobs", "inspect", sid, check=0).stdout
        assert '"image": "debian"' in job, job
        out = os.path.join(u.dir, "motd")
        u.sbx("cp", f"{sid}:/etc/motd", out, check=0)
        with open(out, "rb") as f:
            assert f.read() == MOTD
        u.sbx("kill", sid, check=0)
        # down and up again: the image is there, nothing is built
        u.sbx("down", "--state", u.state, check=0)
        r = u.up()
        assert r.returncode == 0 and "building" not in r.stderr, r.stdout + r.stderr
        assert len(calls_of(calls)) == 1, calls_of(calls)
    finally:
        u.close()


@pytest.mark.parametrize("case", ["no-builder", "fails", "leaves-nothing"])
def test_up_says_what_to_do_when_the_build_cannot_give_an_image(case):
    u = ImageUp()
    body = {"no-builder": None,
            "fails": ("a failure", 'echo "stand-in: debootstrap failed" >&2\nexit 3'),
            "leaves-nothing": ("exits 0 and makes nothing", 'echo "stand-in: done"')}[case]
    u.bin, calls = bin_dir(u.dir, body)
    try:
        r = u.up()
        assert r.returncode == 1, r.stdout + r.stderr
        log = os.path.join(u.state, "image.log")
        if case == "no-builder":
            assert calls_of(calls) == []
            assert f"sbx: the default image debian is not in {u.images} and sbx-build-image is " \
                   f"not next to sbx ({os.path.dirname(u.bin)}): run scripts/build-image.sh, " \
                   "or start with --default-image host\n" in r.stderr, r.stderr
        else:
            assert calls_of(calls) == [f"stand-in --out {u.images} --name debian"]
        if case == "fails":
            assert f"building the default image failed (see {log})" in r.stderr, r.stderr
            assert "stand-in: debootstrap failed" in u.log()
        if case == "leaves-nothing":
            assert f"sbx: sbx-build-image exited 0 but {u.images}/debian/index.json is missing " \
                   f"(see {log})" in r.stderr, r.stderr
            assert "built in" not in r.stderr, r.stderr
        assert_nothing_started(u, r)
    finally:
        u.close()
