# SPDX-License-Identifier: MIT
"""The file API of a dedicated sbx-server (/v1/files/...), driven over HTTP against the real
binary: exact bytes in and out, ranged reads and writes, listing pages, lstat semantics,
recursive delete that never follows symlinks, rename, and the precise refusals."""
import json
import os
import socket
import stat
import time
import urllib.parse

import pytest

from conftest import health_while


def q(**params):
    return urllib.parse.urlencode(params)


def write(server, path, data, method="PUT", **params):
    status, _, body = server.request(method, f"/v1/files/write?{q(path=str(path), **params)}",
                                     body=data, headers={"Content-Type":
                                                         "application/octet-stream"})
    return status, json.loads(body) if body else None


def read(server, path, **params):
    status, hdrs, body = server.request("GET", f"/v1/files/read?{q(path=str(path), **params)}")
    return status, hdrs, body


def jget(server, route, **params):
    return server.json("GET", f"/v1/files/{route}?{q(**params)}")


# ---- write and read ------------------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 65537, 5 * 1024 * 1024])
def test_round_trip_is_byte_exact(server, tmp_path, size):
    data = os.urandom(size)
    target = tmp_path / "blob.bin"
    status, j = write(server, target, data)
    assert status == 200, j
    assert j == {"path": str(target), "size": size}
    assert target.read_bytes() == data  # what landed on disk
    status, hdrs, body = read(server, target)
    assert status == 200
    assert hdrs["content-type"] == "application/octet-stream"
    assert int(hdrs["content-length"]) == size
    assert body == data


def test_read_offset_and_length(server, tmp_path):
    data = os.urandom(10000)
    (tmp_path / "f").write_bytes(data)
    f = tmp_path / "f"
    cases = [({"offset": 0, "length": 10}, data[:10]),
             ({"offset": 1234, "length": 4321}, data[1234:5555]),
             ({"offset": 9990, "length": 100}, data[9990:]),  # clipped at the end
             ({"offset": 9000}, data[9000:]),
             ({"length": 7}, data[:7]),
             ({"offset": 10000}, b""),
             ({"offset": 20000, "length": 5}, b"")]  # past the end: nothing, not an error
    for params, want in cases:
        status, hdrs, body = read(server, f, **params)
        assert status == 200, params
        assert int(hdrs["content-length"]) == len(want), params
        assert body == want, params


def test_write_without_offset_truncates(server, tmp_path):
    f = tmp_path / "t"
    assert write(server, f, b"a much longer first version")[0] == 200
    status, j = write(server, f, b"short")
    assert status == 200 and j["size"] == 5
    assert f.read_bytes() == b"short"


def test_write_with_offset_does_not_truncate(server, tmp_path):
    f = tmp_path / "o"
    f.write_bytes(b"0123456789")
    status, j = write(server, f, b"AB", offset=3)
    assert status == 200 and j["size"] == 10
    assert f.read_bytes() == b"012AB56789"
    # past the end: the gap reads as zeros
    status, j = write(server, f, b"Z", offset=12)
    assert status == 200 and j["size"] == 13
    assert f.read_bytes() == b"012AB56789\0\0Z"
    # offset on a missing file creates it
    g = tmp_path / "new"
    assert write(server, g, b"xy", offset=2)[0] == 200
    assert g.read_bytes() == b"\0\0xy"


def test_parallel_style_ranges_with_truncate_to(server, tmp_path):
    f = tmp_path / "r"
    f.write_bytes(b"S" * 100)  # a stale, longer previous version
    data = os.urandom(3000)
    for off in (2000, 0, 1000):  # ranges arrive in any order
        chunk = data[off:off + 1000]
        params = {"offset": off}
        if off == 2000:
            params["truncate_to"] = 3000
        assert write(server, f, chunk, **params)[0] == 200
    assert f.read_bytes() == data
    # truncate_to shrinks: the stale tail goes away (control: without it the tail stays)
    assert write(server, f, b"xy", offset=0)[0] == 200
    assert f.stat().st_size == 3000
    status, j = write(server, f, b"xy", offset=0, truncate_to=2)
    assert status == 200 and j["size"] == 2
    assert f.read_bytes() == b"xy"


def test_mode_is_applied(server, tmp_path):
    f = tmp_path / "m"
    assert write(server, f, b"#!/bin/sh\n", mode="750")[0] == 200
    assert stat.S_IMODE(f.stat().st_mode) == 0o750
    assert jget(server, "stat", path=str(f))[1]["mode"] == "750"
    assert write(server, f, b"x", mode="600")[0] == 200  # also on an existing file
    assert stat.S_IMODE(f.stat().st_mode) == 0o600
    for bad in ("9", "rw", "-1", "77777"):
        status, j = write(server, tmp_path / "bad", b"x", mode=bad)
        assert status == 400, (bad, j)
    assert not (tmp_path / "bad").exists()


def test_mkdir_parents_default_and_refused_with_mkdir_false(server, tmp_path):
    deep = tmp_path / "a" / "b" / "c.txt"
    status, j = write(server, deep, b"data", mkdir="false")
    assert status == 404, j
    assert not (tmp_path / "a").exists()
    status, j = write(server, deep, b"data")  # control: the default creates parents
    assert status == 200, j
    assert deep.read_bytes() == b"data"
    assert write(server, tmp_path / "x", b"", mkdir="maybe")[0] == 400


def test_empty_body_creates_and_truncates(server, tmp_path):
    f = tmp_path / "empty"
    status, j = write(server, f, b"")
    assert status == 200 and j == {"path": str(f), "size": 0}
    assert f.exists() and f.read_bytes() == b""
    f.write_bytes(b"previous content")
    assert write(server, f, b"")[0] == 200
    assert f.read_bytes() == b""


def test_post_is_accepted_for_write(server, tmp_path):
    f = tmp_path / "p"
    status, j = write(server, f, b"posted", method="POST")
    assert status == 200 and j["size"] == 6
    assert f.read_bytes() == b"posted"


def test_write_onto_directory_is_409(server, tmp_path):
    (tmp_path / "d").mkdir()
    status, j = write(server, tmp_path / "d", b"x")
    assert status == 409, j


def test_keep_alive_across_file_requests(server, tmp_path):
    c = server.conn()
    h = server.headers()
    f = tmp_path / "k"
    for i in range(3):
        payload = os.urandom(100000 + i)
        c.request("PUT", f"/v1/files/write?{q(path=str(f))}", body=payload, headers=h)
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read())["size"] == len(payload)
        c.request("GET", f"/v1/files/read?{q(path=str(f))}", headers=h)
        r = c.getresponse()
        assert r.status == 200 and r.read() == payload
    # an upload refused before its body is read leaves the connection usable
    c.request("PUT", f"/v1/files/write?{q(path=str(tmp_path / 'no' / 'x'), mkdir='false')}",
              body=b"z" * 1000, headers=h)
    r = c.getresponse()
    assert r.status == 404 and "error" in json.loads(r.read())
    c.request("GET", f"/v1/files/stat?{q(path=str(f))}", headers=h)
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["size"] == 100002
    c.close()


def test_write_error_mid_body_is_answered_and_server_survives(make_server, tmp_path):
    # RLIMIT_FSIZE makes a write fail part-way through the body (EFBIG); without SIGXFSZ
    # ignored the kernel would kill the server instead.
    from conftest import SERVER_BIN
    wrap = tmp_path / "wrap.sh"
    wrap.write_text(f"#!/bin/sh\nexec prlimit --fsize=262144 -- {SERVER_BIN} \"$@\"\n")
    wrap.chmod(0o755)
    s = make_server(binary=str(wrap))
    small = os.urandom(200 * 1024)
    assert write(s, tmp_path / "small", small)[0] == 200  # control: under the limit
    c = s.conn()
    h = s.headers()
    c.request("PUT", f"/v1/files/write?{q(path=str(tmp_path / 'big'))}", body=os.urandom(600000),
              headers=h)
    r = c.getresponse()
    assert r.status == 413, r.read()
    assert "error" in json.loads(r.read())
    # the rest of the body was drained: the same connection serves the next request
    c.request("GET", f"/v1/files/read?{q(path=str(tmp_path / 'small'))}", headers=h)
    r = c.getresponse()
    assert r.status == 200 and r.read() == small
    c.close()
    assert s.proc.poll() is None


def test_relative_paths_start_at_server_cwd(make_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = make_server()
    status, j = write(s, "rel/dir/f.txt", b"relative")
    assert status == 200 and j["path"] == "rel/dir/f.txt"
    assert (tmp_path / "rel" / "dir" / "f.txt").read_bytes() == b"relative"
    status, j = jget(s, "list", path="rel/dir")
    assert status == 200 and [e["path"] for e in j["entries"]] == ["rel/dir/f.txt"]


# ---- refusals of read ----------------------------------------------------------------------

def test_read_missing_is_404_and_directory_is_409(server, tmp_path):
    status, _, body = read(server, tmp_path / "missing")
    assert status == 404 and "error" in json.loads(body)
    status, _, body = read(server, tmp_path)
    assert status == 409 and "error" in json.loads(body)
    (tmp_path / "ok").write_bytes(b"control")
    assert read(server, tmp_path / "ok")[2] == b"control"


def test_fifo_is_refused_quickly(server, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t = time.monotonic()
    status, _, body = read(server, fifo)
    assert status == 400, body
    assert "regular" in json.loads(body)["error"]
    status, j = write(server, fifo, b"x")  # no reader: must not block either
    assert status == 400, j
    assert time.monotonic() - t < 2
    # the server is still responsive (it never blocked on the FIFO)
    (tmp_path / "after").write_bytes(b"fine")
    assert read(server, tmp_path / "after")[2] == b"fine"


def test_device_is_refused(server):
    status, _, body = read(server, "/dev/zero")
    assert status == 400, body


def test_bad_parameters_are_400(server, tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    f = str(tmp_path / "f")
    assert server.request("GET", "/v1/files/read")[0] == 400
    assert server.request("GET", "/v1/files/read?path=")[0] == 400
    for params in ({"offset": "-1"}, {"offset": "x"}, {"length": "1e3"}, {"offset": "1 "}):
        assert read(server, f, **params)[0] == 400, params
    assert read(server, f, offset="1")[2] == b"bc"  # control
    status, _, body = server.request("GET", "/v1/files/read?path=%ZZ")
    assert status == 400
    status, _, body = server.request("GET", "/v1/files/read?path=a%00b")
    assert status == 400
    status, _, body = server.request("GET", "/v1/files/read?path=/" + "a" * 5000)
    assert status == 400
    for route in ("list", "stat"):
        assert server.request("GET", f"/v1/files/{route}")[0] == 400
    assert server.request("DELETE", "/v1/files/delete")[0] == 400
    assert server.request("POST", "/v1/files/mkdir")[0] == 400
    assert server.request("PUT", "/v1/files/write", body=b"x")[0] == 400


def test_symlink_loop_is_400(server, tmp_path):
    loop = tmp_path / "loop"
    os.symlink("loop", loop)
    status, _, body = read(server, loop)
    assert status == 400
    assert "symlink" in json.loads(body)["error"]


# ---- list and stat -------------------------------------------------------------------------

def make_tree(tmp_path, n=25):
    d = tmp_path / "many"
    d.mkdir()
    for i in range(n):
        (d / f"file{i:02d}.txt").write_bytes(b"x" * i)
    return d


def test_list_pagination(server, tmp_path):
    d = make_tree(tmp_path)
    names, after, pages = [], None, 0
    while True:
        params = {"path": str(d), "limit": 10}
        if after is not None:
            params["after"] = after
        status, j = jget(server, "list", **params)
        assert status == 200, j
        pages += 1
        page = [e["name"] for e in j["entries"]]
        assert page == sorted(page)
        names += page
        if not j["truncated"]:
            assert j["next"] is None
            break
        assert len(page) == 10 and j["next"] == page[-1]
        after = j["next"]
    assert pages == 3
    assert names == [f"file{i:02d}.txt" for i in range(25)]
    # the cursor is exclusive and need not be an existing name
    status, j = jget(server, "list", path=str(d), after="file22.txt")
    assert [e["name"] for e in j["entries"]] == ["file23.txt", "file24.txt"]
    status, j = jget(server, "list", path=str(d), after="file05x", limit=2)
    assert [e["name"] for e in j["entries"]] == ["file06.txt", "file07.txt"]
    assert j["truncated"] is True and j["next"] == "file07.txt"
    # default limit: everything, not truncated
    status, j = jget(server, "list", path=str(d))
    assert len(j["entries"]) == 25 and j["truncated"] is False and j["next"] is None
    # a page that ends exactly at the last entry is not truncated
    status, j = jget(server, "list", path=str(d), after="file14.txt", limit=10)
    assert len(j["entries"]) == 10 and j["truncated"] is False


def test_a_huge_listing_lets_other_requests_through(server, huge_dir):
    # 250,000 entries: read at once they held every other request for about half a second; a
    # listing reads a batch per turn of the loop, so a request sent while it runs is answered
    # first (the order is what is checked, not a time)
    d = huge_dir(250000)
    (status, j), hstatus, health_first = health_while(  # after 50 ms: the listing has begun
        server, lambda: (jget(server, "list", path=str(d), limit=5), time.monotonic()), 0.05)
    assert hstatus == 200
    assert status == 200, j  # positive control: the listing itself is whole and right
    assert [e["name"] for e in j["entries"]] == [f"f{i:06d}" for i in range(5)]
    assert j["truncated"] is True and j["next"] == "f000004"
    assert health_first, "the listing held the loop until it ended"
    # a client that goes away while its listing is read: the server drops it and goes on
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", server.port))
        s.sendall(f"GET /v1/files/list?{q(path=str(d), limit=5)} HTTP/1.1\r\nHost: x\r\n"
                  f"X-Sandbox-Token: {server.token}\r\n\r\n".encode())
        time.sleep(0.02)
        s.close()
    time.sleep(0.5)
    assert server.json("GET", "/health")[0] == 200


def test_list_pages_through_names_that_are_not_utf8(server, tmp_path):
    """A name that is not UTF-8 reaches JSON with U+FFFD for its odd bytes, which names no entry:
    as a cursor it would list the same entry again forever. Its cursor carries its bytes
    (/hex:...), and paging one at a time visits every entry once."""
    d = tmp_path / "raw"
    d.mkdir()
    raw = [b"a\xff1", b"a\xfe1", b"a\xff2", b"b-utf8-\xc3\xa9"]
    for n in raw:
        open(os.path.join(os.fsencode(str(d)), n), "wb").close()
    seen, after = [], None
    for _ in range(len(raw) + 2):  # bounded: one page per entry, and the last
        params = {"path": str(d), "limit": 1}
        if after is not None:
            params["after"] = after
        status, j = jget(server, "list", **params)
        assert status == 200, j
        seen += [e["name"] for e in j["entries"]]
        if not j["truncated"]:
            break
        after = j["next"]
    assert len(seen) == len(raw), ("paging did not visit each entry once", seen)
    assert seen[-1] == "b-utf8-\u00e9" and sum("\ufffd" in n for n in seen) == 3, seen
    # a cursor that is not hex of a name is refused, not taken for a name
    for bad in ("/hex:zz", "/hex:", "/hex:2f"):
        status, j = jget(server, "list", path=str(d), after=bad)
        assert status == 400, (bad, j)


def test_list_entry_fields(server, tmp_path):
    d = tmp_path / "fields"
    d.mkdir()
    (d / "file").write_bytes(b"12345")
    os.chmod(d / "file", 0o640)
    (d / "sub").mkdir()
    os.symlink("/etc", d / "link")
    os.mkfifo(d / "pipe")
    status, j = jget(server, "list", path=str(d) + "/")
    assert status == 200
    by = {e["name"]: e for e in j["entries"]}
    assert list(by) == ["file", "link", "pipe", "sub"]
    for name, e in by.items():
        st = os.lstat(d / name)
        assert e["path"] == str(d / name)
        assert e["size"] == st.st_size
        assert abs(e["mtime_ms"] - st.st_mtime_ns // 1_000_000) <= 1
        assert e["mode"] == format(stat.S_IMODE(st.st_mode), "o")
    assert by["file"]["type"] == "file" and by["file"]["mode"] == "640" and by["file"]["size"] == 5
    assert by["sub"]["type"] == "dir"
    assert by["link"]["type"] == "symlink" and by["link"]["size"] == len("/etc")
    assert by["pipe"]["type"] == "file"  # anything else counts as a file


def test_list_root_paths_and_odd_names(server, tmp_path):
    status, j = jget(server, "list", path="/", limit=50000)
    assert status == 200
    assert all(e["path"] == "/" + e["name"] for e in j["entries"])
    assert "tmp" in [e["name"] for e in j["entries"]]
    # a name that is not UTF-8 is still listed (lossy), and does not break the answer
    d = tmp_path / "odd"
    d.mkdir()
    open(os.path.join(bytes(d), b"bad\xffname"), "wb").close()
    (d / "ok").write_bytes(b"")
    status, j = jget(server, "list", path=str(d))
    assert status == 200
    assert [e["name"] for e in j["entries"]] == ["bad\ufffdname", "ok"]


def test_list_refusals(server, tmp_path):
    d = make_tree(tmp_path, 3)
    for bad in ("0", "50001", "x", "-5"):
        assert jget(server, "list", path=str(d), limit=bad)[0] == 400, bad
    assert jget(server, "list", path=str(d), limit="50000")[0] == 200  # control
    assert jget(server, "list", path=str(tmp_path / "missing"))[0] == 404
    assert jget(server, "list", path=str(d / "file00.txt"))[0] == 409  # not a directory


def test_large_listing_is_complete(server, tmp_path):
    # ~9,000 long names make a JSON answer of several MB (larger than one output buffer)
    d = tmp_path / "big"
    d.mkdir()
    n = 9000
    pad = "n" * 150
    for i in range(n):
        os.close(os.open(d / f"{pad}{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))
    c = server.conn(timeout=60)
    c.request("GET", f"/v1/files/list?{q(path=str(d), limit=50000)}", headers=server.headers())
    r = c.getresponse()
    body = r.read()
    assert r.status == 200
    assert len(body) > 2 * 1024 * 1024
    j = json.loads(body)
    assert [e["name"] for e in j["entries"]] == [f"{pad}{i:05d}" for i in range(n)]
    assert j["truncated"] is False
    # the connection is reusable after the streamed answer
    c.request("GET", f"/v1/files/stat?{q(path=str(d))}", headers=server.headers())
    r = c.getresponse()
    assert r.status == 200 and json.loads(r.read())["type"] == "dir"
    c.close()


def test_stat_reports_symlink_not_target(server, tmp_path):
    target = tmp_path / "target.txt"
    target.write_bytes(b"0123456789")
    link = tmp_path / "link"
    os.symlink(target, link)
    status, j = jget(server, "stat", path=str(link))
    assert status == 200
    assert j["type"] == "symlink" and j["name"] == "link" and j["path"] == str(link)
    assert j["size"] == len(str(target))
    status, j = jget(server, "stat", path=str(target))  # control: the target is a file
    assert j["type"] == "file" and j["size"] == 10 and j["name"] == "target.txt"
    status, j = jget(server, "stat", path=str(tmp_path))
    assert j["type"] == "dir"
    assert jget(server, "stat", path=str(tmp_path / "nope"))[0] == 404


# ---- delete, mkdir, rename -----------------------------------------------------------------

def delete(server, path, **params):
    return server.json("DELETE", f"/v1/files/delete?{q(path=str(path), **params)}")


def test_delete_file_and_directories(server, tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"x")
    status, j = delete(server, f)
    assert status == 200 and j == {"deleted": str(f)}
    assert not f.exists()
    assert delete(server, f)[0] == 404
    d = tmp_path / "d"
    (d / "inner").mkdir(parents=True)
    status, j = delete(server, d)
    assert status == 409, j
    assert (d / "inner").is_dir()  # nothing was removed
    assert delete(server, d / "inner")[0] == 200  # an empty directory needs no recursive
    assert not (d / "inner").exists()
    (d / "x" / "y").mkdir(parents=True)
    (d / "x" / "y" / "z").write_bytes(b"z")
    status, j = delete(server, d, recursive="true")
    assert status == 200 and j == {"deleted": str(d)}
    assert not d.exists()


def test_recursive_delete_never_follows_symlinks(server, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_bytes(b"precious")
    (outside / "sub").mkdir()
    (outside / "sub" / "deep.txt").write_bytes(b"deep")
    tree = tmp_path / "tree"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "file").write_bytes(b"f")
    os.symlink(outside, tree / "a" / "dirlink")
    os.symlink(outside / "keep.txt", tree / "filelink")
    assert (tree / "a" / "dirlink" / "keep.txt").read_bytes() == b"precious"  # positive control
    status, j = delete(server, tree, recursive="true")
    assert status == 200, j
    assert not tree.exists()
    assert (outside / "keep.txt").read_bytes() == b"precious"
    assert (outside / "sub" / "deep.txt").read_bytes() == b"deep"


def test_delete_symlink_to_directory_removes_only_the_link(server, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    link = tmp_path / "link"
    os.symlink(outside, link)
    status, j = delete(server, link, recursive="true")
    assert status == 200, j
    assert not os.path.lexists(link)
    assert (outside / "keep").read_bytes() == b"k"


def test_delete_refuses_dot_paths(server, tmp_path):
    (tmp_path / "d" / "e").mkdir(parents=True)
    assert delete(server, str(tmp_path / "d" / "e") + "/..", recursive="true")[0] == 400
    assert delete(server, str(tmp_path / "d") + "/.", recursive="true")[0] == 400
    assert delete(server, "/", recursive="true")[0] == 400
    assert (tmp_path / "d" / "e").is_dir()
    assert delete(server, tmp_path / "d", recursive="yes")[0] == 200  # control


def test_mkdir_creates_parents_and_accepts_existing(server, tmp_path):
    d = tmp_path / "m" / "n" / "o"
    status, j = server.json("POST", f"/v1/files/mkdir?{q(path=str(d))}")
    assert status == 200 and j == {"created": str(d)}
    assert d.is_dir()
    status, j = server.json("POST", f"/v1/files/mkdir?{q(path=str(d))}")
    assert status == 200
    (tmp_path / "file").write_bytes(b"")
    status, j = server.json("POST", f"/v1/files/mkdir?{q(path=str(tmp_path / 'file'))}")
    assert status == 409, j
    status, j = server.json("POST", f"/v1/files/mkdir?{q(path=str(tmp_path / 'file' / 'x'))}")
    assert status == 409, j


def rename(server, body):
    return server.json("POST", "/v1/files/rename", body)


def test_rename(server, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"A")
    b.write_bytes(b"B")
    status, j = rename(server, {"from": str(a), "to": str(b)})
    assert status == 409, j
    assert a.read_bytes() == b"A" and b.read_bytes() == b"B"  # nothing moved
    status, j = rename(server, {"from": str(a), "to": str(b), "overwrite": True})
    assert status == 200 and j == {"from": str(a), "to": str(b)}
    assert not a.exists() and b.read_bytes() == b"A"
    c = tmp_path / "c"
    status, j = rename(server, {"from": str(b), "to": str(c), "overwrite": False})
    assert status == 200 and c.read_bytes() == b"A"
    status, j = rename(server, {"from": str(tmp_path / "missing"), "to": str(tmp_path / "z")})
    assert status == 404, j
    # a directory moves with its content
    (tmp_path / "dir" / "in").mkdir(parents=True)
    status, j = rename(server, {"from": str(tmp_path / "dir"), "to": str(tmp_path / "dir2")})
    assert status == 200 and (tmp_path / "dir2" / "in").is_dir()


def test_rename_bad_bodies(server, tmp_path):
    a = tmp_path / "a"
    a.write_bytes(b"A")
    for body in ({}, {"from": str(a)}, {"to": str(a)}, {"from": 1, "to": "x"},
                 {"from": str(a), "to": str(tmp_path / "b"), "overwrite": "yes"},
                 {"from": "", "to": str(tmp_path / "b")}):
        status, j = rename(server, body)
        assert status == 400, (body, j)
    status, _, _ = server.request("POST", "/v1/files/rename", body=b"not json")
    assert status == 400
    assert a.read_bytes() == b"A" and not (tmp_path / "b").exists()


# ---- authentication ------------------------------------------------------------------------

def test_wrong_token_is_403_on_every_file_route(server, tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"secret")
    p = q(path=str(f))
    calls = [("GET", f"/v1/files/read?{p}", None),
             ("PUT", f"/v1/files/write?{p}", b"overwritten"),
             ("POST", f"/v1/files/write?{p}", b"overwritten"),
             ("GET", f"/v1/files/list?{q(path=str(tmp_path))}", None),
             ("GET", f"/v1/files/stat?{p}", None),
             ("DELETE", f"/v1/files/delete?{p}", None),
             ("POST", f"/v1/files/mkdir?{q(path=str(tmp_path / 'made'))}", None),
             ("POST", "/v1/files/rename", {"from": str(f), "to": str(tmp_path / "moved")})]
    wrong = {"X-Sandbox-Token": "0" * 64}
    for method, path, body in calls:
        status, _, data = server.request(method, path, body=body, headers=wrong)
        assert status == 403, (method, path, data)
        status, _, data = server.request(method, path, body=body, token=False)
        assert status == 403, (method, path, data)
    assert f.read_bytes() == b"secret"
    assert not (tmp_path / "made").exists() and not (tmp_path / "moved").exists()
    # positive control: the same calls with the right token are accepted
    for method, path, body in calls:
        if path.startswith("/v1/files/delete"):
            continue
        status, _, data = server.request(method, path, body=body)
        assert status == 200, (method, path, data)
    assert (tmp_path / "made").is_dir() and (tmp_path / "moved").read_bytes() == b"overwritten"
