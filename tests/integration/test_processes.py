# SPDX-License-Identifier: MIT
"""Background processes: the p-<n> registry, kill/delete semantics, timeouts, output
re-attach, streaming stdin, signals with a grace period, the finished-entry cap and reaping
(mirrors the reference `process-supervision` and `lifecycle-race` suites)."""
import json
import os
import time


from conftest import output_of, wait_until
from rawclient import RawConn, request_bytes


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone between open() and read()
        return False


def start(server, body):
    st, j = server.json("POST", "/v1/processes", body)
    assert st == 200, j
    return j


def get(server, pid_id):
    st, j = server.json("GET", f"/v1/processes/{pid_id}")
    assert st == 200, j
    return j


def listed(server):
    st, j = server.json("GET", "/v1/processes")
    assert st == 200
    return {e["id"]: e for e in j}


def finished(server, pid_id, timeout=5):
    return wait_until(lambda: (lambda e: e if not e["running"] else None)(get(server, pid_id)),
                      timeout)


def attach(server, pid_id, query="", timeout=30):
    st, hdrs, data = server.request("GET", f"/v1/processes/{pid_id}/output{query}",
                                    timeout=timeout)
    assert st == 200, data
    assert hdrs["content-type"].startswith("application/x-ndjson")
    return [json.loads(l) for l in data.split(b"\n") if l]


# ---- create and list -----------------------------------------------------------------------

def test_create_echoes_cmd_exactly(server):
    j = start(server, {"cmd": "sleep 30", "tag": "t1"})
    assert set(j) == {"id", "pid", "cmd", "tag"}
    assert j["id"].startswith("p-") and j["id"][2:].isdigit()
    assert isinstance(j["pid"], int) and pid_alive(j["pid"])
    assert j["cmd"] == "sleep 30" and j["tag"] == "t1"
    argv = ["sh", "-c", "exit 3", "caf\u00e9", "", " spaced "]
    k = start(server, {"cmd": argv})
    assert k["cmd"] == argv and k["tag"] is None
    assert k["id"] != j["id"]
    assert int(k["id"][2:]) > int(j["id"][2:])


def test_exec_background_returns_id(server, tmp_path):
    marker = tmp_path / "bg"
    st, j = server.json("POST", "/v1/exec",
                        {"cmd": f"sleep 0.2; echo hi > {marker}", "background": True, "tag": "b"})
    assert st == 200
    assert set(j) == {"id", "pid", "tag"} and j["tag"] == "b"
    assert j["id"].startswith("p-")
    e = finished(server, j["id"])
    assert e and e["exit_code"] == 0
    assert marker.read_text() == "hi\n"


def test_list_fields_and_exit_codes(server):
    now_ms = time.time() * 1000
    a = start(server, {"cmd": ["sleep", "30"], "tag": "long"})
    b = start(server, {"cmd": "exit 7"})
    c = start(server, {"cmd": "kill -9 $$"})
    assert finished(server, b["id"]) and finished(server, c["id"])
    procs = listed(server)
    ea, eb, ec = procs[a["id"]], procs[b["id"]], procs[c["id"]]
    assert ea["running"] is True and ea["exit_code"] is None and ea["pid"] == a["pid"]
    assert ea["cmd"] == ["sleep", "30"] and ea["tag"] == "long"
    assert abs(ea["started_at_ms"] - now_ms) < 10000
    assert eb["running"] is False and eb["exit_code"] == 7
    assert ec["running"] is False and ec["exit_code"] is None and ec["signal"] == 9
    # oldest first
    ids = list(procs)
    assert ids.index(a["id"]) < ids.index(b["id"]) < ids.index(c["id"])


def test_spawn_failure_and_bad_specs(server):
    st, j = server.json("POST", "/v1/processes", {"cmd": ["/nonexistent/prog"]})
    assert st == 400 and j["error"]
    st, j = server.json("POST", "/v1/processes", {"cmd": []})
    assert st == 400
    st, j = server.json("POST", "/v1/processes", {"cmd": "x", "shell": False})
    assert st == 400
    assert listed(server) == {}


# ---- delete --------------------------------------------------------------------------------

def test_delete_ids(server):
    j = start(server, {"cmd": ["sleep", "30"]})
    for bad in (str(j["pid"]), "abc", "p-", "p-x1", "p--1", "1-p"):
        st, r = server.json("DELETE", f"/v1/processes/{bad}")
        assert st == 400, (bad, r)
    st, r = server.json("DELETE", "/v1/processes/p-999")
    assert st == 404
    assert pid_alive(j["pid"]), "a refused delete must not kill anything"
    st, r = server.json("DELETE", f"/v1/processes/{j['id']}")
    assert st == 200 and r == {"id": j["id"], "killed": True}
    assert wait_until(lambda: not pid_alive(j["pid"]), 2)
    e = finished(server, j["id"])
    assert e["signal"] == 9 and e["exit_code"] is None
    st, r = server.json("DELETE", f"/v1/processes/{j['id']}")
    assert st == 200 and r["killed"] is False


def test_delete_kills_the_group(server, tmp_path):
    pidfile = tmp_path / "child"
    j = start(server, {"cmd": f"sleep 300 & echo $! > {pidfile}; wait"})
    child = int(wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 2))
    assert pid_alive(child)
    st, r = server.json("DELETE", f"/v1/processes/{j['id']}")
    assert r["killed"] is True
    assert wait_until(lambda: not pid_alive(child), 2)


def test_delete_of_exited_process(server):
    j = start(server, {"cmd": "true"})
    assert finished(server, j["id"])
    st, r = server.json("DELETE", f"/v1/processes/{j['id']}")
    assert st == 200 and r["killed"] is False


def test_background_timeout(server):
    t0 = time.monotonic()
    j = start(server, {"cmd": ["sleep", "30"], "timeout": 0.5})
    e = finished(server, j["id"], timeout=3)
    assert e, "timeout did not apply to a background process"
    assert time.monotonic() - t0 < 2.5
    assert e["timed_out"] is True and e["signal"] == 9
    k = start(server, {"cmd": ["sleep", "0.1"], "timeout": 5})
    e = finished(server, k["id"])
    assert e["timed_out"] is False and e["exit_code"] == 0


# ---- output re-attach ----------------------------------------------------------------------

def test_output_replay_and_follow(server):
    j = start(server, {"cmd": "echo a; echo e1 >&2; sleep 0.8; echo b; exit 4"})
    time.sleep(0.3)
    t0 = time.monotonic()
    ev = attach(server, j["id"])
    assert time.monotonic() - t0 >= 0.3, "follow returned before the process ended"
    assert ev[0]["event"] == "start" and ev[0]["pid"] == j["pid"]
    assert output_of(ev) == b"a\nb\n"
    assert output_of(ev, "stderr") == b"e1\n"
    assert ev[-1]["event"] == "exit" and ev[-1]["exit_code"] == 4
    # replay after the end: same content, ends at once
    ev2 = attach(server, j["id"])
    assert output_of(ev2) == b"a\nb\n" and ev2[-1]["exit_code"] == 4


def test_output_no_follow(server):
    j = start(server, {"cmd": "echo now; sleep 30"})
    assert wait_until(lambda: b"now" in output_of(attach(server, j["id"], "?follow=false")), 2)
    t0 = time.monotonic()
    ev = attach(server, j["id"], "?follow=false")
    assert time.monotonic() - t0 < 1
    assert output_of(ev) == b"now\n"
    assert all(e["event"] != "exit" for e in ev)


def test_output_attach_large_log_completes(server):
    # more than the socket buffers take at once: the replay must not stall after a flush
    j = start(server, {"cmd": "head -c 900000 /dev/zero | tr '\\0' q"})
    assert finished(server, j["id"])
    with RawConn(server, timeout=10) as c:
        c.send(request_bytes("GET", f"/v1/processes/{j['id']}/output", token=server.token))
        st, _ = c.read_head()
        assert st == 200
        ev = list(c.events())
    assert output_of(ev) == b"q" * 900000
    assert ev[-1]["event"] == "exit" and ev[-1]["exit_code"] == 0


def test_output_binary_base64(server):
    j = start(server, {"cmd": r"printf 'x\377\000y'"})
    assert finished(server, j["id"])
    ev = attach(server, j["id"], "?encoding=base64")
    import base64
    data = b"".join(base64.b64decode(e["data"]) for e in ev if e["event"] == "stdout")
    assert data == b"x\xff\x00y"
    st, _, _ = server.request("GET", f"/v1/processes/{j['id']}/output?encoding=latin1")
    assert st == 400


def test_attach_unknown(server):
    st, _, _ = server.request("GET", "/v1/processes/p-999/output")
    assert st == 404
    st, _, _ = server.request("GET", "/v1/processes/1234/output")
    assert st == 400


# ---- stdin stream --------------------------------------------------------------------------

def test_stdin_stream(server, tmp_path):
    out = tmp_path / "in"
    j = start(server, {"cmd": f"cat > {out}", "stdin": True})
    part1 = bytes(range(256)) * 1000          # 256 KB, more than a pipe holds
    part2 = b"\x00tail\xff"
    st, r = server.json("POST", f"/v1/processes/{j['id']}/stdin", part1)
    assert st == 200 and r["written"] == len(part1) and r["closed"] is False
    assert get(server, j["id"])["running"] is True
    st, r = server.json("POST", f"/v1/processes/{j['id']}/stdin?close=true", part2)
    assert st == 200 and r["written"] == len(part2) and r["closed"] is True
    e = finished(server, j["id"])
    assert e["exit_code"] == 0
    assert out.read_bytes() == part1 + part2
    # closed now: more stdin is refused
    st, r = server.json("POST", f"/v1/processes/{j['id']}/stdin", b"more")
    assert st == 409


def test_stdin_close_with_empty_body(server):
    j = start(server, {"cmd": "wc -c", "stdin": True})
    st, r = server.json("POST", f"/v1/processes/{j['id']}/stdin", b"12345")
    assert st == 200
    st, r = server.json("POST", f"/v1/processes/{j['id']}/stdin?close=true")
    assert st == 200 and r["closed"] is True
    assert finished(server, j["id"])
    assert output_of(attach(server, j["id"])).strip() == b"5"


def test_stdin_not_open(server):
    j = start(server, {"cmd": ["sleep", "30"]})
    st, r = server.json("POST", f"/v1/processes/{j['id']}/stdin", b"x")
    assert st == 409
    # a command that has no stdin sees EOF at once
    k = start(server, {"cmd": "cat; echo eof"})
    e = finished(server, k["id"])
    assert e and output_of(attach(server, k["id"])) == b"eof\n"


# ---- signals with grace --------------------------------------------------------------------

def test_signal_term_exits_15(server):
    j = start(server, {"cmd": ["sleep", "30"]})
    st, r = server.json("POST", f"/v1/processes/{j['id']}/signal", {"signal": "TERM"})
    assert st == 200 and r["signaled"] is True
    e = finished(server, j["id"], 3)
    assert e["signal"] == 15 and e["exit_code"] is None


def test_signal_grace_escalates_to_kill(server, tmp_path):
    ready = tmp_path / "ready"
    j = start(server, {"cmd": f"trap '' TERM; touch {ready}; sleep 30"})
    assert wait_until(ready.exists, 3)
    t0 = time.monotonic()
    st, r = server.json("POST", f"/v1/processes/{j['id']}/signal",
                        {"signal": "TERM", "grace_secs": 0.6})
    assert st == 200 and r["signaled"] is True
    time.sleep(0.3)
    assert get(server, j["id"])["running"] is True, "TERM was not ignored: vacuous test"
    e = finished(server, j["id"], 3)
    assert e and e["signal"] == 9
    assert 0.5 <= time.monotonic() - t0 < 2.5


def test_signal_grace_not_needed(server):
    # exits on TERM well before the grace period: the later KILL must hit nothing
    j = start(server, {"cmd": ["sleep", "30"]})
    st, r = server.json("POST", f"/v1/processes/{j['id']}/signal",
                        {"signal": 15, "grace_secs": 0.3})
    e = finished(server, j["id"], 3)
    assert e["signal"] == 15
    time.sleep(0.4)
    assert get(server, j["id"])["signal"] == 15


def test_signal_bad_requests(server):
    j = start(server, {"cmd": ["sleep", "30"]})
    for body in ({"signal": "NOPE"}, {"signal": 0}, {"signal": 99}, {"signal": "TERM",
                                                                      "grace_secs": -1}):
        st, r = server.json("POST", f"/v1/processes/{j['id']}/signal", body)
        assert st == 400, body
    assert get(server, j["id"])["running"] is True
    st, r = server.json("POST", "/v1/processes/p-999/signal", {"signal": "TERM"})
    assert st == 404


def test_delete_with_grace(server, tmp_path):
    ready = tmp_path / "ready"
    j = start(server, {"cmd": f"trap 'echo bye; exit 0' TERM; touch {ready}; "
                              f"while :; do sleep 0.05; done"})
    assert wait_until(ready.exists, 3)
    st, r = server.json("DELETE", f"/v1/processes/{j['id']}?grace=2")
    assert st == 200 and r["killed"] is True
    e = finished(server, j["id"], 3)
    assert e and e["exit_code"] == 0  # it handled TERM and left on its own


# ---- registry bounds and reaping -----------------------------------------------------------

def test_registry_caps_finished_keeps_running(server):
    keep = [start(server, {"cmd": ["sleep", "60"], "tag": f"keep{i}"}) for i in range(2)]
    with RawConn(server) as c:
        ids = []
        for i in range(300):
            c.send(request_bytes("POST", "/v1/processes", token=server.token,
                                 body={"cmd": ["true"], "tag": str(i)}))
            st, _, body = c.response()
            assert st == 200
            ids.append(json.loads(body)["id"])
    assert wait_until(lambda: sum(e["running"] for e in listed(server).values()) == 2, 10)
    procs = listed(server)
    done = [e for e in procs.values() if not e["running"]]
    assert len(done) <= 256
    assert len(done) >= 200  # vacuity guard: the cap, not a wipe
    for k in keep:
        assert k["id"] in procs and procs[k["id"]]["running"] is True
    assert ids[-1] in procs, "the newest finished entries are kept"
    assert ids[0] not in procs, "the oldest finished entries are evicted"
    st, _ = server.json("GET", f"/v1/processes/{ids[0]}")
    assert st == 404


def zombies_of(ppid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if rest[0] == "Z" and int(rest[1]) == ppid:
            out.append(int(d))
    return out


def test_no_zombies_from_setsid_grandchildren(server, tmp_path):
    # grandchildren that escape with setsid are re-parented to the server (subreaper) and
    # must be reaped when they exit
    pids = tmp_path / "pids"
    st, ev = server.exec({"cmd": f"for i in 1 2 3; do setsid sh -c 'echo $$ >> {pids}; "
                                 f"sleep 0.3' & done; sleep 0.05"})
    assert st == 200 and ev[-1]["exit_code"] == 0
    start(server, {"cmd": f"setsid sh -c 'echo $$ >> {pids}; sleep 0.3' & exit 0"})
    assert wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 4, 3)
    escaped = [int(p) for p in pids.read_text().split()]
    # vacuity guard: they really escaped and were re-parented to the server (subreaper)
    def ppid(p):
        try:
            with open(f"/proc/{p}/stat") as f:
                return int(f.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError):
            return None
    assert wait_until(lambda: any(ppid(p) == server.proc.pid for p in escaped), 1)
    assert wait_until(lambda: not any(pid_alive(p) for p in escaped), 3)
    time.sleep(0.3)
    assert zombies_of(server.proc.pid) == []
    for p in escaped:
        assert not os.path.exists(f"/proc/{p}"), f"{p} left as a zombie"


def test_exit_codes_not_stolen_by_reaper(server):
    js = [start(server, {"cmd": f"sleep 0.2; exit {c}"}) for c in (0, 7, 1, 3)]
    for j, code in zip(js, (0, 7, 1, 3)):
        e = finished(server, j["id"])
        assert e["exit_code"] == code


def test_one_shot_stdin_larger_than_a_pipe(server, tmp_path):
    data = "".join(chr(ord("a") + i % 26) for i in range(300000))
    j = start(server, {"cmd": "cat", "stdin": data})
    e = finished(server, j["id"])
    assert e and e["exit_code"] == 0
    assert output_of(attach(server, j["id"])) == data.encode()
    st, k = server.json("POST", "/v1/exec", {"cmd": "wc -c", "stdin": data, "background": True})
    assert st == 200 and finished(server, k["id"])
    assert output_of(attach(server, k["id"])).strip() == b"300000"


def test_output_since(server):
    j = start(server, {"cmd": "echo a; sleep 0.2; echo b"})
    assert finished(server, j["id"])
    ev = attach(server, j["id"])
    assert output_of(ev) == b"a\nb\n"
    # resume after the first event only
    ev = attach(server, j["id"], "?since=1")
    assert output_of(ev) == b"b\n" and ev[-1]["event"] == "exit"
    # a cursor past the end is not an endless wait
    ev = attach(server, j["id"], "?since=999999&follow=false", timeout=5)
    assert output_of(ev) == b"" and ev[-1]["event"] == "exit"
    ev = attach(server, j["id"], "?since=999999", timeout=5)
    assert ev[-1]["event"] == "exit"


def test_stdin_stream_several_large_writes(server, tmp_path):
    # each write is larger than the pipe, so each one pauses and resumes on the pipe
    out = tmp_path / "in"
    j = start(server, {"cmd": f"cat > {out}", "stdin": True})
    parts = [bytes([65 + i]) * 300000 for i in range(3)]
    for part in parts:
        st, r = server.json("POST", f"/v1/processes/{j['id']}/stdin", part, timeout=10)
        assert st == 200 and r["written"] == len(part)
    st, r = server.json("POST", f"/v1/processes/{j['id']}/stdin?close=true")
    assert st == 200 and r["closed"] is True
    assert finished(server, j["id"])
    assert out.read_bytes() == b"".join(parts)
