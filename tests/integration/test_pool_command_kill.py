# SPDX-License-Identifier: MIT
"""A pooled sandbox's command that times out or is killed takes everything it started with it,
setsid() descendants included (a cgroup2 group per command, cgroup.kill); a command that ends
on its own leaves its background descendants alone until the sandbox is deleted (the positive
control: the same escapee, found alive, then gone with the sandbox)."""
import os
import secrets
import time

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


def test_a_command_that_ends_leaves_its_escapee_until_the_sandbox_goes(pool_host):
    sb = pool_host.sandbox()
    # a command that ends with nothing left: its own group goes with it
    res = sb.run("grep '^0::' /proc/self/cgroup | cut -d: -f3")
    rel = res.out.strip()
    assert res.code == 0 and rel.startswith("/"), res
    if cgroup2_dir(os.path.dirname(rel)) is not None:  # where cgroup2 groups per command exist
        # removed once the server is done with the command (just after its answer is written)
        assert wait_until(lambda: cgroup2_dir(rel) is None, 5), \
            f"the ended command's group {rel} is left"
    marker = "9" + str(secrets.randbelow(10**6))
    res = sb.run(f"setsid sh -c 'exec sleep 300 {marker}' </dev/null >/dev/null 2>&1 & "
                 "sleep 0.3; echo done")
    assert res.code == 0 and "done" in res.out, res
    time.sleep(0.2)
    pids = alive_with_marker(sb.uid, marker)
    assert pids  # positive control: the escapee is there
    with open(f"/proc/{pids[0]}/cgroup") as f:
        rel = next(l.split(":", 2)[2].strip() for l in f if l.startswith("0::"))
    left = cgroup2_dir(rel)
    sb.delete()
    assert not alive_with_marker(sb.uid, marker)
    if left:  # the escapee kept its command's group; the delete removes it
        assert not os.path.exists(left), f"the escapee's command group {left} outlived the delete"
