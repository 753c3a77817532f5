# SPDX-License-Identifier: MIT
"""libsbx, the C client library, driven directly by a C program linked to the shared library
(tests/tools/libsbx_check.c) against a real platform (one sbx-control, one sbx-node).

The program asserts as it goes (exec streaming, exit codes, signals, timeouts, exact binary
output, argv/cwd/env/stdin, files with pagination and 3 MiB upload/download, background
processes with stdin, re-attach and signals, the proxy URL, kill) and prints both sides of any
failed check. Reconnect runs in a fresh process that has only the API token (SBX_HOME with
endpoint, token and ca.crt): the sandbox token is derived from the job's nonce label."""
import os
import secrets
import subprocess
import urllib.parse

import pytest

from conftest import BUILD, wait_until
from sbxplatform import Platform

CHECK_BIN = os.path.join(BUILD, "tests", "libsbx-check")


def write_home(p, path, token=None):
    """An SBX_HOME for the platform p: what `sbx up` writes (endpoint, token, ca.crt)."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    with open(os.path.join(path, "endpoint"), "w") as f:
        f.write(f"https://127.0.0.1:{p.control.port}\n")
    with open(os.path.join(path, "token"), "w") as f:
        f.write((token or p.admin) + "\n")
    with open(p.ca_file) as src, open(os.path.join(path, "ca.crt"), "w") as dst:
        dst.write(src.read())
    return path


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("nodeA", "nodeB"))
    p.home = write_home(p, os.path.join(p.dir, "client-home"))
    yield p
    p.stop()


def check(p, *args, env=None, timeout=120):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
    e["SBX_HOME"] = p.home
    e.update(env or {})
    return subprocess.run([CHECK_BIN, *args], capture_output=True, text=True, env=e,
                          timeout=timeout)


def test_dedicated_sandbox_through_libsbx(plat):
    r = check(plat, "dedicated")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stderr, r.stderr
    job_id = r.stdout.split()[1]
    # what the library did is what the platform recorded: a labelled job, now canceled
    j = plat.request("GET", f"/v1/jobs/default/{job_id}").json()
    assert j["labels"]["sbx-sandbox"] == "1" and j["labels"]["sbx-sandbox-mode"] == "dedicated"
    assert j["labels"]["purpose"] == "libsbx-check"
    assert len(j["labels"]["sbx-sandbox-nonce"]) == 32
    assert j["secret_names"] == ["SBX_TOKEN"]  # the derived token, never returned
    assert j["stage"] == "CANCELED"


def test_reconnect_from_a_fresh_process_with_only_the_api_token(plat):
    mark = secrets.token_hex(8)
    r = check(plat, "create", mark)
    assert r.returncode == 0, r.stdout + r.stderr
    sid = r.stdout.strip()
    # another process, another SBX_HOME that holds only endpoint + API token + CA
    home2 = write_home(plat, os.path.join(plat.dir, "home2"))
    r2 = subprocess.run([CHECK_BIN, "reconnect", sid, mark], capture_output=True, text=True,
                        env={"SBX_HOME": home2, "PATH": os.environ["PATH"]}, timeout=60)
    assert r2.returncode == 0, r2.stdout + r2.stderr
    # positive control for the derivation: another API token (same role) derives another
    # sandbox token, which the sandbox refuses
    other = plat.token("other", "default", "write")
    home3 = write_home(plat, os.path.join(plat.dir, "home3"), token=other)
    r3 = subprocess.run([CHECK_BIN, "reconnect", sid, mark], capture_output=True, text=True,
                        env={"SBX_HOME": home3, "PATH": os.environ["PATH"]}, timeout=60)
    assert r3.returncode != 0 and "403" in r3.stderr, \
        "another API token derives another sandbox token, which the sandbox refuses: " + \
        r3.stdout + r3.stderr
    assert plat.request("POST", f"/v1/jobs/default/{sid}/cancel", {}).status == 202


def test_bad_input_errors_are_values_with_reasons(plat):
    r = check(plat, "errors")
    assert r.returncode == 0, r.stdout + r.stderr


def test_pool_through_libsbx(plat):
    r = check(plat, "pool", "lp-" + secrets.token_hex(4), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr



def test_the_proxy_url_of_a_pooled_sandbox_reaches_its_service(plat):
    """sbx_sandbox_proxy for a pooled sandbox: the pool route and the API token only (the edge
    adds the sandbox's token); a request there reaches the service on its proxy socket."""
    name = "lpp-" + secrets.token_hex(4)
    r = check(plat, "pool-proxy", name, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    url = urllib.parse.urlsplit(next(x[4:] for x in lines if x.startswith("url ")))
    headers = dict(x[7:].split(": ", 1) for x in lines if x.startswith("header "))
    assert url.port == plat.control.port and set(headers) == {"Authorization"}, (url, headers)
    resp = plat.request("GET", url.path + "/some/path?q=1", token=None, headers=headers)
    assert resp.status == 200 and resp.body == b"libsbx /some/path?q=1", resp
    # without the headers the library gave, the same URL is refused (positive control)
    assert plat.request("GET", url.path + "/x", token=None).status == 401
    assert plat.request("DELETE", f"/v1/pools/default/{name}").status == 202

def test_cli_move_waits_for_the_new_generation_and_keeps_files(plat):
    """`sbx move` (two nodes here; `sbx up` has one): the new generation runs elsewhere with
    the sandbox's files, and sbx returns only once it runs."""
    sbx = os.path.join(BUILD, "sbx")
    env = {"SBX_HOME": plat.home, "PATH": os.environ["PATH"]}

    def run(*args):
        return subprocess.run([sbx, *args], capture_output=True, text=True, env=env, timeout=120)
    r = run("create")
    assert r.returncode == 0, r.stderr
    sid = r.stdout.strip()
    assert run("exec", "-c", sid, "--", "echo moved-with-me > /root/f").returncode == 0
    before = plat.request("GET", f"/v1/jobs/default/{sid}").json()["run"]
    r = run("move", sid)
    assert r.returncode == 0, r.stderr
    after = plat.request("GET", f"/v1/jobs/default/{sid}").json()["run"]
    assert after["generation"] > before["generation"] and after["node"] != before["node"], \
        (before, after)
    assert after["state"] == "running"
    r = run("exec", sid, "--", "cat", "/root/f")
    assert (r.returncode, r.stdout) == (0, "moved-with-me\n"), r
    assert run("kill", sid).returncode == 0


def test_create_options_env_secret_and_idle_timeout_take_effect(plat):
    """A dedicated create with env, a secret and an idle timeout: the command sees env and
    secret (libsbx-check options), the job record keeps the env and the idle timeout and names
    the secret without its value, and the idle timeout really ends an idle sandbox (one of 2 s
    exits on its own while the one of an hour, idle as long, keeps running)."""
    secret = "opt-secret-" + secrets.token_hex(16)
    r = check(plat, "options", secret)
    assert r.returncode == 0, r.stdout + r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    sid, idle_id = out["id"], out["idle"]
    resp = plat.request("GET", f"/v1/jobs/default/{sid}")
    j = resp.json()
    assert j["env"] == {"SBX_CHECK_ENV": "env value with spaces", "SBX_IDLE_TIMEOUT": "3600"}, j
    assert sorted(j["secret_names"]) == ["SBX_CHECK_SECRET", "SBX_TOKEN"], j
    assert j["labels"]["purpose"] == "libsbx-options"
    assert secret not in resp.text
    listing = plat.request("GET", "/v1/jobs/default?label=purpose%3Dlibsbx-options")
    assert sid in listing.text and secret not in listing.text
    assert plat.request("GET", f"/v1/jobs/default/{idle_id}").json()["env"] == \
        {"SBX_IDLE_TIMEOUT": "2"}

    def idle_ended():
        job = plat.request("GET", f"/v1/jobs/default/{idle_id}").json()
        return job if job["stage"] in ("COMPLETED", "ERROR", "CANCELED") else None
    ended = wait_until(idle_ended, 90, 0.5)
    assert ended and ended["stage"] == "COMPLETED", ended or \
        plat.request("GET", f"/v1/jobs/default/{idle_id}").json()
    # positive control: the hour-long one was idle at least as long and still runs
    j = plat.request("GET", f"/v1/jobs/default/{sid}").json()
    assert j["stage"] == "RUNNING" and j["run"]["state"] == "running", j
    assert plat.request("POST", f"/v1/jobs/default/{sid}/cancel", {}).status == 202
