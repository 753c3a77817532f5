# SPDX-License-Identifier: MIT
"""E2B's envd on sbx-server: the Connect protocol (JSON codec) spoken straight to a server the
test starts, in dedicated mode and in pool mode (docs/e2b.md, "envd on the agent")."""
import base64
import gzip
import http.client
import json
import os
import struct
import tempfile
import threading
import time
import urllib.parse
import uuid

import pytest

from conftest import health_while, wait_until

STREAM_CT = "application/connect+json"


def b64(data):
    return base64.b64encode(data).decode()


class Envd:
    """A Connect client for one sbx-server (prefix: a pool sandbox's /v1/sandboxes/<id>)."""

    def __init__(self, server, token, prefix=""):
        self.server = server
        self.token = token
        self.prefix = prefix

    def headers(self, extra=None, token=None):
        h = {"Connect-Protocol-Version": "1"}
        tok = self.token if token is None else token
        if tok:
            h["X-Access-Token"] = tok
        h.update(extra or {})
        return h

    def conn(self, timeout=30):
        return http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=timeout)

    def unary(self, method, body, token=None, headers=None, raw=None):
        """POST /<service>/<Method> as application/json: (status, json)."""
        c = self.conn()
        data = raw if raw is not None else json.dumps(body).encode()
        h = self.headers({"Content-Type": "application/json"}, token)
        h.update(headers or {})
        c.request("POST", self.prefix + "/" + method, body=data, headers=h)
        r = c.getresponse()
        out = r.read()
        c.close()
        try:
            return r.status, json.loads(out) if out else None
        except ValueError:
            return r.status, out

    def open_stream(self, method, body, token=None, headers=None, timeout=30):
        """Start a server stream; return the response (read it with read_message)."""
        c = self.conn(timeout)
        payload = json.dumps(body).encode()
        h = self.headers({"Content-Type": STREAM_CT, "Keepalive-Ping-Interval": "50"}, token)
        h.update(headers or {})
        c.request("POST", self.prefix + "/" + method, body=struct.pack(">BI", 0, len(payload)) +
                  payload, headers=h)
        r = c.getresponse()
        r._sbx_conn = c
        return r

    @staticmethod
    def read_message(r):
        """(flags, json) of the next envelope, or None at the end of the body."""
        head = r.read(5)
        if not head:
            return None
        assert len(head) == 5, head
        flags, n = struct.unpack(">BI", head)
        data = r.read(n)
        assert len(data) == n
        return flags, json.loads(data)

    def stream(self, method, body, **kw):
        """Run a stream to its end: (status, [messages], end-stream json)."""
        r = self.open_stream(method, body, **kw)
        msgs, end = [], None
        if r.status != 200:
            return r.status, r.read(), None
        assert r.getheader("Content-Type") == STREAM_CT
        while True:
            m = self.read_message(r)
            if m is None:
                break
            flags, j = m
            if flags & 2:
                end = j
                break
            msgs.append(j)
        assert r.read() == b""  # nothing after the end-stream envelope
        r._sbx_conn.close()
        return r.status, msgs, end

    def run(self, cmd, args=(), **kw):
        """Start a command and collect its stream: (events, end-stream)."""
        body = {"process": {"cmd": cmd, "args": list(args)}, "stdin": False}
        for k in ("envs", "cwd"):
            if k in kw:
                body["process"][k] = kw.pop(k)
        body.update(kw.pop("body", {}))
        st, msgs, end = self.stream("process.Process/Start", body, **kw)
        assert st == 200, (st, msgs)
        return [m["event"] for m in msgs], end


def hangup(r):
    """Drop a stream's connection (the SDK's disconnect): the server sees it closed."""
    import socket
    try:
        r._sbx_conn.sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    r._sbx_conn.close()


def output(events, stream="stdout"):
    return b"".join(base64.b64decode(e["data"][stream]) for e in events
                    if "data" in e and stream in e["data"])


def the_end(events):
    ends = [e["end"] for e in events if "end" in e]
    assert len(ends) == 1, events
    return ends[0]


@pytest.fixture
def envd(server):
    return Envd(server, server.token)


# ---- Connect framing and auth ----------------------------------------------------------------

def test_start_streams_output_and_exit(envd):
    ev, end = envd.run("/bin/sh", ["-c", "printf hello; printf oops >&2; exit 3"])
    assert set(ev[0]) == {"start"} and isinstance(ev[0]["start"]["pid"], int)
    assert output(ev) == b"hello"
    assert output(ev, "stderr") == b"oops"
    assert the_end(ev) == {"exitCode": 3, "exited": True, "status": "exit status 3",
                           "error": "exit status 3"}
    assert "end" in ev[-1]
    assert end == {}


def test_start_success_has_no_error_and_binary_output_is_exact(envd):
    ev, end = envd.run("/bin/sh", ["-c", r"printf '\377\000\001'"])
    assert output(ev) == b"\xff\x00\x01"
    assert the_end(ev) == {"exitCode": 0, "exited": True, "status": "exit status 0"}
    assert end == {}


def test_start_envs_and_cwd(envd):
    d = tempfile.mkdtemp(prefix="sbx-envd-")
    try:
        ev, _ = envd.run("/bin/sh", ["-c", 'printf "%s|" "$FOO"; pwd'], envs={"FOO": "bar baz"},
                         cwd=d)
        assert output(ev) == f"bar baz|{d}\n".encode()
    finally:
        os.rmdir(d)


def test_start_of_a_missing_command_ends_the_stream_with_an_error(envd):
    st, msgs, end = envd.stream("process.Process/Start",
                                {"process": {"cmd": "/nonexistent/cmd"}, "stdin": False})
    assert st == 200  # a stream's error travels in its end envelope
    assert msgs == []
    assert end["error"]["code"] == "invalid_argument"
    assert "/nonexistent/cmd" in end["error"]["message"]


def test_wrong_access_token_is_401(envd):
    for tok in ("0" * 64, "wrong"):
        st, j = envd.unary("process.Process/List", {}, token=tok)
        assert st == 401 and j["code"] == "unauthenticated", ("envd access token check", tok, j)
    c = envd.conn()
    c.request("POST", "/process.Process/List", body=b"{}",
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 401 and json.loads(r.read())["code"] == "unauthenticated", \
        "envd access token check: no token"
    st, _, _ = envd.stream("process.Process/Start", {"process": {"cmd": "/bin/true"}},
                           token="0" * 64)
    assert st == 401, "envd access token check: a stream"
    # positive control: the right token, and our own header, are accepted
    assert envd.unary("process.Process/List", {})[0] == 200
    st, j = envd.unary("process.Process/List", {}, token="",
                       headers={"X-Sandbox-Token": envd.token})
    assert st == 200 and j == {"processes": []}


def test_files_need_the_token(envd, server):
    path = tempfile.mktemp(prefix="sbx-envd-")
    c = envd.conn()
    c.request("POST", "/files?path=" + urllib.parse.quote(path), body=b"x",
              headers={"X-Access-Token": "0" * 64, "Content-Type": "application/octet-stream"})
    r = c.getresponse()
    assert r.status == 401 and json.loads(r.read())["code"] == 401
    assert not os.path.exists(path)
    c.request("POST", "/files?path=" + urllib.parse.quote(path), body=b"x",
              headers={"X-Access-Token": envd.token, "Content-Type": "application/octet-stream"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    r.read()
    try:
        with open(path, "rb") as f:
            assert f.read() == b"x"
    finally:
        os.unlink(path)


def test_protocol_errors(envd):
    st, j = envd.unary("process.Process/NoSuchMethod", {})
    assert st == 404
    st, j = envd.unary("process.Process/List", None, raw=b"{not json")
    assert st == 400 and j["code"] == "invalid_argument"
    st, j = envd.unary("process.Process/List", None, raw=b"{}",
                       headers={"Content-Type": "application/proto"})
    assert st == 415
    # a stream method called as unary, and the other way round
    st, _ = envd.unary("process.Process/Start", {"process": {"cmd": "/bin/true"}})
    assert st == 415
    st, _, _ = envd.stream("process.Process/List", {})
    assert st == 415
    # a stream body that is not one envelope
    c = envd.conn()
    c.request("POST", "/process.Process/Start", body=b"\x00\x00\x00\x00\x09{}",
              headers=envd.headers({"Content-Type": STREAM_CT}))
    r = c.getresponse()
    body = r.read()
    assert r.status == 200
    flags, n = struct.unpack(">BI", body[:5])
    assert flags == 2 and json.loads(body[5:5 + n])["error"]["code"] == "invalid_argument"
    # a request envelope with flags (end-stream is the server's; 0x80 is no flag at all): refused
    # before anything runs, and a message with a duplicate key says so
    msg = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "touch /tmp/flagged"]}})
    for flag in (0x02, 0x80):
        c = envd.conn()
        c.request("POST", "/process.Process/Start",
                  body=struct.pack(">BI", flag, len(msg)) + msg.encode(),
                  headers=envd.headers({"Content-Type": STREAM_CT}))
        body = c.getresponse().read()
        flags, n = struct.unpack(">BI", body[:5])
        err = json.loads(body[5:5 + n]).get("error", {})
        assert flags == 2 and err.get("code") == "invalid_argument" and "flags" in err.get(
            "message", ""), f"FLAGGED ENVELOPE TAKEN: {body[:300]!r}"
    st, j = envd.unary("filesystem.Filesystem/Stat", None, raw=b'{"path": "/", "path": "/x"}')
    assert st == 400 and "duplicate" in j["message"], j
    # positive control: the same envelope without flags runs
    c = envd.conn()
    c.request("POST", "/process.Process/Start",
              body=struct.pack(">BI", 0, len(msg)) + msg.encode(),
              headers=envd.headers({"Content-Type": STREAM_CT}))
    r = c.getresponse()
    body = r.read()
    assert r.status == 200 and b'"start"' in body and b'"error"' not in body, body[:300]


def test_unary_chunked_body(envd, server):
    """E2B's JS SDK sends bodies chunked: decoded, answered, the connection goes on."""
    c = envd.conn()
    body = json.dumps({"path": "/"}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    c.putrequest("POST", "/filesystem.Filesystem/Stat")
    for k, v in envd.headers({"Content-Type": "application/json",
                              "Transfer-Encoding": "chunked"}).items():
        c.putheader(k, v)
    c.endheaders(chunked)
    r = c.getresponse()
    j = json.loads(r.read())
    assert r.status == 200 and j["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    c.request("POST", "/filesystem.Filesystem/Stat", body=body,
              headers=envd.headers({"Content-Type": "application/json"}))
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["entry"]["path"] == "/"


def test_keepalive_events(envd):
    ev, end = envd.run("/bin/sh", ["-c", "sleep 2.3; echo done"],
                       headers={"Keepalive-Ping-Interval": "1"})
    assert sum(1 for e in ev if "keepalive" in e) >= 2
    assert output(ev) == b"done\n" and the_end(ev)["exitCode"] == 0


def test_connect_timeout_kills_the_command(envd):
    t0 = time.monotonic()
    ev, end = envd.run("/bin/sleep", ["30"], headers={"Connect-Timeout-Ms": "300"})
    assert time.monotonic() - t0 < 10
    assert the_end(ev) == {"exitCode": -1, "exited": False, "status": "signal: killed",
                           "error": "signal: killed"}
    assert end["error"]["code"] == "deadline_exceeded"


# ---- processes: stdin, list, connect, signals ------------------------------------------------

class Reader(threading.Thread):
    """Reads a stream's messages in the background."""

    def __init__(self, r):
        super().__init__(daemon=True)
        self.r = r
        self.msgs = []
        self.end = None
        self.start()

    def run(self):
        while True:
            try:
                m = Envd.read_message(self.r)
            except Exception as e:  # the test hung up: the stream is over
                self.error = e
                return
            if m is None:
                return
            if m[0] & 2:
                self.end = m[1]
                return
            self.msgs.append(m[1])

    def events(self):
        return [m["event"] for m in list(self.msgs)]

    def pid(self):
        ev = wait_until(lambda: self.events(), 5)
        assert ev and "start" in ev[0], ev
        return ev[0]["start"]["pid"]


def test_send_input_and_close_stdin(envd):
    r = envd.open_stream("process.Process/Start", {"process": {"cmd": "/bin/cat"}, "stdin": True})
    rd = Reader(r)
    pid = rd.pid()
    st, j = envd.unary("process.Process/SendInput",
                       {"process": {"pid": pid}, "input": {"stdin": b64(b"hi\x00there\n")}})
    assert (st, j) == (200, {})
    assert wait_until(lambda: output(rd.events()) == b"hi\x00there\n", 5)
    assert envd.unary("process.Process/CloseStdin", {"process": {"pid": pid}}) == (200, {})
    rd.join(10)
    assert the_end(rd.events())["exitCode"] == 0 and rd.end == {}


def test_large_input_waits_for_the_reader(envd):
    """More than a pipe holds: the answer comes once the command has read it all."""
    data = os.urandom(300 * 1024)
    r = envd.open_stream("process.Process/Start", {
        "process": {"cmd": "/bin/sh", "args": ["-c", "sleep 0.5; wc -c"]}, "stdin": True})
    rd = Reader(r)
    pid = rd.pid()
    st, j = envd.unary("process.Process/SendInput",
                       {"process": {"pid": pid}, "input": {"stdin": b64(data)}})
    assert (st, j) == (200, {})
    envd.unary("process.Process/CloseStdin", {"process": {"pid": pid}})
    rd.join(10)
    assert output(rd.events()).strip() == str(len(data)).encode()


def test_list_connect_by_tag_and_kill(envd):
    r = envd.open_stream("process.Process/Start", {
        "process": {"cmd": "/bin/sh", "args": ["-c", "echo up; sleep 30"],
                    "envs": {"A": "1"}, "cwd": "/"}, "tag": "svc", "stdin": False})
    rd = Reader(r)
    pid = rd.pid()
    assert wait_until(lambda: output(rd.events()) == b"up\n", 5)
    st, j = envd.unary("process.Process/List", {})
    assert st == 200
    assert j["processes"] == [{"pid": pid, "tag": "svc", "config": {
        "cmd": "/bin/sh", "args": ["-c", "echo up; sleep 30"], "envs": {"A": "1"}, "cwd": "/"}}]
    # re-attach by tag: the start event names the same pid
    r2 = envd.open_stream("process.Process/Connect", {"process": {"tag": "svc"}})
    rd2 = Reader(r2)
    assert rd2.pid() == pid
    assert envd.unary("process.Process/SendSignal",
                      {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}) == (200, {})
    rd.join(10)
    rd2.join(10)
    for x in (rd, rd2):
        assert the_end(x.events())["status"] == "signal: killed"
        assert x.end == {}
    assert output(rd.events()) == b"up\n"
    assert wait_until(lambda: envd.unary("process.Process/List", {})[1] == {"processes": []})


def test_disconnect_leaves_the_process_running_and_connect_by_pid(envd):
    r = envd.open_stream("process.Process/Start", {
        "process": {"cmd": "/bin/sh", "args": ["-c", "read x; echo got $x"]}, "stdin": True})
    pid = Envd.read_message(r)[1]["event"]["start"]["pid"]
    hangup(r)  # the SDK's disconnect()
    time.sleep(0.2)
    assert [p["pid"] for p in envd.unary("process.Process/List", {})[1]["processes"]] == [pid]
    rd = Reader(envd.open_stream("process.Process/Connect", {"process": {"pid": pid}}))
    assert rd.pid() == pid
    envd.unary("process.Process/SendInput", {"process": {"pid": pid},
                                             "input": {"stdin": b64(b"it\n")}})
    rd.join(10)
    assert output(rd.events()) == b"got it\n" and the_end(rd.events())["exitCode"] == 0


def test_unknown_pid_is_not_found(envd):
    for m, extra in (("SendSignal", {"signal": "SIGNAL_SIGKILL"}), ("CloseStdin", {}),
                     ("SendInput", {"input": {"stdin": "eA=="}})):
        st, j = envd.unary("process.Process/" + m, dict({"process": {"pid": 999999}}, **extra))
        assert st == 404 and j["code"] == "not_found", (m, st, j)
    st, msgs, end = envd.stream("process.Process/Connect", {"process": {"tag": "nope"}})
    assert st == 200 and msgs == [] and end["error"]["code"] == "not_found"


def test_sigterm(envd):
    rd = Reader(envd.open_stream("process.Process/Start",
                                 {"process": {"cmd": "/bin/sleep", "args": ["30"]}, "stdin": False}))
    pid = rd.pid()
    assert envd.unary("process.Process/SendSignal",
                      {"process": {"pid": pid}, "signal": "SIGNAL_SIGTERM"}) == (200, {})
    rd.join(10)
    assert the_end(rd.events()) == {"exitCode": -1, "exited": False,
                                    "status": "signal: terminated", "error": "signal: terminated"}


# ---- filesystem ------------------------------------------------------------------------------

def fs(envd, method, body):
    return envd.unary("filesystem.Filesystem/" + method, body)


def test_filesystem_rpcs(envd):
    d = tempfile.mkdtemp(prefix="sbx-envd-")
    try:
        st, j = fs(envd, "MakeDir", {"path": d + "/a/b"})
        assert st == 200
        e = j["entry"]
        assert (e["name"], e["type"], e["path"]) == ("b", "FILE_TYPE_DIRECTORY", d + "/a/b")
        assert e["permissions"] == "drwxr-xr-x" and e["mode"] == 0o755
        st, j = fs(envd, "MakeDir", {"path": d + "/a/b"})
        assert st == 409 and j["code"] == "already_exists"
        with open(d + "/a/f.txt", "wb") as f:
            f.write(b"12345")
        st, j = fs(envd, "Stat", {"path": d + "/a/f.txt"})
        e = j["entry"]
        assert st == 200 and e["type"] == "FILE_TYPE_FILE" and e["size"] == "5"
        os.chmod(d + "/a/f.txt", 0o640)
        st, j = fs(envd, "Stat", {"path": d + "/a/f.txt"})
        e = j["entry"]
        assert e["permissions"] == "-rw-r-----" and e["mode"] == 0o640
        assert e["modifiedTime"].endswith("Z") and e["owner"] == "0"
        st, j = fs(envd, "ListDir", {"path": d + "/a", "depth": 1})
        assert st == 200
        assert sorted((x["name"], x["path"]) for x in j["entries"]) == [
            ("b", d + "/a/b"), ("f.txt", d + "/a/f.txt")]
        with open(d + "/a/b/deep", "wb"):
            pass
        st, j = fs(envd, "ListDir", {"path": d, "depth": 3})
        assert sorted(x["path"] for x in j["entries"]) == [
            d + "/a", d + "/a/b", d + "/a/b/deep", d + "/a/f.txt"]
        st, j = fs(envd, "Move", {"source": d + "/a/f.txt", "destination": d + "/g.txt"})
        assert st == 200 and j["entry"]["path"] == d + "/g.txt" and j["entry"]["size"] == "5"
        assert not os.path.exists(d + "/a/f.txt")
        os.symlink("g.txt", d + "/ln")
        st, j = fs(envd, "Stat", {"path": d + "/ln"})
        assert j["entry"]["type"] == "FILE_TYPE_SYMLINK" and j["entry"]["symlinkTarget"] == "g.txt"
        st, j = fs(envd, "ListDir", {"path": d})
        assert {x["name"]: x.get("symlinkTarget") for x in j["entries"]}["ln"] == "g.txt"
        assert fs(envd, "Remove", {"path": d + "/a"}) == (200, {})
        assert not os.path.exists(d + "/a")
        st, j = fs(envd, "Stat", {"path": d + "/a"})
        assert st == 404 and j["code"] == "not_found"
        st, j = fs(envd, "ListDir", {"path": d + "/g.txt"})
        assert st == 400 and j["code"] == "failed_precondition"
        st, j = fs(envd, "Stat", {})
        assert st == 400 and j["code"] == "invalid_argument"
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


# ---- /files ----------------------------------------------------------------------------------

def multipart(parts, boundary="----sbxboundary"):
    out = b""
    for name, filename, data in parts:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; "
                f"filename=\"{filename}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
                ).encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_list_dir_of_a_huge_directory_lets_other_requests_through(envd, server, huge_dir):
    # 400,000 entries: read at once they held every other request for about half a second;
    # ListDir reads a batch per turn of the loop, so a request sent while it runs is answered
    # first (the order is checked, not a time), and it answers at most 50,000 entries
    d = huge_dir(400000)
    (d / "sub").mkdir()
    (d / "sub" / "inner").touch()

    def lister():
        # the answer's head marks the end of the listing's work on the loop (its 10 MB body
        # streams after it)
        c = envd.conn()
        try:
            c.request("POST", "/filesystem.Filesystem/ListDir",
                      body=json.dumps({"path": str(d), "depth": 2}).encode(),
                      headers=envd.headers({"Content-Type": "application/json"}))
            r = c.getresponse()
            at = time.monotonic()
            return (r.status, json.loads(r.read())), at
        except OSError as e:  # a connection closed without an answer
            return (None, repr(e)), time.monotonic()
        finally:
            c.close()
    (st, j), status, health_first = health_while(server, lister, 0.02)  # the listing has begun
    assert status == 200
    assert st == 200, j  # positive control: the listing itself is whole and right
    paths = [e["path"] for e in j["entries"]]
    assert len(paths) == 50000, len(paths)
    assert paths[:3] == [str(d / "f000000"), str(d / "f000001"), str(d / "f000002")]
    assert paths[-1] == str(d / "f049999")
    assert health_first, "the listing held the loop until it ended"
    # depth: a directory's entries, each followed by what is under it
    st, j = fs(envd, "ListDir", {"path": str(d / "sub"), "depth": 2})
    assert st == 200 and [e["path"] for e in j["entries"]] == [str(d / "sub" / "inner")]


def files_request(envd, method, query, body=None, headers=None, chunked=False, prefix=None):
    c = envd.conn()
    h = envd.headers(headers)
    path = (envd.prefix if prefix is None else prefix) + "/files" + query
    if chunked:
        c.putrequest(method, path)
        for k, v in dict(h, **{"Transfer-Encoding": "chunked"}).items():
            c.putheader(k, v)
        pieces = [body[i:i + 1000] for i in range(0, len(body), 1000)]
        c.endheaders(b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n")
    else:
        c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data


def test_files_multipart_several_parts_chunked_and_download(envd):
    d = tempfile.mkdtemp(prefix="sbx-envd-")
    try:
        big = os.urandom(200 * 1024)
        body, ct = multipart([("file", d + "/one.txt", b"first"),
                              ("file", d + "/sub/two.bin", big)])
        st, _, data = files_request(envd, "POST", "", body, {"Content-Type": ct}, chunked=True)
        assert st == 200, data
        assert json.loads(data) == [
            {"name": "one.txt", "type": "file", "path": d + "/one.txt"},
            {"name": "two.bin", "type": "file", "path": d + "/sub/two.bin"}]
        st, h, data = files_request(envd, "GET", "?path=" + urllib.parse.quote(d + "/sub/two.bin"))
        assert st == 200 and data == big and h["content-type"] == "application/octet-stream"
        # one part, its destination in ?path=
        body, ct = multipart([("file", "ignored-name", b"by query")])
        st, _, data = files_request(envd, "POST", "?path=" + urllib.parse.quote(d + "/q.txt") +
                                    "&username=user", body, {"Content-Type": ct})
        assert st == 200 and json.loads(data)[0]["path"] == d + "/q.txt"
        with open(d + "/q.txt", "rb") as f:
            assert f.read() == b"by query"
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def test_files_octet_stream_gzip_and_errors(envd):
    d = tempfile.mkdtemp(prefix="sbx-envd-")
    try:
        q = "?path=" + urllib.parse.quote(d + "/raw.bin")
        st, _, data = files_request(envd, "POST", q, b"\x00raw\xff",
                                    {"Content-Type": "application/octet-stream"}, chunked=True)
        assert st == 200 and json.loads(data)[0]["name"] == "raw.bin"
        assert files_request(envd, "GET", q)[2] == b"\x00raw\xff"
        payload = b"compressed " * 1000
        st, _, data = files_request(envd, "POST", q, gzip.compress(payload),
                                    {"Content-Type": "application/octet-stream",
                                     "Content-Encoding": "gzip"})
        assert st == 200, data
        assert files_request(envd, "GET", q)[2] == payload
        st, _, data = files_request(envd, "POST", q, b"x", {"Content-Encoding": "br"})
        assert st == 406
        st, _, data = files_request(envd, "GET", "?path=" + urllib.parse.quote(d + "/missing"))
        assert st == 404 and json.loads(data)["code"] == 404
        st, _, data = files_request(envd, "GET", "?path=" + urllib.parse.quote(d))
        assert st == 400
        st, _, data = files_request(envd, "POST", "", b"x",
                                    {"Content-Type": "application/octet-stream"})
        assert st == 400
        st, h, data = files_request(envd, "PUT", q, b"x")
        assert st == 405 and h["allow"] == "GET, POST"
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def test_health_unauthenticated(server):
    st, _, data = server.request("GET", "/health", token=False)
    assert st == 200 and json.loads(data)["status"] == "ok"


# ---- pool mode: the same routes per sandbox, confined ----------------------------------------

def sandbox_envd(sb):
    return Envd(sb.server, sb.token, prefix=f"/v1/sandboxes/{sb.id}")


def test_pool_start_runs_as_the_sandbox(make_host_server):
    host = make_host_server()
    a, b = host.create(2)
    ea, eb = sandbox_envd(a), sandbox_envd(b)
    ev, end = ea.run("/bin/sh", ["-c", "id -u; pwd"])
    assert output(ev) == f"{a.uid}\n{a.home}\n".encode() and end == {}
    # another sandbox's token, the host token, no token: 401; positive control above
    for tok in (b.token, host.token, "0" * 64):
        st, j = ea.unary("process.Process/List", {}, token=tok)
        assert st == 401 and j["code"] == "unauthenticated", ("envd sandbox token check", tok)
    st, _, _ = files_request(ea, "GET", "?path=/x", headers={"X-Access-Token": b.token})
    assert st == 401
    # processes are per sandbox: b neither lists nor signals a's process
    rd = Reader(ea.open_stream("process.Process/Start",
                               {"process": {"cmd": "/bin/sleep", "args": ["30"]}, "tag": "t"}))
    pid = rd.pid()
    assert eb.unary("process.Process/List", {}) == (200, {"processes": []}), \
        "envd process scoping: a sibling lists it"
    st, j = eb.unary("process.Process/SendSignal",
                     {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})
    assert st == 404 and j["code"] == "not_found", "envd process scoping: a sibling signals it"
    assert [p["pid"] for p in ea.unary("process.Process/List", {})[1]["processes"]] == [pid]
    assert ea.unary("process.Process/SendSignal",
                    {"process": {"tag": "t"}, "signal": "SIGNAL_SIGKILL"}) == (200, {})
    rd.join(10)
    assert the_end(rd.events())["status"] == "signal: killed"
    st, _, data = host.request("GET", a.path("/health"), token=False,
                               headers={"X-Access-Token": a.token})
    assert st == 200 and json.loads(data) == {"status": "ok"}
    st, _, _ = host.request("GET", a.path("/health"), token=False,
                            headers={"X-Access-Token": b.token})
    assert st == 401


def test_pool_files_confined_to_the_home(make_host_server):
    host = make_host_server()
    sb = host.sandbox()
    e = sandbox_envd(sb)
    body, ct = multipart([("file", "/docs/a.txt", b"in home")])
    st, _, data = files_request(e, "POST", "", body, {"Content-Type": ct})
    assert st == 200, data
    st_ = os.stat(os.path.join(sb.home, "docs/a.txt"))
    assert st_.st_uid == sb.uid
    with open(os.path.join(sb.home, "docs/a.txt"), "rb") as f:
        assert f.read() == b"in home"
    assert files_request(e, "GET", "?path=/docs/a.txt")[2] == b"in home"
    # a symlink the sandbox made to a host file: never followed (positive control: the
    # regular file above reads; the host file exists and is readable to the server)
    ev, _ = e.run("/bin/ln", ["-s", "/etc", "etc-link"])
    assert the_end(ev)["exitCode"] == 0 and os.path.islink(os.path.join(sb.home, "etc-link"))
    assert os.path.exists("/etc/hostname") or os.path.exists("/etc/passwd")
    st, _, data = files_request(e, "GET", "?path=/etc-link/passwd")
    assert st != 200 and b"root:" not in data
    st, j = fs(e, "ListDir", {"path": "/etc-link"})
    assert st != 200
    st, j = fs(e, "Stat", {"path": "/etc-link"})  # reported as what it is, not followed
    assert st == 200 and j["entry"]["type"] == "FILE_TYPE_SYMLINK"
    assert j["entry"]["symlinkTarget"] == "/etc"
    st, _, data = files_request(e, "POST", "?path=/etc-link/sbx-envd-" + uuid.uuid4().hex,
                                b"x", {"Content-Type": "application/octet-stream"})
    assert st != 200
    # ".." stays in the home
    st, j = fs(e, "Stat", {"path": "/../../.."})
    assert st == 200 and j["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    st, j = fs(e, "ListDir", {"path": "/../.."})
    assert st == 200 and {x["name"] for x in j["entries"]} >= {"docs", "etc-link"}
    # Filesystem RPCs and Remove work in the home
    st, j = fs(e, "MakeDir", {"path": "/made/deep"})
    assert st == 200 and os.stat(os.path.join(sb.home, "made/deep")).st_uid == sb.uid
    assert fs(e, "Remove", {"path": "/made"}) == (200, {})
    assert not os.path.exists(os.path.join(sb.home, "made"))


# ---- PTY -------------------------------------------------------------------------------------

PTY_SCRIPT = ("printf 'tty=%s\\n' $(cut -d' ' -f7 /proc/$$/stat); stty size; read x; "
              "echo \"got $x\"; stty size")


def test_pty_start_input_and_resize(envd):
    rd = Reader(envd.open_stream("process.Process/Start", {
        "process": {"cmd": "/bin/sh", "args": ["-c", PTY_SCRIPT]},
        "pty": {"size": {"cols": 100, "rows": 30}}}))
    pid = rd.pid()
    assert wait_until(lambda: b"30 100" in output(rd.events(), "pty"), 5), rd.events()
    out = output(rd.events(), "pty")
    tty_nr = int(out.split(b"tty=")[1].split(b"\r\n")[0])
    assert tty_nr != 0  # the pty is the session's controlling terminal
    assert envd.unary("process.Process/Update", {
        "process": {"pid": pid}, "pty": {"size": {"cols": 120, "rows": 40}}}) == (200, {})
    assert envd.unary("process.Process/SendInput",
                      {"process": {"pid": pid}, "input": {"pty": b64(b"hello\n")}}) == (200, {})
    rd.join(10)
    ev = rd.events()
    out = output(ev, "pty")
    assert b"hello\r\n" in out  # the terminal echoes, and turns \n into \r\n
    assert b"got hello\r\n" in out and out.endswith(b"40 120\r\n")
    assert not any("stdout" in e.get("data", {}) or "stderr" in e.get("data", {}) for e in ev)
    assert the_end(ev)["exitCode"] == 0 and rd.end == {}


def test_update_of_a_process_without_pty(envd):
    rd = Reader(envd.open_stream("process.Process/Start",
                                 {"process": {"cmd": "/bin/sleep", "args": ["30"]}}))
    pid = rd.pid()
    st, j = envd.unary("process.Process/Update",
                       {"process": {"pid": pid}, "pty": {"size": {"cols": 1, "rows": 1}}})
    assert st == 400 and j["code"] == "failed_precondition"
    st, j = envd.unary("process.Process/Update",
                       {"process": {"pid": pid}, "pty": {"size": {"cols": 0, "rows": 1}}})
    assert st == 400 and j["code"] == "invalid_argument"
    envd.unary("process.Process/SendSignal", {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"})
    rd.join(10)


def test_pool_pty_runs_confined(make_host_server):
    host = make_host_server()
    sb = host.sandbox()
    e = sandbox_envd(sb)
    rd = Reader(e.open_stream("process.Process/Start", {
        "process": {"cmd": "/bin/sh", "args": ["-c", "id -u; " + PTY_SCRIPT]},
        "pty": {"size": {"cols": 90, "rows": 20}}}))
    pid = rd.pid()
    assert wait_until(lambda: b"20 90" in output(rd.events(), "pty"), 5), rd.events()
    e.unary("process.Process/SendInput", {"process": {"pid": pid}, "input": {"pty": b64(b"x\n")}})
    rd.join(10)
    out = output(rd.events(), "pty")
    assert out.startswith(f"{sb.uid}\r\n".encode()) and b"got x\r\n" in out
    assert int(out.split(b"tty=")[1].split(b"\r\n")[0]) != 0
    assert the_end(rd.events())["exitCode"] == 0


# ---- directory watches -----------------------------------------------------------------------

def fs_events(msgs):
    return [(m["filesystem"]["name"], m["filesystem"]["type"]) for m in msgs if "filesystem" in m]


def test_watch_dir_stream(envd):
    d = tempfile.mkdtemp(prefix="sbx-envd-")
    try:
        os.mkdir(d + "/sub")
        r = envd.open_stream("filesystem.Filesystem/WatchDir",
                             {"path": d, "recursive": True, "includeEntry": True})
        assert r.status == 200
        assert Envd.read_message(r) == (0, {"start": {}})
        rd = Reader(r)
        with open(d + "/a.txt", "wb") as f:
            f.write(b"1")
        os.mkdir(d + "/sub/new")
        # the server watches a new directory before it reports its creation
        assert wait_until(lambda: ("sub/new", "EVENT_TYPE_CREATE") in fs_events(rd.msgs), 5)
        with open(d + "/sub/new/deep.txt", "wb"):
            pass
        os.chmod(d + "/a.txt", 0o600)
        os.rename(d + "/a.txt", d + "/b.txt")
        os.unlink(d + "/b.txt")
        want = [("a.txt", "EVENT_TYPE_CREATE"), ("a.txt", "EVENT_TYPE_WRITE"),
                ("sub/new", "EVENT_TYPE_CREATE"), ("sub/new/deep.txt", "EVENT_TYPE_CREATE"),
                ("a.txt", "EVENT_TYPE_CHMOD"), ("a.txt", "EVENT_TYPE_RENAME"),
                ("b.txt", "EVENT_TYPE_CREATE"), ("b.txt", "EVENT_TYPE_REMOVE")]
        assert wait_until(lambda: all(x in fs_events(rd.msgs) for x in want), 5), rd.msgs
        ev = fs_events(rd.msgs)
        assert ev.index(("a.txt", "EVENT_TYPE_CREATE")) < ev.index(("b.txt", "EVENT_TYPE_REMOVE"))
        created = [m["filesystem"] for m in rd.msgs if "filesystem" in m and
                   m["filesystem"]["name"] == "sub/new"][0]
        assert created["entry"]["type"] == "FILE_TYPE_DIRECTORY"
        assert created["entry"]["path"] == d + "/sub/new"
        hangup(r)
        rd.join(5)
        assert not rd.is_alive()
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def test_watch_dir_errors(envd):
    st, msgs, end = envd.stream("filesystem.Filesystem/WatchDir", {"path": "/nonexistent/dir"})
    assert st == 200 and msgs == [] and end["error"]["code"] == "not_found"
    st, msgs, end = envd.stream("filesystem.Filesystem/WatchDir", {"path": "/etc/passwd"})
    assert end["error"]["code"] == "failed_precondition"


def test_polled_watcher(envd):
    d = tempfile.mkdtemp(prefix="sbx-envd-")
    try:
        st, j = fs(envd, "CreateWatcher", {"path": d, "recursive": False})
        assert st == 200 and len(j["watcherId"]) == 32
        wid = j["watcherId"]
        assert fs(envd, "GetWatcherEvents", {"watcherId": wid}) == (200, {"events": []})
        os.mkdir(d + "/x")
        with open(d + "/x/inner", "wb"):
            pass  # not recursive: not seen
        st, j = fs(envd, "GetWatcherEvents", {"watcherId": wid})
        assert st == 200 and j["events"] == [{"name": "x", "type": "EVENT_TYPE_CREATE"}]
        assert fs(envd, "GetWatcherEvents", {"watcherId": wid}) == (200, {"events": []})
        assert fs(envd, "RemoveWatcher", {"watcherId": wid}) == (200, {})
        st, j = fs(envd, "GetWatcherEvents", {"watcherId": wid})
        assert st == 404 and j["code"] == "not_found"
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def test_pool_watchers_are_per_sandbox_and_confined(make_host_server):
    host = make_host_server()
    a, b = host.create(2)
    ea, eb = sandbox_envd(a), sandbox_envd(b)
    st, j = fs(ea, "CreateWatcher", {"path": "/", "recursive": True})
    assert st == 200
    wid = j["watcherId"]
    st, j = fs(eb, "GetWatcherEvents", {"watcherId": wid})
    assert st == 404 and j["code"] == "not_found", "envd watcher scoping: a sibling reads it"
    ea.run("/bin/sh", ["-c", "mkdir d && touch d/f"])
    st, j = fs(ea, "GetWatcherEvents", {"watcherId": wid})
    names = {(e["name"], e["type"]) for e in j["events"]}
    assert ("d", "EVENT_TYPE_CREATE") in names
    # a symlink out of the home is not followed: watching through it is refused
    ea.run("/bin/ln", ["-s", "/etc", "etc-link"])
    st, j = fs(ea, "CreateWatcher", {"path": "/etc-link"})
    assert st != 200
    st, msgs, end = ea.stream("filesystem.Filesystem/WatchDir", {"path": "/etc-link"})
    assert msgs == [] and end["error"]["code"] in ("failed_precondition", "invalid_argument",
                                                   "permission_denied")
    # positive control: a real directory of the home is watched
    st, j = fs(ea, "CreateWatcher", {"path": "/d"})
    assert st == 200


def server_inotify_fds(host):
    n = 0
    for fd in os.listdir(f"/proc/{host.proc.pid}/fd"):
        try:
            n += os.readlink(f"/proc/{host.proc.pid}/fd/{fd}") == "anon_inode:inotify"
        except OSError:
            pass
    return n


def test_pool_watches_are_budgeted_and_freed_with_their_sandbox(make_host_server):
    """Each watch is an inotify instance of the server's uid (root), whose kernel limits are
    the host's: a sandbox holds at most 8 watches and 4096 watched directories (its siblings
    and the host's other users keep theirs), and a deleted sandbox's watches, polled and
    streams, are closed with it, not at some later call."""
    host = make_host_server()
    a, b = host.create(2)
    ea, eb = sandbox_envd(a), sandbox_envd(b)
    before = server_inotify_fds(host)
    wids = []
    for i in range(8):
        st, j = fs(ea, "CreateWatcher", {"path": "/"})
        assert st == 200, (i, st, j)  # positive control: eight are fine
        wids.append(j["watcherId"])
    st, j = fs(ea, "CreateWatcher", {"path": "/"})
    assert st == 429 and j["code"] == "resource_exhausted", \
        ("ATTACK: a sandbox took more than its share of inotify instances", st, j)
    assert "max 8" in j["message"], j
    assert server_inotify_fds(host) == before + 8
    st, j = fs(eb, "CreateWatcher", {"path": "/"})  # the sibling's share is its own
    assert st == 200, (st, j)
    # directories: 3,000 of them, watched twice over is past a sandbox's 4,096
    eb.run("/bin/sh", ["-c", "mkdir -p t && cd t && seq 3000 | xargs mkdir"])
    st, j = fs(eb, "CreateWatcher", {"path": "/t", "recursive": True})
    assert st == 200, (st, j)
    st, j = fs(eb, "CreateWatcher", {"path": "/t", "recursive": True})
    assert st == 429 and "watched directories" in j["message"], \
        ("ATTACK: a sandbox watched more than its share of directories", st, j)
    # one given back makes room for a stream of A's; then A goes, and every inotify instance
    # of its with it at once
    assert fs(ea, "RemoveWatcher", {"watcherId": wids.pop()}) == (200, {})
    assert server_inotify_fds(host) == before + 7 + 2
    done = {}
    t = threading.Thread(target=lambda: done.update(
        r=sandbox_envd(a).stream("filesystem.Filesystem/WatchDir", {"path": "/"}, timeout=20)))
    t.start()
    assert wait_until(lambda: server_inotify_fds(host) == before + 7 + 2 + 1, 5), \
        server_inotify_fds(host)
    assert a.delete()[0] == 200
    assert server_inotify_fds(host) == before + 2, \
        ("a deleted sandbox's watches were left open", server_inotify_fds(host))
    t.join(20)
    assert done["r"][2]["error"]["code"] == "not_found", done  # the stream ended, and says why


# ---- E2B's own SDK against the agent ---------------------------------------------------------

E2B_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "e2b")


def run_sdk(url, token, workdir, pwd, presigned=True):
    import shutil
    import subprocess
    if not os.path.exists(os.path.join(E2B_DIR, "node_modules", "e2b", "package.json")):
        pytest.skip("E2B's SDK is not installed (scripts/setup.sh installs it)")
    env = dict(os.environ, E2B_SANDBOX_URL=url, SBX_ENVD_TOKEN=token, SBX_ENVD_DIR=workdir,
               SBX_ENVD_PWD=pwd, SBX_ENVD_PRESIGNED="1" if presigned else "0")
    r = subprocess.run([shutil.which("node") or "node", "envd_agent.mjs"], cwd=E2B_DIR, env=env,
                       capture_output=True, text=True, timeout=120)
    steps = [json.loads(line)["step"] for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0, r.stdout + r.stderr
    assert steps[-1] == "done" and "pty" in steps and "watchDir" in steps, steps
    assert ("uploadUrl" in steps) == presigned, steps


@pytest.mark.skip_ok("a compatibility check with a client library; the protocol is tested above")
def test_e2b_sdk_against_the_dedicated_agent(server):
    d = tempfile.mkdtemp(prefix="sbx-envd-sdk-")
    try:
        run_sdk(f"http://127.0.0.1:{server.port}", server.token, d, d)
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skip_ok("a compatibility check with a client library; the protocol is tested above")
def test_e2b_sdk_against_a_pool_sandbox(make_host_server):
    host = make_host_server()
    sb = host.sandbox()
    assert sb.run("mkdir work").code == 0
    # presigned URLs drop a base path (the SDK's new URL("/files", base)): the edge maps them
    # by host name; test_pool_presigned_urls_use_the_sandbox_token checks them here
    run_sdk(f"http://127.0.0.1:{host.port}/v1/sandboxes/{sb.id}", sb.token, "/work",
            sb.home + "/work", presigned=False)
    assert os.stat(os.path.join(sb.home, "work/made/moved.txt")).st_uid == sb.uid


def test_pool_sandbox_deleted_under_a_stream(make_host_server):
    host = make_host_server()
    sb = host.sandbox()
    e = sandbox_envd(sb)
    rd = Reader(e.open_stream("process.Process/Start",
                              {"process": {"cmd": "/bin/sleep", "args": ["60"]}}))
    pid = rd.pid()
    r = e.open_stream("filesystem.Filesystem/WatchDir", {"path": "/"})
    assert Envd.read_message(r) == (0, {"start": {}})
    wd = Reader(r)
    st, j = sb.delete()
    assert st == 200, j
    rd.join(10)
    assert not rd.is_alive()
    # the process went with its sandbox: its stream ends with an error that says so
    assert rd.end["error"]["code"] == "aborted", (rd.end, rd.events())
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    hangup(r)
    wd.join(5)
    st, j = e.unary("process.Process/List", {})
    assert st == 401  # the sandbox and its token are gone


# ---- presigned /files URLs -------------------------------------------------------------------

def signed_query(path, op, token, user=None, exp=None):
    import hashlib
    raw = f"{path}:{op}:{user or ''}:{token}" + (f":{exp}" if exp is not None else "")
    sig = "v1_" + base64.b64encode(hashlib.sha256(raw.encode()).digest()).decode().rstrip("=")
    q = {"path": path, "signature": sig}
    if user is not None:
        q["username"] = user
    if exp is not None:
        q["signature_expiration"] = str(exp)
    return "?" + urllib.parse.urlencode(q)


def test_presigned_files_urls(envd):
    d = tempfile.mkdtemp(prefix="sbx-envd-")
    try:
        p = d + "/signed file.txt"
        with open(p, "wb") as f:
            f.write(b"signed")
        tok = envd.token

        def get(q):
            c = envd.conn()
            c.request("GET", "/files" + q)  # no token header at all
            r = c.getresponse()
            return r.status, r.read()

        assert get(signed_query(p, "read", tok)) == (200, b"signed")
        assert get(signed_query(p, "read", tok, user="user")) == (200, b"signed")
        assert get(signed_query(p, "read", tok, exp=int(time.time()) + 60)) == (200, b"signed")
        # refused: expired, another operation, another path, user or token, no signature
        assert get(signed_query(p, "read", tok, exp=int(time.time()) - 5))[0] == 401, \
            "presigned expiry check"
        assert get(signed_query(p, "write", tok))[0] == 401, "presigned operation check"
        assert get(signed_query(d + "/other", "read", tok).replace(
            urllib.parse.quote_plus(d + "/other"), urllib.parse.quote_plus(p)))[0] == 401
        q = signed_query(p, "read", tok, user="user").replace("username=user", "username=root")
        assert get(q)[0] == 401, "presigned user check"
        assert get(signed_query(p, "read", "0" * 64))[0] == 401, "presigned signature check"
        assert get("?" + urllib.parse.urlencode({"path": p}))[0] == 401, "presigned: none"
        body, ct = multipart([("file", "x", b"uploaded")])
        c = envd.conn()
        # a read signature does not upload
        c.request("POST", "/files" + signed_query(d + "/up2.txt", "read", tok), body=body,
                  headers={"Content-Type": ct})
        r = c.getresponse()
        r.read()
        assert r.status == 401 and not os.path.exists(d + "/up2.txt"), \
            "presigned operation check: a read signature uploads"
        # a signed upload
        q = signed_query(d + "/up.txt", "write", tok, exp=int(time.time()) + 60)
        c.request("POST", "/files" + q, body=body, headers={"Content-Type": ct})
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())[0]["path"] == d + "/up.txt"
        with open(d + "/up.txt", "rb") as f:
            assert f.read() == b"uploaded"
    finally:
        import shutil
        shutil.rmtree(d, ignore_errors=True)


def test_pool_presigned_urls_use_the_sandbox_token(make_host_server):
    host = make_host_server()
    a, b = host.create(2)
    assert a.run("echo -n mine > f").code == 0

    def get(sb, q):
        c = http.client.HTTPConnection("127.0.0.1", host.port, timeout=10)
        c.request("GET", sb.path("/files") + q)
        r = c.getresponse()
        return r.status, r.read()

    assert get(a, signed_query("/f", "read", a.token)) == (200, b"mine")
    assert get(a, signed_query("/f", "read", b.token))[0] == 401, "presigned sandbox token check"
    assert get(a, signed_query("/f", "read", host.token))[0] == 401, \
        "presigned sandbox token check: the host token"
    assert get(b, signed_query("/f", "read", a.token))[0] == 401, \
        "presigned sandbox token check: a sibling's path"
