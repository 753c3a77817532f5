# SPDX-License-Identifier: MIT
"""The `sbx` CLI (on libsbx) against a platform that `sbx up` itself starts: a state directory
and ports of the test's own, SBX_HOME in a temporary directory. Covers up (idempotent, the
client configuration written with its modes), status, create/exec (streamed, exit codes,
stdin, timeout, signal)/cp/ls/kill, background processes, jobs and lifecycle, tokens, bad input
(exit codes and messages that say what to do next), --help everywhere, and down (daemons
stopped, store kept: `sbx up` again finds the same jobs)."""
import contextlib
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest

from conftest import BUILD, assert_no_sanitizer_report, free_port, id_range, wait_until

SBX = os.path.join(BUILD, "sbx")
# A subordinate id range of this module's own (of this test session's share).
ID_RANGE = "%d:%d" % id_range(65536 * 64)


def port_pair():
    """A free port P whose P+1 is free too (sbx up puts the node there)."""
    for _ in range(100):
        p = free_port()
        if p + 1 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p + 1))
            except OSError:
                continue
        return p
    raise RuntimeError("no two free ports in a row")


class Up:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="sbxcli-")
        os.chmod(self.dir, 0o700)
        self.state = os.path.join(self.dir, "state")
        self.home = os.path.join(self.dir, "home")
        self.port = port_pair()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        self.env["SBX_HOME"] = self.home
        self.bin = SBX  # the sbx binary run (a test may run a copy placed elsewhere)

    def sbx(self, *args, env=None, input=None, timeout=120, check=None):
        e = dict(self.env)
        e.update(env or {})
        r = subprocess.run([self.bin, *args], capture_output=True, text=True, env=e, input=input,
                           timeout=timeout)
        if check is not None:
            assert r.returncode == check, f"sbx {' '.join(args)} -> {r.returncode}\n" \
                                          f"{r.stdout}\n{r.stderr}"
        return r

    def up(self):
        return self.sbx("up", "--state", self.state, "--port", str(self.port), "--default-image",
                        "host", "--images", os.path.join(self.dir, "images"), "--id-range",
                        ID_RANGE, timeout=90)

    def pid(self, name):
        try:
            with open(os.path.join(self.state, f"{name}.pid")) as f:
                return int(f.read())
        except (OSError, ValueError):
            return 0

    def down(self):
        return self.sbx("down", "--state", self.state, timeout=60)


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


@contextlib.contextmanager
def platform_up():
    """A platform `sbx up` started (Up); after: `sbx down`, leftovers killed, the daemons' logs
    checked for sanitizer reports."""
    u = Up()
    r = u.up()
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        yield u
    finally:
        u.down()
        for name in ("sbx-node", "sbx-control"):  # in case down failed
            p = u.pid(name)
            if p and alive(p):
                os.kill(p, signal.SIGKILL)
        try:
            for log in ("control.log", "node.log"):  # the daemons `sbx up` started
                with open(os.path.join(u.state, log), errors="replace") as f:
                    assert_no_sanitizer_report(f.read())
        finally:
            shutil.rmtree(u.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def up():
    with platform_up() as u:
        yield u


def new_sandbox(up):
    r = up.sbx("create", check=0)
    sid = r.stdout.strip()
    assert len(sid) == 24, r.stdout
    return sid


def test_up_writes_the_client_configuration_and_is_idempotent(up):
    st = os.stat(up.home)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(up.home, "token")).st_mode) == 0o600
    with open(os.path.join(up.home, "endpoint")) as f:
        assert f.read().strip() == f"https://127.0.0.1:{up.port}"
    with open(os.path.join(up.home, "token")) as f:
        token = f.read().strip()
    with open(os.path.join(up.state, "admin.token")) as f:
        assert f.read().strip() == token
    cpid, npid = up.pid("sbx-control"), up.pid("sbx-node")
    assert alive(cpid) and alive(npid)
    # a second `sbx up` sees it running and says so; nothing new starts
    r = up.up()
    assert r.returncode == 0 and "already running" in r.stdout, r.stdout + r.stderr
    assert (up.pid("sbx-control"), up.pid("sbx-node")) == (cpid, npid)
    r = up.sbx("status", "--state", up.state, check=0)
    assert "node live yes" in r.stdout, r.stdout
    # the daemons are in sessions of their own with logs in the state directory
    assert os.getsid(cpid) == cpid and os.getsid(npid) == npid
    assert os.path.getsize(os.path.join(up.state, "control.log")) > 0


def test_create_exec_stream_exit_codes(up):
    sid = new_sandbox(up)
    r = up.sbx("exec", sid, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
    assert (r.returncode, r.stdout, r.stderr) == (3, "out\n", "err\n"), r
    r = up.sbx("exec", "-c", "-w", "/tmp", "-e", "A=1 2", sid, "--", "pwd; echo $A", check=0)
    assert r.stdout == "/tmp\n1 2\n"
    r = up.sbx("exec", "-i", sid, "--", "tr", "a-z", "A-Z", input="hello\n", check=0)
    assert r.stdout == "HELLO\n"
    r = up.sbx("exec", "--timeout", "0.5", sid, "--", "sleep", "10")
    assert r.returncode == 124 and "timed out" in r.stderr, r
    r = up.sbx("exec", "-c", sid, "--", "kill -KILL $$")
    assert r.returncode == 128 + 9, r
    r = up.sbx("exec", sid, "--", "/no/such/program")
    assert r.returncode == 125 and "/no/such/program" in r.stderr, r
    # streamed: the first line arrives while the command still runs
    p = subprocess.Popen([SBX, "exec", "-c", sid, "--", "echo first; sleep 2; echo second"],
                         stdout=subprocess.PIPE, text=True, env=up.env)
    try:
        t0 = time.monotonic()
        assert p.stdout.readline() == "first\n"
        first = time.monotonic() - t0
        assert p.stdout.readline() == "second\n"
        second = time.monotonic() - t0
        assert p.wait(30) == 0
    finally:
        p.kill()
        p.wait()
    assert first < 1.5 and second - first > 1.0, (first, second)
    up.sbx("kill", sid, check=0)


def test_exec_interactive_streams_stdin_and_passes_signals(up):
    sid = new_sandbox(up)
    p = subprocess.Popen([SBX, "exec", "-i", sid, "--", "sh", "-c",
                          "read a; echo got $a; read b; echo got $b; exit 5"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=up.env)
    try:
        p.stdin.write("one\n")
        p.stdin.flush()
        # the first answer comes while stdin is still open: input is streamed, not read whole
        assert p.stdout.readline() == "got one\n"
        p.stdin.write("two\n")
        p.stdin.close()
        assert p.stdout.readline() == "got two\n"
        assert p.wait(30) == 5
    finally:
        p.kill()
        p.wait()
    # SIGINT to sbx reaches the command (128 + 2), which then no longer runs in the sandbox
    p = subprocess.Popen([SBX, "exec", "-i", sid, "--", "sleep", "60"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=up.env)
    try:
        def started():
            procs = json.loads(up.sbx("ps", "--json", sid, check=0).stdout)
            return [x for x in procs if x["cmd"] == '["sleep","60"]' and x["running"]]
        assert wait_until(started, 10, 0.2)
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 130, p.stderr.read()
    finally:
        p.kill()
        p.wait()
    procs = json.loads(up.sbx("ps", "--json", sid, check=0).stdout)
    assert not [x for x in procs if x["cmd"] == '["sleep","60"]' and x["running"]], procs
    up.sbx("kill", sid, check=0)


def test_cp_ls_kill(up):
    sid = new_sandbox(up)
    src = os.path.join(up.dir, "blob")
    data = os.urandom(2 * 1024 * 1024 + 17)
    with open(src, "wb") as f:
        f.write(data)
    os.chmod(src, 0o640)
    up.sbx("cp", src, f"{sid}:/tmp/in/blob", check=0)
    r = up.sbx("exec", sid, "--", "stat", "-c", "%s %a", "/tmp/in/blob", check=0)
    assert r.stdout.split() == [str(len(data)), "640"]
    back = os.path.join(up.dir, "back")
    up.sbx("cp", f"{sid}:/tmp/in/blob", back, check=0)
    with open(back, "rb") as f:
        assert f.read() == data
    r = up.sbx("cp", f"{sid}:/tmp/nothing", back)
    assert r.returncode == 3 and "not found" in r.stderr, r
    # a local name with a colon is written ./a:b (never taken for ID:PATH)
    with open(os.path.join(up.dir, "a:b"), "w") as f:
        f.write("colon")
    r = subprocess.run([SBX, "cp", "./a:b", f"{sid}:/tmp/colon"], capture_output=True, text=True,
                       env=up.env, cwd=up.dir, timeout=30)
    assert r.returncode == 0, r
    assert up.sbx("exec", sid, "--", "cat", "/tmp/colon", check=0).stdout == "colon"
    r = up.sbx("ls", "--json", check=0)
    rows = {x["id"]: x for x in json.loads(r.stdout)}
    assert rows[sid]["kind"] == "dedicated" and rows[sid]["stage"] == "RUNNING"
    assert sid in up.sbx("ls", check=0).stdout
    up.sbx("kill", sid, check=0)

    def canceled():
        r = up.sbx("jobs", "inspect", sid, check=0)
        return json.loads(r.stdout)["stage"] == "CANCELED"
    assert wait_until(canceled, 20, 0.2)
    assert sid not in up.sbx("ls", check=0).stdout  # ended sandboxes only with --all
    assert sid in up.sbx("ls", "--all", check=0).stdout
    r = up.sbx("exec", sid, "--", "true")
    assert r.returncode != 0


def test_proxy_url_and_headers_reach_the_agent(up):
    sid = new_sandbox(up)
    out = up.sbx("proxy", sid, "49983", check=0).stdout.splitlines()
    url, headers = out[0], dict(line.split(": ", 1) for line in out[1:] if line)
    assert url == f"https://127.0.0.1:{up.port}/v1/jobs/default/{sid}/proxy/49983", url
    assert set(headers) == {"Authorization", "X-Sandbox-Token"}
    ctx = ssl.create_default_context(cafile=os.path.join(up.home, "ca.crt"))
    req = urllib.request.Request(url + "/health", headers=headers)
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        body = json.loads(r.read())
    assert body["status"] == "ok" and "uptime_ms" in body, body  # authenticated: more fields
    # positive control for the sandbox token: without it the agent refuses
    del headers["X-Sandbox-Token"]
    req = urllib.request.Request(url + "/v1/files/stat?path=/", headers=headers)
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, context=ctx, timeout=10)
    assert exc.value.code == 403
    up.sbx("kill", sid, check=0)


def test_spawn_ps_logs_stdin_signal(up):
    sid = new_sandbox(up)
    pid = up.sbx("spawn", "-i", "--tag", "reader", sid, "--", "sh", "-c",
                 "read x; echo got $x; exit 6", check=0).stdout.strip()
    assert pid.startswith("p-")
    up.sbx("stdin", "--close", sid, pid, input="word\n", check=0)
    r = up.sbx("logs", "-f", sid, pid)
    assert (r.returncode, r.stdout) == (6, "got word\n"), r
    sleeper = up.sbx("spawn", sid, "--", "sleep", "100", check=0).stdout.strip()
    up.sbx("signal", sid, sleeper, "KILL", check=0)

    def killed():
        procs = json.loads(up.sbx("ps", "--json", sid, check=0).stdout)
        return any(p["id"] == sleeper and not p["running"] and p["signal"] == 9 for p in procs)
    assert wait_until(killed, 10, 0.2)
    r = up.sbx("ps", sid, check=0)
    assert pid in r.stdout and "exited" in r.stdout
    up.sbx("kill", sid, check=0)


def test_jobs_pause_resume_and_label_cancel(up):
    r = up.sbx("create", "--label", "team=cli", check=0)
    sid = r.stdout.strip()
    up.sbx("exec", "-c", sid, "--", "echo kept > /root/note", check=0)
    up.sbx("pause", sid, check=0)

    def paused():
        return json.loads(up.sbx("jobs", "inspect", sid, check=0).stdout)["stage"] == "PAUSED"
    assert wait_until(paused, 20, 0.2)
    r = up.sbx("exec", sid, "--", "true")
    assert r.returncode != 0 and "not running" in r.stderr, r
    up.sbx("resume", sid, check=0)
    assert up.sbx("exec", sid, "--", "cat", "/root/note", check=0).stdout == "kept\n"
    r = up.sbx("jobs", "ls", "--label", "team=cli", "--json", check=0)
    assert [j["id"] for j in json.loads(r.stdout)] == [sid]
    r = up.sbx("jobs", "cancel", "--label", "team=cli", check=0)
    assert r.stdout.split() == [sid]


def test_tokens_roles_and_revoke(up):
    r = up.sbx("token", "create", "--principal", "reader", "--role", "read", "--json", check=0)
    tok = json.loads(r.stdout)
    env = {"SBX_TOKEN": tok["token"]}
    up.sbx("ls", env=env, check=0)  # read may list
    r = up.sbx("create", env=env)
    assert r.returncode == 5 and "token" in r.stderr, r  # but not create
    up.sbx("token", "revoke", tok["id"], check=0)

    def refused():
        return up.sbx("ls", env=env).returncode == 5
    assert wait_until(refused, 5, 0.2)


def test_bad_input_exit_codes_and_messages(up):
    r = up.sbx("exec", "0123456789abcdef01234567", "--", "true")
    assert r.returncode == 3 and "no sandbox" in r.stderr, r
    r = up.sbx("create", "--image", "no-such-image")
    assert r.returncode == 1 and "no-such-image" in r.stderr and "400" in r.stderr, r
    r = up.sbx("create", "-e", "NOEQUALS")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr, r
    r = up.sbx("frobnicate")
    assert r.returncode == 2 and "unknown command" in r.stderr, r
    r = up.sbx("exec", "onlyid")
    assert r.returncode == 2, r
    r = up.sbx("cp", "a", "b")
    assert r.returncode == 2 and "ID:PATH" in r.stderr, r
    r = up.sbx("ls", env={"SBX_HOME": os.path.join(up.dir, "nowhere")})
    assert r.returncode == 4 and "sbx up" in r.stderr, r
    r = up.sbx("ls", env={"SBX_TOKEN": "wrong"})
    assert r.returncode == 5 and "token" in r.stderr, r
    r = up.sbx("pool", "inspect", "no-such-pool")
    assert r.returncode in (3, 1), r


HELP_CMDS = [
    [], ["help"], ["up"], ["down"], ["status"], ["create"], ["exec"], ["spawn"], ["ps"],
    ["logs"], ["signal"], ["stdin"], ["cp"], ["ls"], ["kill"], ["proxy"], ["pool"], ["jobs"],
    ["pause"], ["resume"], ["move"], ["token"],
    ["pool", "create"], ["pool", "ls"], ["pool", "inspect"], ["pool", "rm"],
    ["jobs", "ls"], ["jobs", "inspect"], ["jobs", "cancel"],
    ["token", "create"], ["token", "revoke"]]


def help_run(*args):
    # no platform configured: --help must not need one
    env = {"PATH": os.environ["PATH"], "SBX_HOME": "/nonexistent/sbx-home"}
    return subprocess.run([SBX, *args], capture_output=True, text=True, env=env, timeout=10)


@pytest.mark.parametrize("cmd", HELP_CMDS, ids=lambda c: " ".join(c) or "sbx")
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_everywhere(cmd, flag):
    r = help_run(*cmd, flag)
    assert r.returncode == 0 and r.stdout.startswith("usage: sbx") and r.stderr == "", (cmd, r)
    if cmd and cmd != ["help"]:
        assert "sbx " + " ".join(cmd) in r.stdout, (cmd, r.stdout)  # its own usage


def test_help_list_covers_every_command():
    """HELP_CMDS holds every command of the CLI's table (src/cli/main.c) and every subcommand
    the pool, jobs and token usages name, so a new one cannot go without a --help test."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "src", "cli", "main.c")) as f:
        table = re.findall(r'\{ "([a-z]+)", cmd_[a-z]+ \}', f.read())
    assert len(table) >= 20, table  # positive control: the table was found
    covered = {c[0] for c in HELP_CMDS if c}
    assert set(table) - covered == set(), set(table) - covered
    for group in ("pool", "jobs", "token"):
        subs = set(re.findall(rf"sbx {group} ([a-z]+)", help_run(group, "--help").stdout))
        assert len(subs) >= 2, (group, subs)
        assert subs - {c[1] for c in HELP_CMDS if len(c) == 2 and c[0] == group} == set(), subs


def test_bash_completion_parses():
    path = os.path.join(os.path.dirname(BUILD.rstrip("/")), "contrib", "sbx.bash-completion")
    if not os.path.exists(path):
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))), "contrib", "sbx.bash-completion")
    r = subprocess.run(["bash", "-c", f"source {path} && complete -p sbx"], capture_output=True,
                       text=True, timeout=10)
    assert r.returncode == 0 and "_sbx" in r.stdout, r


def test_pool_commands(up):
    name = "cp-" + secrets.token_hex(3)
    up.sbx("pool", "create", name, "--per-host", "4", "--max-hosts", "1", check=0)
    assert name in up.sbx("pool", "ls", check=0).stdout
    pools = json.loads(up.sbx("pool", "ls", "--json", check=0).stdout)
    assert isinstance(pools, list), pools
    mine = [p for p in pools if p["name"] == name]
    assert len(mine) == 1, pools
    assert (mine[0]["per_host"], mine[0]["max_hosts"], mine[0]["flavor"]) == (4, 1, "cpu-small")
    r = up.sbx("create", "--pool", name, "--count", "2", check=0, timeout=180)
    ids = r.stdout.split()
    assert len(ids) == 2 and all(i.startswith(name + "/") for i in ids), r.stdout
    r = up.sbx("exec", ids[0], "--", "sh", "-c", "echo $SBX_SANDBOX_ID; exit 4")
    assert r.returncode == 4 and r.stdout.strip() == ids[0].split("/")[1], r
    src = os.path.join(up.dir, "pooled")
    with open(src, "w") as f:
        f.write("pooled file")
    up.sbx("cp", src, f"{ids[1]}:/x.txt", check=0)
    assert up.sbx("exec", ids[1], "--", "cat", "x.txt", check=0).stdout == "pooled file"
    # and back out: a file the sandbox made (binary, past one read) comes out byte for byte
    r = up.sbx("exec", ids[1], "--", "sh", "-c",
               "head -c 1500007 /dev/urandom > made.bin && sha256sum made.bin", check=0)
    made_sum = r.stdout.split()[0]
    out = os.path.join(up.dir, "made-back.bin")
    up.sbx("cp", f"{ids[1]}:/made.bin", out, check=0)
    with open(out, "rb") as f:
        back = f.read()
    assert len(back) == 1500007 and hashlib.sha256(back).hexdigest() == made_sum
    up.sbx("cp", f"{ids[1]}:/x.txt", out, check=0)  # over an existing local file
    with open(out, "rb") as f:
        assert f.read() == b"pooled file"
    r = up.sbx("cp", f"{ids[1]}:/no-such-file", out)
    assert r.returncode == 3, r
    with open(out, "rb") as f:  # a failed copy leaves the local file as it was
        assert f.read() == b"pooled file"
    bare = ids[1].split("/")[1]  # a pooled sandbox is found by its id alone too
    assert up.sbx("exec", bare, "--", "true").returncode == 0
    assert ids[0] in up.sbx("ls", check=0).stdout
    insp = json.loads(up.sbx("pool", "inspect", name, check=0).stdout)
    assert insp["name"] == name and len(insp["hosts"]) == 1
    up.sbx("kill", ids[0], check=0)
    r = up.sbx("exec", ids[0], "--", "true")
    assert r.returncode == 3, r
    up.sbx("pool", "rm", name, check=0)


def test_pooled_sandbox_of_a_dead_host_is_reported_gone(up):
    name = "gone-" + secrets.token_hex(3)
    up.sbx("pool", "create", name, "--max-hosts", "1", check=0)
    sid = up.sbx("create", "--pool", name, check=0, timeout=180).stdout.strip()
    assert up.sbx("exec", sid, "--", "true").returncode == 0  # positive control
    host = json.loads(up.sbx("pool", "inspect", name, check=0).stdout)["hosts"][0]["job"]
    up.sbx("jobs", "cancel", host, check=0)

    def gone():
        r = up.sbx("exec", sid, "--", "true")
        return r if r.returncode == 3 else None
    r = wait_until(gone, 20, 0.3)
    assert r and "410" in r.stderr and "gone" in r.stderr, r
    up.sbx("pool", "rm", name, check=0)


def test_kill_all_kills_every_listed_sandbox(up):
    """`sbx kill --all`: every sandbox `sbx ls` lists, dedicated and pooled, is killed (and
    printed); `sbx ls` is then empty and none of them runs a command any more."""
    name = "ka-" + secrets.token_hex(3)
    up.sbx("pool", "create", name, "--max-hosts", "1", check=0)
    pooled = up.sbx("create", "--pool", name, "--count", "2", check=0, timeout=180).stdout.split()
    dedicated = [new_sandbox(up), new_sandbox(up)]
    # positive control: they all run and all list
    for sid in pooled + dedicated:
        assert up.sbx("exec", sid, "--", "true").returncode == 0, sid
    listed = {x["id"] for x in json.loads(up.sbx("ls", "--json", check=0).stdout)}
    assert set(pooled + dedicated) <= listed, listed
    r = up.sbx("kill", "--all", check=0)
    assert set(r.stdout.split()) == listed, (r.stdout, listed)

    def empty():
        return json.loads(up.sbx("ls", "--json", check=0).stdout) == []
    assert wait_until(empty, 30, 0.3), up.sbx("ls", check=0).stdout
    assert up.sbx("ls", check=0).stdout.splitlines()[1:] == []
    for sid in dedicated:
        assert json.loads(up.sbx("jobs", "inspect", sid, check=0).stdout)["stage"] == "CANCELED"
        assert up.sbx("exec", sid, "--", "true").returncode != 0, sid
    for sid in pooled:
        assert up.sbx("exec", sid, "--", "true").returncode == 3, sid
    # nothing left: kill --all kills nothing and succeeds
    r = up.sbx("kill", "--all", check=0)
    assert r.stdout == "", r
    up.sbx("pool", "rm", name, check=0)


def test_up_restarts_only_what_is_missing(up):
    """A node that died: status says so, `sbx up` starts that one only, sandboxes still work."""
    sid = new_sandbox(up)
    cpid, npid = up.pid("sbx-control"), up.pid("sbx-node")
    os.kill(npid, signal.SIGKILL)
    assert wait_until(lambda: not alive(npid), 10, 0.05)
    r = up.sbx("status", "--state", up.state)
    assert r.returncode == 4 and "node      stopped" in r.stdout, r
    r = up.up()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "started sbx-node" in r.stderr and "started sbx-control" not in r.stderr, r.stderr
    assert up.pid("sbx-control") == cpid and up.pid("sbx-node") not in (0, npid)
    up.sbx("status", "--state", up.state, check=0)

    def works():
        return up.sbx("exec", sid, "--", "true").returncode == 0
    assert wait_until(works, 30, 0.5)
    up.sbx("kill", sid, check=0)


def test_down_stops_both_and_keeps_the_store(up):
    """Last: down, then up again on the same state."""
    sid = new_sandbox(up)
    cpid, npid = up.pid("sbx-control"), up.pid("sbx-node")
    r = up.down()
    assert r.returncode == 0 and "stopped sbx-node" in r.stdout, r.stdout + r.stderr
    assert not alive(cpid) and not alive(npid)
    r = up.sbx("status", "--state", up.state)
    assert r.returncode == 4 and "stopped" in r.stdout, r
    r = up.sbx("ls")
    assert r.returncode == 4 and "sbx up" in r.stderr, r
    r = up.up()
    assert r.returncode == 0, r.stdout + r.stderr
    # the job record survived the restart
    j = json.loads(up.sbx("jobs", "inspect", sid, check=0).stdout)
    assert j["id"] == sid
    up.sbx("kill", sid, check=0)
