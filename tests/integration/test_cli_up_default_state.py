# SPDX-License-Identifier: MIT
"""`sbx up`, `sbx status` and `sbx down` without --state use /var/lib/sbx, and the client
configuration goes to ~/.sbx when $SBX_HOME is not set. Run in a mount namespace of the test's
own (unshare --mount --propagation private): /var/lib is covered there by an overlay (so that
/var/lib/sbx can be made even where the host has none) and a fresh directory of the test's is
bound on /var/lib/sbx, so the host's /var/lib/sbx (and the images it may hold) is never seen
nor touched. The daemons `sbx up` starts stay in that namespace; every later `sbx up/status/
down` is run there (nsenter), and the same `sbx status` outside it must find nothing."""
import os
import shutil
import signal
import stat
import subprocess
import tempfile

from conftest import assert_no_sanitizer_report
from test_cli import ID_RANGE, SBX, alive, port_pair

DEFAULT_STATE = "/var/lib/sbx"


class Namespace:
    """A private mount namespace held open by a sleeping process, where /var/lib/sbx is the
    directory `state` (on the host's file system, so the test reads it from outside)."""

    def __init__(self, top):
        self.state = os.path.join(top, "var-lib-sbx")
        upper, work = os.path.join(top, "ovl-upper"), os.path.join(top, "ovl-work")
        for d in (self.state, upper, work):
            os.mkdir(d, 0o755)
        script = (f"set -e; mount -t overlay overlay -o lowerdir=/var/lib,upperdir={upper},"
                  f"workdir={work} /var/lib; mkdir -p {DEFAULT_STATE}; "
                  f"mount --bind {self.state} {DEFAULT_STATE}; echo ready; exec sleep 300")
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.holder.stdout.readline()
        if line != "ready\n":
            self.holder.kill()
            raise RuntimeError("no mount namespace: " + line + self.holder.communicate()[1])
        self.mnt = f"/proc/{self.holder.pid}/ns/mnt"

    def run(self, argv, env, timeout=90):
        return subprocess.run(["nsenter", f"--mount={self.mnt}", "--", *argv],
                              capture_output=True, text=True, env=env, timeout=timeout)

    def close(self):
        self.holder.kill()
        self.holder.wait()


def pid_in(state, name):
    try:
        with open(os.path.join(state, f"{name}.pid")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0


def daemon_logs(state, tail=4000):
    """The ends of the logs of the daemons `sbx up` started (for a failure's message)."""
    out = []
    for log in ("control.log", "node.log"):
        try:
            with open(os.path.join(state, log), errors="replace") as f:
                out.append(f"--- {log} (end) ---\n" + f.read()[-tail:])
        except OSError as e:
            out.append(f"--- {log}: {e}")
    return "\n".join(out)


def test_up_status_down_without_state_use_var_lib_sbx_and_home_dot_sbx():
    host_had_it = os.path.lexists(DEFAULT_STATE)
    ours = {"admin.token", "control", "node", "port", "sbx-control.pid", "sbx-node.pid",
            "up.lock", "control.log", "node.log"}
    host_had = ours & set(os.listdir(DEFAULT_STATE)) if os.path.isdir(DEFAULT_STATE) else set()
    top = tempfile.mkdtemp(prefix="sbx-defstate-")
    ns = Namespace(top)
    home = os.path.join(top, "home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    env["HOME"] = home  # and no SBX_HOME: the configuration goes to $HOME/.sbx
    port = port_pair()
    try:
        r = ns.run([SBX, "up", "--port", str(port), "--default-image", "host", "--id-range",
                    ID_RANGE], env)
        assert r.returncode == 0, r.stdout + r.stderr
        dot = os.path.join(home, ".sbx")
        assert r.stdout == (f"sbx: platform up at https://127.0.0.1:{port} (state {DEFAULT_STATE}"
                            f"); client configuration in {dot}\n"), r.stdout
        assert f"log {DEFAULT_STATE}/control.log" in r.stderr, r.stderr
        # the state landed in what the namespace calls /var/lib/sbx, made 0700
        st = ns.state
        assert stat.S_IMODE(os.stat(st).st_mode) == 0o700
        for name, mode in [("admin.token", 0o600), ("control/store.db", 0o600),
                           ("control/node-join.token", 0o600), ("control/tls/ca.crt", None),
                           ("node", 0o700), ("control.log", 0o600), ("node.log", 0o600),
                           ("up.lock", 0o600), ("port", None)]:
            path = os.path.join(st, name)
            assert os.path.exists(path), (name, sorted(os.listdir(st)))
            if mode is not None:
                assert stat.S_IMODE(os.stat(path).st_mode) == mode, name
        with open(os.path.join(st, "port")) as f:
            assert f.read() == f"{port}\n"
        # the daemons run in the namespace, on the default paths
        cpid, npid = pid_in(st, "sbx-control"), pid_in(st, "sbx-node")
        assert alive(cpid) and alive(npid), (cpid, npid)
        for pid, sub in ((cpid, "control"), (npid, "node")):
            assert os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink(ns.mnt)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            assert argv[argv.index(b"--state") + 1] == f"{DEFAULT_STATE}/{sub}".encode(), argv
        # the client configuration: ~/.sbx, 0700, its token 0600 and the admin token
        assert stat.S_IMODE(os.stat(dot).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(os.path.join(dot, "token")).st_mode) == 0o600
        with open(os.path.join(dot, "token")) as a, open(os.path.join(st, "admin.token")) as b:
            assert a.read().strip() == b.read().strip()
        with open(os.path.join(dot, "endpoint")) as f:
            assert f.read() == f"https://127.0.0.1:{port}\n"
        with open(os.path.join(dot, "ca.crt")) as a, \
                open(os.path.join(st, "control", "tls", "ca.crt")) as b:
            assert a.read() == b.read()
        # status without --state: up in the namespace; outside it, /var/lib/sbx has no platform
        r = ns.run([SBX, "status"], env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"state     {DEFAULT_STATE}\n" in r.stdout and "node live yes" in r.stdout, r.stdout
        assert f"(pid {cpid}, https://127.0.0.1:{port})" in r.stdout, r.stdout
        r = subprocess.run([SBX, "status"], capture_output=True, text=True, env=env, timeout=30)
        assert r.returncode == 4 and "control   stopped" in r.stdout, r.stdout + r.stderr
        # a sandbox through ~/.sbx alone (no SBX_HOME, no token in the environment)
        try:
            r = subprocess.run([SBX, "create"], capture_output=True, text=True, env=env,
                               timeout=120)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"sbx create: {e}\n{daemon_logs(st)}") from None
        assert r.returncode == 0, r.stdout + r.stderr + daemon_logs(st)
        sid = r.stdout.strip()
        r = subprocess.run([SBX, "exec", sid, "--", "sh", "-c", "echo hi; exit 7"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert (r.returncode, r.stdout) == (7, "hi\n"), r
        subprocess.run([SBX, "kill", sid], capture_output=True, env=env, timeout=30)
        # a second `sbx up` without --state finds it running
        r = ns.run([SBX, "up"], env)
        assert r.returncode == 0 and "already running" in r.stdout, r.stdout + r.stderr
        assert f"state {DEFAULT_STATE})" in r.stdout, r.stdout
        # down without --state stops both; status says so
        r = ns.run([SBX, "down"], env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "stopped sbx-node" in r.stdout and "stopped sbx-control" in r.stdout, r.stdout
        assert not alive(cpid) and not alive(npid)
        r = ns.run([SBX, "status"], env)
        assert r.returncode == 4 and "control   stopped" in r.stdout, r.stdout
        assert os.path.exists(os.path.join(st, "control", "store.db"))  # the store is kept
    finally:
        ns.run([SBX, "down"], env, timeout=60)
        for name in ("sbx-node", "sbx-control"):  # in case down failed
            p = pid_in(ns.state, name)
            if p and alive(p):
                os.kill(p, signal.SIGKILL)
        ns.close()
        try:
            for log in ("control.log", "node.log"):  # the daemons `sbx up` started
                if os.path.exists(os.path.join(ns.state, log)):
                    with open(os.path.join(ns.state, log), errors="replace") as f:
                        assert_no_sanitizer_report(f.read())
        finally:
            shutil.rmtree(top, ignore_errors=True)
    # the host's /var/lib/sbx was never touched: not made, and nothing of a platform added
    assert os.path.lexists(DEFAULT_STATE) == host_had_it
    if host_had_it:
        assert ours & set(os.listdir(DEFAULT_STATE)) == host_had
