# SPDX-License-Identifier: MIT
"""A pooled sandbox's command that times out or is killed takes everything it started with it,
setsid() descendants included (a cgroup2 group per command, cgroup.kill); a command that ends
on its own leaves its background descendants alone until the sandbox is deleted (the positive
control: the same escapee, found alive, then gone with the sandbox). Commands one after another
share the sandbox's kept groups while they are left empty; a kill never reaches another
command's processes (a command takes a kept group only while no other command uses it and no
processes were left in it, else a group of its own)."""
import json
import os
import secrets
import subprocess
import time

import pytest

from conftest import wait_until


def alive_with_marker(uid, marker):
    """Processes of uid whose command line holds marker (read from the host's /proc)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                if not any(l.startswith("Uid:") and l.split()[1] == str(uid) for l in f):
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def escapee_cmd(marker):
    # a setsid() grandchild that leaves the command's process group, then a long wait
    return (f"setsid sh -c 'exec sleep 300 {marker}' </dev/null >/dev/null 2>&1 & "
            f"sleep 0.3; echo started; exec sleep 200")


def test_a_timed_out_command_takes_its_setsid_descendants(pool_host):
    sb = pool_host.sandbox()
    marker = "7" + str(secrets.randbelow(10**6))  # an argument sleep accepts: seconds
    res = sb.run(escapee_cmd(marker), timeout=1)
    assert res.exit and res.exit.get("timed_out") is True, res
    assert "started" in res.out
    assert wait_until(lambda: not alive_with_marker(sb.uid, marker), 5), \
        alive_with_marker(sb.uid, marker)
    sb.delete()


def test_a_killed_background_process_takes_its_setsid_descendants(pool_host):
    sb = pool_host.sandbox()
    marker = "8" + str(secrets.randbelow(10**6))
    p = sb.start(escapee_cmd(marker))
    assert wait_until(lambda: alive_with_marker(sb.uid, marker), 5)  # the escapee runs
    st, j = sb.json("DELETE", f"/processes/{p['id']}")
    assert st == 200, (st, j)
    assert wait_until(lambda: not alive_with_marker(sb.uid, marker), 5), \
        alive_with_marker(sb.uid, marker)
    sb.delete()


def cgroup2_dir(rel):
    """The host path of a cgroup2 group named as in /proc/<pid>/cgroup's "0::" line."""
    with open("/proc/self/mounts") as f:
        mnts = [l.split()[1] for l in f if l.split()[2] == "cgroup2"]
    for m in mnts:
        if os.path.isdir(m + rel):
            return m + rel
    return None


def own_group(sb):
    """The cgroup2 group (relative, as in /proc/PID/cgroup) a command of sb runs in."""
    res = sb.run("grep '^0::' /proc/self/cgroup | cut -d: -f3")
    rel = res.out.strip()
    assert res.code == 0 and rel.startswith("/"), res
    return rel


def group_of(pid):
    with open(f"/proc/{pid}/cgroup") as f:
        return next(l.split(":", 2)[2].strip() for l in f if l.startswith("0::"))


def procs_in(d):
    with open(d + "/cgroup.procs") as f:
        return f.read().split()


def test_commands_one_after_another_share_the_sandboxs_kept_groups(pool_host):
    sb = pool_host.sandbox()
    rel = own_group(sb)
    root_rel = os.path.dirname(rel)
    if cgroup2_dir(root_rel) is None:
        pytest.skip("no cgroup2 groups per command here")
    # the first kept group stays between commands, empty, and the next command joins it again
    assert os.path.basename(rel) == f"s{sb.uid}-k0", rel
    d = cgroup2_dir(rel)
    assert d is not None and procs_in(d) == []
    assert own_group(sb) == rel
    # while a background process holds it (its processes are in it: the positive control of
    # the empty check), the next command takes the second kept group, which stays too
    bg = [sb.start("exec sleep 30")]
    assert wait_until(lambda: procs_in(d) != [], 5)
    k1 = own_group(sb)
    assert k1 == f"{root_rel}/s{sb.uid}-k1", k1
    assert cgroup2_dir(k1) is not None and procs_in(cgroup2_dir(k1)) == []
    # with every kept group in use, a command gets a group of its own, removed when it ends
    bg += [sb.start("exec sleep 30") for _ in range(3)]
    for i in range(4):
        k = cgroup2_dir(f"{root_rel}/s{sb.uid}-k{i}")
        assert k is not None and wait_until(lambda: procs_in(k) != [], 5), i
    other = own_group(sb)
    assert not os.path.basename(other).startswith(f"s{sb.uid}-k"), other
    assert os.path.basename(other).startswith(f"s{sb.uid}-c"), other
    assert wait_until(lambda: cgroup2_dir(other) is None, 5), f"{other} is left"
    for p in bg:
        st, j = sb.json("DELETE", f"/processes/{p['id']}")
        assert st == 200, (st, j)
    assert wait_until(lambda: procs_in(d) == [], 5)
    assert wait_until(lambda: own_group(sb) == rel, 5)
    sb.delete()


def test_a_kill_never_reaches_another_commands_processes(pool_host):
    sb = pool_host.sandbox()
    if cgroup2_dir(os.path.dirname(own_group(sb))) is None:
        pytest.skip("no cgroup2 groups per command here")
    bg_marker = "6" + str(secrets.randbelow(10**6))
    bg = sb.start(f"exec sleep 300 {bg_marker}")  # holds the kept group
    assert wait_until(lambda: alive_with_marker(sb.uid, bg_marker), 5)
    marker = "5" + str(secrets.randbelow(10**6))
    res = sb.run(escapee_cmd(marker), timeout=1)
    assert res.exit and res.exit.get("timed_out") is True, res
    # the timed-out command's escapee went with it (positive control), the other command's
    # process did not
    assert wait_until(lambda: not alive_with_marker(sb.uid, marker), 5)
    assert alive_with_marker(sb.uid, bg_marker), "a kill reached another command's process"
    st, j = sb.json("DELETE", f"/processes/{bg['id']}")
    assert st == 200, (st, j)
    sb.delete()


def test_a_command_that_ends_leaves_its_escapee_until_the_sandbox_goes(pool_host):
    sb = pool_host.sandbox()
    rel = own_group(sb)
    marker = "9" + str(secrets.randbelow(10**6))
    res = sb.run(f"setsid sh -c 'exec sleep 300 {marker}' </dev/null >/dev/null 2>&1 & "
                 "sleep 0.3; echo done")
    assert res.code == 0 and "done" in res.out, res
    time.sleep(0.2)
    pids = alive_with_marker(sb.uid, marker)
    assert pids  # positive control: the escapee is there
    left = cgroup2_dir(group_of(pids[0]))
    if left:
        # The escapee kept its command's group (the sandbox's kept one): the next commands get
        # groups of their own, so that killing one of them cannot reach it.
        assert group_of(pids[0]) == rel
        later = own_group(sb)
        assert later != rel, "a command joined a group that another command's escapee is in"
        res = sb.run("sleep 30", timeout=1)
        assert res.exit and res.exit.get("timed_out") is True, res
        time.sleep(0.3)
        assert alive_with_marker(sb.uid, marker), "a later command's kill reached the escapee"
    sb.delete()
    assert not alive_with_marker(sb.uid, marker)
    if left:  # the delete removes the group the escapee kept
        assert not os.path.exists(left), f"the escapee's command group {left} outlived the delete"


def test_a_kept_group_with_processes_in_it_is_never_taken_over(pool_host):
    """A sandbox takes its uid's kept group over only when it is empty: one found with
    processes in it (none of its own: put there from the host) is refused, so that a kill of
    the sandbox's commands cannot reach them, and the sandbox's later commands use others."""
    a = pool_host.sandbox()
    root_rel = os.path.dirname(own_group(a))
    root = cgroup2_dir(root_rel)
    if root is None:
        pytest.skip("no cgroup2 groups per command here")
    b = pool_host.sandbox()  # nothing has run in it yet
    kept = f"{root}/s{b.uid}-k0"
    os.makedirs(kept, exist_ok=True)
    host = subprocess.Popen(["sleep", "300"])
    try:
        with open(kept + "/cgroup.procs", "w") as f:
            f.write(str(host.pid))
        st, ev = b.exec({"cmd": "sleep 30", "timeout": 1})
        text = json.dumps(ev)
        assert "cgroup" in text and "busy" in text, (st, ev)
        time.sleep(0.3)
        assert host.poll() is None, "the host's process in the group was killed"
        # the sandbox leaves that group alone from then on: its next command (positive
        # control: it runs, in another group) is killed without touching the host's process
        assert own_group(b) == f"{root_rel}/s{b.uid}-k1"
        res = b.run("sleep 30", timeout=1)
        assert res.exit and res.exit.get("timed_out") is True, res
        time.sleep(0.3)
        assert host.poll() is None, "a later command's kill reached the host's process"
        mnt = root[:len(root) - len(root_rel)]
        with open(mnt + "/cgroup.procs", "w") as f:
            f.write(str(host.pid))
    finally:
        host.kill()
        host.wait()
    a.delete()
    b.delete()
