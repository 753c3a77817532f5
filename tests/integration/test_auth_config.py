# SPDX-License-Identifier: MIT
"""Authentication and start-up configuration of sbx-server (dedicated mode).

Mirrors the reference `auth-routes` and `resource-bounds` (config part) regression suites:
/health detail behind the token, 403 everywhere without it (before any route is revealed),
fail-closed start-up, and the SBX_* knobs."""
import os
import socket
import stat
import subprocess
import tempfile
import time
import uuid

import pytest

from conftest import SERVER_BIN, free_port, output_of
from rawclient import RawConn, request_bytes


def base_env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    e["SBX_PORT"] = str(free_port())
    e.update(extra)
    return e


def refuses_to_start(env, args=()):
    """Run the binary; it must exit (not serve) with a non-zero status. Returns stderr."""
    p = subprocess.run([SERVER_BIN, *args], env=env, capture_output=True, timeout=10)
    assert p.returncode != 0, f"server started (rc {p.returncode}): {p.stderr.decode()}"
    return p.stderr.decode(errors="replace")


# ---- /health -------------------------------------------------------------------------------

def test_health_without_token_is_minimal(server):
    st, j = server.json("GET", "/health", token=False)
    assert st == 200
    assert j == {"status": "ok", "protocol": 3}
    # a wrong token gets the same minimal answer (still 200: the boot poll needs no credential)
    st, j = server.json("GET", "/health", token=False,
                        headers={"X-Sandbox-Token": "0" * len(server.token)})
    assert st == 200 and j == {"status": "ok", "protocol": 3}


def test_health_with_token_has_detail(server):
    st, j = server.json("GET", "/health")
    assert st == 200
    assert j["status"] == "ok" and j["protocol"] == 3
    assert isinstance(j["version"], str) and j["version"]
    assert isinstance(j["uptime_ms"], int) and 0 <= j["uptime_ms"] < 60000
    assert j["mode"] == "dedicated"
    assert j["auth"] == "required"
    assert isinstance(j["features"], list) and "exec-stream" in j["features"]
    # the kernel's Landlock ABI in every mode, features as an array of Hugging Face's names
    with open("/sys/kernel/security/lsm") if os.path.exists("/sys/kernel/security/lsm") \
            else open(os.devnull) as f:
        lsm = f.read()
    ll = j["landlock"]
    assert isinstance(ll["abi"], int) and isinstance(ll["features"], list)
    assert len(ll["features"]) == min(ll["abi"], 6)
    if "landlock" in lsm:
        assert ll["abi"] >= 1 and ll["features"][0] == "fs"


# ---- 403 on every route --------------------------------------------------------------------

SCRATCH = os.path.join(tempfile.gettempdir(), f"sbx-auth-{uuid.uuid4().hex[:12]}")
ROUTES = [
    ("POST", "/v1/exec", {"cmd": "true"}),
    ("POST", "/v1/processes", {"cmd": "true"}),
    ("GET", "/v1/processes", None),
    ("GET", "/v1/processes/p-1", None),
    ("DELETE", "/v1/processes/p-1", None),
    ("POST", "/v1/processes/p-1/signal", {"signal": "TERM"}),
    ("POST", "/v1/processes/p-1/stdin", b"x"),
    ("GET", "/v1/processes/p-1/output", None),
    ("GET", "/v1/files/read?path=/etc/hostname", None),
    ("PUT", f"/v1/files/write?path={SCRATCH}", b"x"),
    ("GET", "/v1/files/list?path=/", None),
    ("GET", "/v1/files/stat?path=/", None),
    ("DELETE", f"/v1/files/delete?path={SCRATCH}", None),
    ("POST", f"/v1/files/mkdir?path={SCRATCH}-dir", None),
    ("GET", "/v1/proxy/1/", None),
    ("GET", "/v1/sandboxes", None),
    ("GET", "/nonexistent", None),
]


def bad_tokens(tok):
    return {
        "missing": None,
        "empty": "",
        "wrong": "f" * len(tok) if tok[0] != "f" else "e" * len(tok),
        "prefix": tok[:-1],
        "superstring": tok + "0",
        "upper-case": tok.upper(),
        "one-char": tok[:-1] + ("0" if tok[-1] != "0" else "1"),
    }


def test_bad_tokens_get_403_everywhere(server):
    assert server.token.lower() == server.token  # hex: upper-case differs
    for name, tok in bad_tokens(server.token).items():
        hdr = {} if tok is None else {"X-Sandbox-Token": tok}
        for method, path, body in ROUTES:
            st, _, data = server.request(method, path, body, headers=hdr, token=False)
            assert st == 403, f"{name} token, {method} {path}: {st} {data[:200]!r}"
            assert b"error" in data


def test_good_token_reaches_routes(server):
    # positive control for the 403 matrix: the same requests get past authentication
    try:
        for method, path, body in ROUTES:
            st, _, data = server.request(method, path, body)
            assert st != 403, f"{method} {path}: {st} {data[:200]!r}"
    finally:
        for p in (SCRATCH, SCRATCH + "-dir"):
            if os.path.isdir(p):
                os.rmdir(p)
            elif os.path.exists(p):
                os.unlink(p)


def test_refused_requests_have_no_effect(server, tmp_path):
    marker = tmp_path / "ran"
    st, _, _ = server.request("POST", "/v1/exec", {"cmd": f"touch {marker}"}, token=False)
    assert st == 403
    st, _, _ = server.request("POST", "/v1/processes", {"cmd": f"touch {marker}"},
                              headers={"X-Sandbox-Token": server.token[:-1]}, token=False)
    assert st == 403
    written = tmp_path / "written"
    st, _, _ = server.request("PUT", f"/v1/files/write?path={written}", b"data", token=False)
    assert st == 403
    time.sleep(0.2)
    assert not marker.exists() and not written.exists()
    # positive controls
    st, ev = server.exec({"cmd": f"touch {marker}"})
    assert st == 200 and ev[-1]["exit_code"] == 0
    assert marker.exists()
    st, _, _ = server.request("PUT", f"/v1/files/write?path={written}", b"data")
    assert st == 200 and written.read_bytes() == b"data"


def test_host_mode_route_403_before_404(server):
    for method, path in [("GET", "/v1/sandboxes"), ("POST", "/v1/sandboxes"),
                         ("DELETE", "/v1/sandboxes"), ("GET", "/v1/sandboxes/x/token"),
                         ("POST", "/v1/sandboxes/abc/exec")]:
        body = {} if method == "POST" else None
        st, _, _ = server.request(method, path, body, token=False)
        assert st == 403, f"unauthenticated {method} {path}: {st}"
        st, _, _ = server.request(method, path, body)
        assert st == 404, f"authenticated {method} {path}: {st}"


def test_header_name_is_case_insensitive(server):
    with RawConn(server) as c:
        c.send(request_bytes("GET", "/v1/processes", headers=[("x-SANDBOX-token", server.token)]))
        st, _, _ = c.response()
        assert st == 200


# ---- start-up: fail closed -----------------------------------------------------------------

def test_refuses_to_start_without_token():
    err = refuses_to_start(base_env())
    assert "SBX_TOKEN" in err


def test_refuses_to_start_with_empty_token():
    err = refuses_to_start(base_env(SBX_TOKEN=""))
    assert "SBX_TOKEN" in err


def test_env_allow_no_auth_has_no_effect():
    err = refuses_to_start(base_env(SBX_ALLOW_NO_AUTH="1"))
    assert "SBX_TOKEN" in err
    refuses_to_start(base_env(SBX_ALLOW_NO_AUTH="1", SBX_TOKEN=""))


def test_argv_allow_no_auth(make_server):
    s = make_server(token="", args=["--allow-no-auth"])
    st, j = s.json("GET", "/health", token=False)
    assert st == 200 and j["auth"] == "disabled" and j["protocol"] == 3
    st, ev = s.exec({"cmd": "echo open"}, token=False)
    assert st == 200 and output_of(ev) == b"open\n"
    assert "DISABLED" in s.stop()


def test_unknown_argument_refused():
    refuses_to_start(base_env(SBX_TOKEN="a" * 64), args=["--allow-no-auht"])


def test_token_not_visible_to_commands(server):
    st, ev = server.exec({"cmd": "env"})
    assert st == 200 and ev[-1]["exit_code"] == 0
    out = output_of(ev)
    assert b"PATH=" in out  # vacuity guard: we did see the environment
    assert b"SBX_TOKEN" not in out
    assert server.token.encode() not in out
    # background processes get the same scrubbed environment
    st, j = server.json("POST", "/v1/processes",
                        {"cmd": "env > /dev/null; env | grep -c SBX_TOKEN; exit 0"})
    assert st == 200
    st, _, body = server.request("GET", f"/v1/processes/{j['id']}/output")
    assert st == 200 and b'"data":"0\\n"' in body
    # nor in the server's initial environment block, which /proc/<pid>/environ shows to its
    # uid (a command of a dedicated run is): the value is overwritten there
    st, ev = server.exec({"cmd": f"tr '\\0' '\\n' < /proc/{server.proc.pid}/environ"})
    out = output_of(ev)
    assert b"SBX_PORT=" in out, out  # positive control: it is the server's environment
    assert server.token.encode() not in out, "ATTACK: a command read the token in /proc"


@pytest.mark.parametrize("var,value", [
    ("SBX_PORT", "abc"), ("SBX_PORT", "70000"), ("SBX_PORT", "-1"), ("SBX_PORT", "0"),
    ("SBX_PORT", "+80"), ("SBX_PORT", " 80"), ("SBX_MAX_CONNECTIONS", "0"),
    ("SBX_MAX_CONNECTIONS", "ten"), ("SBX_IDLE_TIMEOUT", "1x"), ("SBX_IDLE_TIMEOUT", "-5"),
    ("SBX_IDLE_TIMEOUT", "1.5"),
    # pool knobs are checked in dedicated mode too (they are not silently ignored there)
    ("SBX_CAPACITY", "0"), ("SBX_CAPACITY", "lots"), ("SBX_MIN_LANDLOCK_ABI", "x"),
    ("SBX_HOMES_DIR", "relative/homes"), ("SBX_HOMES_DIR", "/not/utf-8/\udcff"),
    ("SBX_LOG_LEVEL", "verbose"),
    ("SBX_LOG", "verbose"),  # the older name, still read
    ("SBX_POOL_UID_BASE", "19999"), ("SBX_POOL_UID_BASE", "65000"),
    ("SBX_POOL_UID_COUNT", "0"), ("SBX_POOL_UID_COUNT", "45001"),
])
def test_bad_numeric_config_refused(var, value):
    env = base_env(SBX_TOKEN="a" * 64)
    env[var] = value
    err = refuses_to_start(env)
    assert var in err, err


def test_pool_uid_range_past_the_end_refused():
    # each in range alone, but together they end past uid 64999
    env = base_env(SBX_TOKEN="a" * 64, SBX_POOL_UID_BASE="60000", SBX_POOL_UID_COUNT="5001")
    err = refuses_to_start(env)
    assert "SBX_POOL_UID_BASE" in err and "64999" in err, err


def test_good_numeric_config_starts(make_server):
    # positive control for the table above
    s = make_server(env={"SBX_MAX_CONNECTIONS": "10", "SBX_IDLE_TIMEOUT": "3600",
                         "SBX_CAPACITY": "45000", "SBX_MIN_LANDLOCK_ABI": "0",
                         "SBX_HOMES_DIR": "/nonexistent/homes", "SBX_LOG": "info"})
    st, j = s.json("GET", "/health")
    assert st == 200 and j["status"] == "ok"


def test_log_level_variable_is_one_for_every_daemon(tmp_path):
    """SBX_LOG_LEVEL for sbx-server, sbx-node and sbx-control alike: a bad value refuses to
    start, naming the variable; a good one starts (positive control: the server)."""
    from sbxplatform import CONTROL_BIN, NODE_BIN
    for binary, args in ((CONTROL_BIN, ["--state", str(tmp_path / "c")]),
                         (NODE_BIN, ["--state", str(tmp_path / "n")])):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        env["SBX_LOG_LEVEL"] = "loud"
        r = subprocess.run([binary] + args, env=env, capture_output=True, text=True, timeout=20)
        assert r.returncode == 2 and "SBX_LOG_LEVEL=loud" in r.stderr, (binary, r)


def test_log_level_warn_starts(make_server):
    s = make_server(env={"SBX_LOG_LEVEL": "warn"})
    st, j = s.json("GET", "/health")
    assert st == 200 and j["status"] == "ok"


def test_bind_all_interfaces(make_server):
    s = make_server(env={"SBX_BIND": "0.0.0.0"})
    st, j = s.json("GET", "/health")
    assert st == 200 and j["mode"] == "dedicated"


def test_bad_bind_refused():
    err = refuses_to_start(base_env(SBX_TOKEN="a" * 64, SBX_BIND="not-an-address"))
    assert "SBX_BIND" in err or "not-an-address" in err


def test_unix_socket_listener(make_server):
    path = os.path.join(tempfile.gettempdir(), f"sbx-it-{uuid.uuid4().hex[:12]}.sock")
    s = make_server(unix_path=path)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert stat.S_ISSOCK(os.stat(path).st_mode)
    assert mode & 0o077 == 0, oct(mode)
    with RawConn(unix_path=path) as c:
        c.send(request_bytes("GET", "/health", token=s.token))
        st, _, body = c.response()
        assert st == 200 and b'"mode":"dedicated"' in body
        c.send(request_bytes("POST", "/v1/exec", token=s.token, body={"cmd": "echo via-unix"}))
        st, hdrs = c.read_head()
        assert st == 200
        ev = list(c.events())
        assert output_of(ev) == b"via-unix\n" and ev[-1]["exit_code"] == 0
        c.send(request_bytes("GET", "/v1/processes"))  # no token over the socket either
        st, _, _ = c.response()
        assert st == 403
    # not listening on TCP at the same time
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", s.port), timeout=1).close()
    s.stop()
    assert not os.path.exists(path)


def test_bad_listen_refused():
    err = refuses_to_start(base_env(SBX_TOKEN="a" * 64, SBX_LISTEN="tcp:1234"))
    assert "SBX_LISTEN" in err


# ---- idle timeout --------------------------------------------------------------------------

def wait_exit(s, timeout):
    try:
        return s.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def test_idle_timeout_exits(make_server):
    s = make_server(env={"SBX_IDLE_TIMEOUT": "2"})
    t0 = time.monotonic()
    rc = wait_exit(s, 6)
    elapsed = time.monotonic() - t0
    assert rc == 0, "server did not exit after 2 s idle"
    assert 1.5 <= elapsed <= 4.5, elapsed


def test_idle_timeout_spares_foreground_command(make_server):
    s = make_server(env={"SBX_IDLE_TIMEOUT": "2"})
    t0 = time.monotonic()
    st, ev = s.exec({"cmd": "sleep 4; echo done"})
    assert st == 200
    assert output_of(ev) == b"done\n" and ev[-1]["exit_code"] == 0
    assert time.monotonic() - t0 >= 3.9
    assert s.proc.poll() is None, "server exited while a command ran"
    # and once idle it goes away
    assert wait_exit(s, 5) == 0


def test_idle_timeout_spares_background_process(make_server):
    s = make_server(env={"SBX_IDLE_TIMEOUT": "2"})
    st, j = s.json("POST", "/v1/processes", {"cmd": ["sleep", "3.5"]})
    assert st == 200
    t0 = time.monotonic()
    assert wait_exit(s, 3.0) is None, "server exited while a background process ran"
    rc = wait_exit(s, 5)
    assert rc == 0
    assert time.monotonic() - t0 >= 3.0
