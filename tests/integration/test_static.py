# SPDX-License-Identifier: MIT
"""The static sbx-server runs in a root filesystem that holds nothing but itself."""
import os
import shutil

import pytest

from conftest import BUILD, Server

# The sanitizer build has no static server (sanitizers do not link statically): there the
# regular build's, which scripts/test.sh builds first, is the one under test.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATIC = next((p for p in (os.path.join(BUILD, "sbx-server-static"),
                           os.path.join(_ROOT, "build", "sbx-server-static"))
               if os.path.exists(p)), os.path.join(BUILD, "sbx-server-static"))


def program_header_types(path):
    """p_type of every ELF64 program header."""
    with open(path, "rb") as f:
        data = f.read(1 << 16)
    assert data[:4] == b"\x7fELF" and data[4] == 2, "not an ELF64 file"
    phoff = int.from_bytes(data[0x20:0x28], "little")
    phentsize = int.from_bytes(data[0x36:0x38], "little")
    phnum = int.from_bytes(data[0x38:0x3A], "little")
    return [int.from_bytes(data[phoff + i * phentsize:phoff + i * phentsize + 4], "little")
            for i in range(phnum)]


@pytest.mark.skipif(not os.path.exists(STATIC), reason="static build not configured")
def test_static_binary_is_static_and_small():
    types = program_header_types(STATIC)
    PT_INTERP, PT_DYNAMIC = 3, 2
    assert PT_INTERP not in types and PT_DYNAMIC not in types, types
    # positive control: the ordinary build is dynamic
    assert PT_INTERP in program_header_types(os.path.join(BUILD, "sbx-server"))
    assert os.path.getsize(STATIC) <= 1536 * 1024, os.path.getsize(STATIC)


@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
@pytest.mark.skipif(not os.path.exists(STATIC), reason="static build not configured")
def test_static_binary_serves_from_an_empty_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(STATIC, root / "sbx-server")
    # Positive control: the root really is empty apart from the binary (no libc, no /bin/sh,
    # no /dev, no /proc).
    assert sorted(os.listdir(root)) == ["sbx-server"]
    srv = Server(binary="/usr/sbin/chroot", args=(str(root), "/sbx-server"))
    try:
        status, body = srv.json("GET", "/health")
        assert status == 200 and body["mode"] == "dedicated", body
        # exec of an argv array works without a shell: run the server binary itself
        status, events = srv.exec({"cmd": ["/sbx-server", "--version"]})
        assert status == 200, events
        out = "".join(e["data"] for e in events if e["event"] == "stdout")
        assert out.startswith("sbx-server "), events
        assert events[-1]["exit_code"] == 0
        # and a command that is not there is refused before any stream (there is no /bin/sh)
        status, body = srv.exec({"cmd": "echo hi"})
        assert status == 400 and "sh" in body["error"], body
    finally:
        srv.stop()
