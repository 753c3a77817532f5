# SPDX-License-Identifier: MIT
"""Two `sbx up` at once on one state directory start one platform: the second waits for the
first (<state>/up.lock) and then finds it running."""
import os
import shutil
import signal
import subprocess

from test_cli import ID_RANGE, SBX, Up, alive


def daemons_of(state, name):
    """Pids of live processes running `name` with `state` in their command line."""
    pids = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            exe = os.path.basename(os.readlink(f"/proc/{p}/exe"))
            with open(f"/proc/{p}/cmdline", "rb") as f:
                cmd = f.read().decode(errors="replace")
        except OSError:
            continue
        if exe == name and state in cmd and alive(int(p)):
            pids.append(int(p))
    return pids


def test_two_ups_at_once_start_one_platform():
    u = Up()
    argv = [SBX, "up", "--state", u.state, "--port", str(u.port), "--default-image", "host",
            "--images", os.path.join(u.dir, "images"), "--id-range", ID_RANGE]
    try:
        procs = [subprocess.Popen(argv, env=u.env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        err = "".join(o[1] for o in outs)
        assert err.count("started sbx-control") == 1 and err.count("started sbx-node") == 1, outs
        assert any("already running" in o[0] for o in outs), outs  # the other found it up
        assert len(daemons_of(u.state, "sbx-control")) == 1, outs
        assert len(daemons_of(u.state, "sbx-node")) == 1, outs
        # positive control: the platform the pair started works
        r = u.sbx("status", "--state", u.state)
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        u.down()
        for name in ("sbx-node", "sbx-control"):
            for p in daemons_of(u.state, name):
                os.kill(p, signal.SIGKILL)
        shutil.rmtree(u.dir, ignore_errors=True)
