# SPDX-License-Identifier: MIT
"""The control plane's Jobs API as a user sees it: bearer tokens and roles per namespace,
create validation, label selectors, secrets (reach the command, never returned or logged),
cancel, pause and resume, and the modes of the files and directories that hold secrets."""
import os
import secrets
import stat
import subprocess

import pytest

from conftest import wait_until
from sbxplatform import AGENT_PORT, Platform


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("api-n1",))
    yield p
    p.stop()


@pytest.fixture(scope="module")
def job(plat):
    """One running job in namespace t shared by the read-only checks."""
    j = plat.create("t", labels={"team": "red", "tier": "gold"})
    yield j
    j.cancel()


# ---- authentication and roles -----------------------------------------------------------------

def test_missing_or_wrong_token_is_401(plat, job):
    paths = [("GET", "/v1/jobs/t", None), ("POST", "/v1/jobs/t", {}),
             ("GET", job.path(), None), ("POST", job.path("/cancel"), {}),
             ("POST", job.path(f"/proxy/{AGENT_PORT}/v1/exec"), {"cmd": "true"}),
             ("GET", "/v1/nodes", None), ("POST", "/v1/tokens", {})]
    for method, path, body in paths:
        for tok in (None, "sbx_" + "0" * 40, "garbage"):
            r = plat.request(method, path, body, token=tok)
            assert r.status == 401, (method, path, tok, r)
            assert r.json().get("error"), r
            assert r.headers.get("www-authenticate", "").startswith("Bearer"), r
    # positive control: the admin token is accepted on the same routes
    assert plat.request("GET", "/v1/jobs/t").status == 200
    assert plat.request("GET", job.path()).status == 200
    assert job.inspect()["stage"] == "RUNNING"  # the 401 cancel did nothing


def test_read_token_can_read_but_not_exec_or_create(plat, job):
    reader = plat.token("reader", "t", "read")
    job.sh("echo read-ok > /root/read-me")
    r = job.proxy("GET", AGENT_PORT, "/v1/files/read?path=/root/read-me", token=reader)
    assert r.status == 200 and r.body == b"read-ok\n", r
    r = job.exec_raw("touch /root/by-reader", token=reader)  # exec needs write
    assert r.status == 403 and r.json().get("error"), r
    assert plat.request("GET", "/v1/jobs/t", token=reader).status == 200
    assert plat.request("GET", job.path(), token=reader).status == 200
    r = plat.request("POST", "/v1/jobs/t", {"secrets": {"SBX_TOKEN": "x" * 32}}, token=reader)
    assert r.status == 403 and r.json().get("error"), r
    for action in ("cancel", "pause", "move"):
        r = plat.request("POST", job.path("/" + action), {}, token=reader)
        assert r.status == 403, (action, r)
    assert plat.request("POST", "/v1/tokens", {"principal": "x", "namespace": "t",
                                               "role": "admin"}, token=reader).status == 403
    assert plat.request("GET", "/v1/nodes", token=reader).status == 403
    assert job.inspect()["stage"] == "RUNNING"
    # positive control: a write token of the namespace may create
    writer = plat.token("writer", "t", "write")
    r = plat.request("POST", "/v1/jobs/t", {"secrets": {"SBX_TOKEN": "y" * 32},
                                            "labels": {"purpose": "write-control"}},
                     token=writer)
    assert r.status == 201, r
    assert job.exec("echo write-ok", token=writer).out == "write-ok\n"
    assert job.read_file("/root/by-reader").status == 404  # the refused exec did nothing
    j = r.json()
    assert j["initiator"] == "writer" and j["namespace"] == "t"
    assert plat.request("POST", f"/v1/jobs/t/{j['id']}/cancel", {}, token=writer).status == 202


def test_other_namespace_token_is_403(plat, job):
    other = plat.token("stranger", "elsewhere", "write")
    for method, path, body in [("GET", "/v1/jobs/t", None), ("GET", job.path(), None),
                               ("POST", "/v1/jobs/t", {}),
                               ("POST", job.path("/cancel"), {}),
                               ("POST", job.path(f"/proxy/{AGENT_PORT}/v1/exec"),
                                {"cmd": "touch /root/stranger"})]:
        r = plat.request(method, path, body, token=other)
        assert r.status == 403, (method, path, r)
    assert not os.path.exists(job.node().root_path(job.id, "/root/stranger"))
    assert job.inspect()["stage"] == "RUNNING"
    # positive control: the same token works in its own namespace
    assert plat.request("GET", "/v1/jobs/elsewhere", token=other).status == 200


def test_other_namespace_read_token_is_403(plat, job):
    """The namespace check holds for read tokens too (reading jobs, proxying into them)."""
    reader = plat.token("peeker", "elsewhere", "read")
    for method, path, body in [("GET", "/v1/jobs/t", None), ("GET", job.path(), None),
                               ("POST", job.path(f"/proxy/{AGENT_PORT}/v1/exec"),
                                {"cmd": "touch /root/peeker"})]:
        r = plat.request(method, path, body, token=reader)
        assert r.status == 403, f"namespace check: a read token of another namespace: " \
                                f"{method} {path} -> {r}"
    assert not os.path.exists(job.node().root_path(job.id, "/root/peeker"))
    # positive control: the same token reads its own namespace
    assert plat.request("GET", "/v1/jobs/elsewhere", token=reader).status == 200


# ---- create validation ------------------------------------------------------------------------

BAD_CREATES = {
    "unknown field": {"secrets": {"SBX_TOKEN": "t" * 32}, "colour": "blue"},
    "bad flavor": {"flavor": "gpu-huge"},
    "bad flavor type": {"flavor": 3},
    "bad env name": {"env": {"1BAD": "x"}},
    "env name with dash": {"env": {"A-B": "x"}},
    "env value not a string": {"env": {"A": 1}},
    "label carries a secret": {"secrets": {"API_KEY": "hunter2-value"},
                               "labels": {"note": "hunter2-value"}},
    "expose port 0": {"expose": [{"port": 0, "protocol": "http"}]},
    "expose bad protocol": {"expose": [{"port": 8080, "protocol": "ftp"}]},
    "expose not an array": {"expose": {"port": 8080}},
    "expose unknown key": {"expose": [{"port": 8080, "protocol": "http", "x": 1}]},
    "bad substrate": {"substrate": "vm"},
    "command not strings": {"command": ["/bin/true", 3]},
    "not an object": [],
    "not json": b"{nope",
}


@pytest.mark.parametrize("case", list(BAD_CREATES))
def test_create_validation(plat, case):
    def ids():
        return {j["id"] for j in plat.request("GET", "/v1/jobs/validation").json()}
    before = ids()
    r = plat.request("POST", "/v1/jobs/validation", BAD_CREATES[case])
    assert r.status == 400, r
    err = r.json().get("error")
    assert isinstance(err, str) and err, r
    assert ids() == before  # nothing created
    if case == "label carries a secret":
        assert "hunter2-value" not in r.text


def test_create_positive_control(plat):
    """The valid neighbour of every refused body above is accepted."""
    r = plat.request("POST", "/v1/jobs/validation", {
        "flavor": "cpu-small", "env": {"A_B": "x"}, "labels": {"note": "public"},
        "secrets": {"SBX_TOKEN": "t" * 32, "API_KEY": "hunter2-value"},
        "expose": [{"port": 8080, "protocol": "http"}, {"port": 8081, "protocol": "websocket"}],
        "command": ["sbx-server"], "image": "host", "substrate": "process", "timeout": 60})
    assert r.status == 201, r
    j = r.json()
    assert j["stage"] == "SCHEDULING" and len(j["id"]) == 24
    assert sorted(j["secret_names"]) == ["API_KEY", "SBX_TOKEN"]
    assert "hunter2-value" not in r.text
    assert plat.request("POST", f"/v1/jobs/validation/{j['id']}/cancel", {}).status == 202


# ---- list with label selectors ----------------------------------------------------------------

def test_list_label_selectors(plat):
    specs = {"a": {"app": "web", "env": "prod"}, "b": {"app": "web", "env": "dev"},
             "c": {"app": "db"}, "d": {}}
    ids = {}
    for name, labels in specs.items():
        r = plat.request("POST", "/v1/jobs/sel", {"labels": labels,
                                                  "secrets": {"SBX_TOKEN": "s" * 32}})
        assert r.status == 201, r
        ids[name] = r.json()["id"]

    def ls(query=""):
        r = plat.request("GET", "/v1/jobs/sel" + query)
        assert r.status == 200, r
        return {ids_by_id[j["id"]] for j in r.json()}

    ids_by_id = {v: k for k, v in ids.items()}
    assert ls() == {"a", "b", "c", "d"}
    assert ls("?label=app=web") == {"a", "b"}
    assert ls("?label=app") == {"a", "b", "c"}
    assert ls("?label=env") == {"a", "b"}
    assert ls("?label=app=web&label=env=prod") == {"a"}
    assert ls("?label=app=web&label=env") == {"a", "b"}
    assert ls("?label=app=db&label=env") == set()
    assert ls("?label=app=nope") == set()
    assert ls("?label=missing") == set()
    for i in ids.values():
        assert plat.request("POST", f"/v1/jobs/sel/{i}/cancel", {}).status == 202


# ---- secrets ----------------------------------------------------------------------------------

def test_secrets_reach_the_command_and_nothing_else(plat):
    secret = "s3cr3t-" + secrets.token_hex(12)
    job = plat.create("t", secrets_={"API_SECRET": secret}, env={"PLAIN": "visible"},
                      labels={"kind": "secret-test"})
    # It did reach the command's environment (and the plain env too).
    res = job.exec('printf "%s|%s" "$API_SECRET" "$PLAIN"')
    assert res.out == f"{secret}|visible", res
    j = job.inspect()
    assert sorted(j["secret_names"]) == ["API_SECRET", "SBX_TOKEN"]
    assert j["env"] == {"PLAIN": "visible"}
    # Never in inspect, list, or anywhere in the API answers.
    for r in (plat.request("GET", job.path()), plat.request("GET", "/v1/jobs/t"),
              plat.request("GET", "/v1/jobs/t?label=kind=secret-test"),
              plat.request("GET", "/v1/nodes")):
        assert r.status == 200, r
        assert secret not in r.text and job.token not in r.text
    node = job.node()
    # Never in the node's run record, nor in any process's log.
    with open(os.path.join(node.run_dir(job.id), "run.json")) as f:
        rec = f.read()
    assert secret not in rec and job.token not in rec
    # pause + resume hands the secrets to the node again: still never logged
    assert job.action("pause").status == 202
    job.wait_stage("PAUSED")
    assert job.action("resume").status == 202
    job.wait_stage("RUNNING", generation=2)
    assert job.exec('printf "%s" "$API_SECRET"').out == secret
    job.cancel()
    for proc in [c.proc for c in plat.controls] + [n.proc for n in plat.nodes]:
        text = proc.log()
        assert job.id in text  # positive control: this log does talk about the job
        assert secret not in text and job.token not in text, proc.name


# ---- store errors -------------------------------------------------------------------------------

def _sql(plat, query):
    out = subprocess.run(["sqlite3", "-cmd", ".timeout 5000",
                          os.path.join(plat.ctl_state, "store.db"), query],
                         capture_output=True, timeout=20)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode().strip()


def test_a_job_record_that_cannot_be_read_is_not_404(plat, job):
    """A store failure is no answer about the job. Changed mapping (issue 14, one table:
    control/records.c:status_from_store_err): reading a job record failed with 404 "no job"
    whatever the error; now only a missing record is 404, a record the control plane cannot
    read is 500 and a store that cannot be read 503."""
    fake = job.id[:-4] + ("0000" if not job.id.endswith("0000") else "1111")
    missing = plat.request("GET", f"/v1/jobs/t/{fake}")
    assert missing.status == 404, ("positive control: a job that is not there is 404", missing)
    key = f"jobs/t/{fake}"
    _sql(plat, f"INSERT INTO kv(key, value, rev) VALUES ('{key}', 'not json', "
               f"(SELECT COALESCE(MAX(rev), 0) + 1 FROM kv))")
    try:
        r = plat.request("GET", f"/v1/jobs/t/{fake}")
        assert r.status == 500, ("store error check: an unreadable job record answered", r)
        r = plat.request("POST", f"/v1/jobs/t/{fake}/cancel", {})
        assert r.status == 500, ("store error check: cancel of an unreadable record", r)
    finally:
        _sql(plat, f"DELETE FROM kv WHERE key = '{key}'")
    assert plat.request("GET", f"/v1/jobs/t/{job.id}").status == 200  # the real job is intact


# ---- lifecycle --------------------------------------------------------------------------------

def test_cancel_stops_the_run(plat):
    job = plat.create("t")
    node = job.node()
    rec = node.run_record(job.id)
    pid = rec["pid"]
    assert os.path.exists(f"/proc/{pid}") and os.path.isdir(node.run_dir(job.id))
    job.sh("sleep 300 > /dev/null 2>&1 & echo started")
    r = job.action("cancel")
    assert r.status == 202, r
    j = job.wait_stage("CANCELED")
    assert j["run"]["state"] == "retired", j
    assert wait_until(lambda: not os.path.exists(node.run_dir(job.id)), 10)
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 5)
    r = job.exec_raw("true")
    assert r.status in (404, 409), r  # no running run to reach
    # (pause/resume/move of an ended job: test_refused_lifecycle_actions_are_409)
    assert job.action("cancel").status == 202  # cancel is idempotent
    assert job.inspect()["stage"] == "CANCELED"


def test_pause_then_resume_keeps_files_with_a_new_generation(plat):
    job = plat.create("t")
    gen = job.run()["generation"]
    job.sh("echo kept > /root/keep.txt; mkdir -p /var/data && echo deep > /var/data/x")
    pid = job.node().run_record(job.id)["pid"]
    assert job.action("pause").status == 202
    j = job.wait_stage("PAUSED")
    assert wait_until(lambda: job.inspect()["run"]["state"] == "paused", 10), job.inspect()
    assert wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 5)
    r = job.exec_raw("true")
    assert r.status == 409, r  # paused: nothing serves it
    assert job.action("resume").status == 202
    j = job.wait_stage("RUNNING", generation=gen + 1)
    assert j["run"]["generation"] == gen + 1 and j["generation"] == gen + 1
    assert job.sh("cat /root/keep.txt /var/data/x") == "kept\ndeep\n"
    job.cancel()


def test_refused_lifecycle_actions_are_409():
    """resume of a running job, and pause/resume/move of an ended one: 409 naming the stage.
    Its own platform: a use-after-free here once took the control plane down (ASan)."""
    p = Platform(nodes=("api-n2",))
    try:
        job = p.create("t")
        r = job.action("resume")
        assert r.status == 409, r
        assert r.json()["error"] == "resume: the job is not paused (stage RUNNING)", r
        job.cancel()
        for action in ("pause", "resume", "move"):
            r = job.action(action)
            assert r.status == 409, r
            assert r.json()["error"] == f"{action}: the job has ended (stage CANCELED)", r
    finally:
        p.stop()


# ---- file modes -------------------------------------------------------------------------------

def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_secret_files_and_directories_are_private(plat, job):
    assert mode(plat.token_file) == 0o600
    assert mode(plat.ctl_state) == 0o700
    assert mode(plat.join_token_file) == 0o600
    node = job.node()
    assert mode(node.state) == 0o700
    assert mode(node.run_dir(job.id)) == 0o700
    br = os.path.join(node.run_dir(job.id), "br")
    assert mode(br) == 0o700 and os.stat(br).st_uid == os.getuid()
    assert stat.S_ISSOCK(os.stat(os.path.join(br, "a.sock")).st_mode)
    with open(plat.token_file) as f:
        assert f.read().strip() == plat.admin
