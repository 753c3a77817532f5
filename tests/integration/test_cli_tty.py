# SPDX-License-Identifier: MIT
"""What `sbx` prints on a terminal's stderr only (src/cli: `isatty(STDERR_FILENO)`), checked
both ways against a platform that `sbx up` starts: the same command once with stderr on a
pseudo-terminal (the lines must be there) and once with stderr on a pipe (nothing must be).
- `sbx cp` in and out of a sandbox: a progress bar (`\\r   DONE / TOTAL MiB  PCT%`, a newline
  at the end) for files above 1 MiB; none for smaller files.
- `sbx create`: one `sbx: waiting: STAGE[: MESSAGE]` line each time the job's stage or message
  changes while it waits to run; `sbx create --pool`: `sbx: placing N sandbox(es) in pool P (a
  host may have to start)`."""
import os
import pty
import re
import secrets
import select
import subprocess
import time

import pytest

from test_cli import SBX, new_sandbox, platform_up

MIB = 1024 * 1024
BAR = re.compile(r"^ *(\d+\.\d) / (\d+\.\d) MiB +(\d+)%$")


@pytest.fixture(scope="module")
def up():
    with platform_up() as u:
        yield u


def on_tty(up, *args, timeout=120):
    """Run sbx with stderr on a new pseudo-terminal (stdout on a pipe); returns (exit code,
    stdout, everything the terminal received)."""
    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([SBX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=slave, env=up.env)
    finally:
        os.close(slave)
    got = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if not ready:
                if p.poll() is not None and not select.select([master], [], [], 0)[0]:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other side is gone
                break
            if not chunk:
                break
            got.append(chunk)
        out = p.communicate(timeout=max(1, deadline - time.monotonic()))[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    return p.returncode, out.decode(), b"".join(got).decode(errors="replace")


def on_pipe(up, *args, timeout=120):
    r = subprocess.run([SBX, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       env=up.env, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def bar_frames(tty_text):
    """The progress bar's frames (done MiB, total MiB, percent), in order. The terminal turns
    each \\n into \\r\\n; the bar redraws itself after a \\r."""
    frames = []
    for piece in re.split(r"[\r\n]", tty_text):
        m = BAR.match(piece)
        if m:
            frames.append((float(m.group(1)), float(m.group(2)), int(m.group(3))))
    return frames


def assert_full_bar(tty_text, size):
    frames = bar_frames(tty_text)
    total = round(size / MIB, 1)
    assert len(frames) >= 3, tty_text[-2000:]  # it moves, not one final line
    assert all(f[1] == total for f in frames), frames
    pcts = [f[2] for f in frames]
    assert pcts == sorted(pcts) and pcts[0] < 100, pcts
    assert frames[-1] == (total, total, 100), frames[-3:]
    assert tty_text.endswith("100%\r\n"), repr(tty_text[-80:])  # ends its line once complete


# One stream each way, and a file at the client's parallel_threshold (64 MiB by default) that
# moves in ranges on threads of their own, each reporting into the one bar.
@pytest.mark.parametrize("size", [6 * MIB + 4321, 64 * MIB + 1], ids=["stream", "ranges"])
def test_cp_shows_a_progress_bar_on_a_terminal_only(up, size):
    sid = new_sandbox(up)
    src = os.path.join(up.dir, "big")
    data = os.urandom(size)
    with open(src, "wb") as f:
        f.write(data)
    # upload on a terminal: the bar, to 100 % of the file's size
    code, out, tty = on_tty(up, "cp", src, f"{sid}:/tmp/big")
    assert code == 0, (out, tty)
    assert_full_bar(tty, size)
    # download on a terminal
    back = os.path.join(up.dir, "big.back")
    code, out, tty = on_tty(up, "cp", f"{sid}:/tmp/big", back)
    assert code == 0, (out, tty)
    assert_full_bar(tty, size)
    with open(back, "rb") as f:
        assert f.read() == data
    os.unlink(back)
    # the same copies with stderr on a pipe: no bar, nothing at all on stderr
    assert on_pipe(up, "cp", src, f"{sid}:/tmp/big2") == (0, "", "")
    assert on_pipe(up, "cp", f"{sid}:/tmp/big2", back) == (0, "", "")
    with open(back, "rb") as f:
        assert f.read() == data
    for p in (src, back):
        os.unlink(p)
    up.sbx("kill", sid, check=0)


def test_cp_of_a_small_file_shows_no_bar_even_on_a_terminal(up):
    sid = new_sandbox(up)
    small = os.path.join(up.dir, "small")
    with open(small, "wb") as f:
        f.write(os.urandom(MIB - 1))
    assert on_tty(up, "cp", small, f"{sid}:/tmp/small") == (0, "", "")
    assert on_tty(up, "cp", f"{sid}:/tmp/small", small + ".back") == (0, "", "")
    with open(small, "rb") as a, open(small + ".back", "rb") as b:
        assert a.read() == b.read()  # positive control: the copies happened
    up.sbx("kill", sid, check=0)


WAITING = re.compile(r"^sbx: waiting: (SCHEDULING|RUNNING)(: .+)?$")


def test_create_says_what_it_waits_for_on_a_terminal_only(up):
    code, out, tty = on_tty(up, "create")
    assert code == 0, (out, tty)
    sid = out.strip()
    assert len(sid) == 24, out
    lines = tty.split("\r\n")
    assert lines[-1] == "" and len(lines) >= 2, repr(tty)
    assert all(WAITING.match(line) for line in lines[:-1]), lines
    assert lines[-2].startswith("sbx: waiting: RUNNING"), lines  # the stage it waited for
    assert len(set(lines[:-1])) == len(lines) - 1, lines  # a line per change, not per poll
    # not a terminal: only the id, on stdout
    code, out, err = on_pipe(up, "create")
    assert (code, err) == (0, "") and len(out.strip()) == 24, (code, out, err)
    up.sbx("kill", sid, out.strip(), check=0)


def test_create_pooled_says_a_host_may_start_on_a_terminal_only(up):
    name = "tty-" + secrets.token_hex(3)
    up.sbx("pool", "create", name, "--max-hosts", "1", check=0)
    code, out, tty = on_tty(up, "create", "--pool", name, timeout=180)
    assert code == 0 and out.startswith(name + "/"), (code, out, tty)
    assert tty == f"sbx: placing 1 sandbox in pool {name} (a host may have to start)\r\n", tty
    code, out, tty = on_tty(up, "create", "--pool", name, "--count", "2", timeout=180)
    assert code == 0 and len(out.split()) == 2, (code, out, tty)
    assert tty == f"sbx: placing 2 sandboxes in pool {name} (a host may have to start)\r\n", tty
    code, out, err = on_pipe(up, "create", "--pool", name, timeout=180)
    assert (code, err) == (0, "") and out.startswith(name + "/"), (code, out, err)
    up.sbx("pool", "rm", name, check=0)
