#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Soak: N jobs under continuous churn (pause, resume, move) and random kills of nodes
(SIGKILL or SIGTERM, then a restart) for M minutes, on a platform started here (one
sbx-control, three sbx-nodes on loopback, the build's binaries). Not part of CI.

    sudo /usr/bin/python3 scripts/soak.py [--jobs 6] [--minutes 5] [--seed 1]

Each job keeps a file whose content counts the writes made to it; every exec that succeeds
checks that the file still holds the last value written. At the end it prints:
- requests: client exec requests sent, answered 200, refused during a transition (409, 503,
  502 with X-Sbx-Outcome: unknown: the request raced a pause, move or kill), and other errors,
  with the error rate of requests that did not race a transition (target < 0.01 %);
- lost files (a file older than its last successful write; target 0);
- stuck jobs (not back to RUNNING within 90 s of the end of the churn; target 0);
- orphan runs (a run process alive on a node whose record does not say running; target 0).
Exit status 1 when a target is missed."""
import argparse
import os
import random
import signal
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
os.environ.setdefault("SBX_BUILD", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                "..", "build"))

from conftest import wait_until  # noqa: E402
from sbxplatform import Node, Platform  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=6)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--action-every", type=float, default=2.0,
                    help="seconds between pause/resume/move actions")
    ap.add_argument("--kill-every", type=float, default=20.0,
                    help="seconds between node kills")
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    names = ("soak-a", "soak-b", "soak-c")
    plat = Platform(nodes=names)
    counts = {"sent": 0, "ok": 0, "raced": 0, "errors": 0, "lost_files": 0, "kills": 0,
              "actions": 0}
    errors = []
    try:
        jobs = [plat.create() for _ in range(a.jobs)]
        written = {j.id: 0 for j in jobs}
        for j in jobs:
            assert j.exec("echo 0 > /root/soak.count").code == 0
        end = time.monotonic() + a.minutes * 60
        next_action = time.monotonic() + a.action_every
        next_kill = time.monotonic() + a.kill_every
        while time.monotonic() < end:
            j = rnd.choice(jobs)
            now = time.monotonic()
            if now >= next_kill:
                kind, next_kill = "kill", now + a.kill_every
            elif now >= next_action:
                kind, next_action = rnd.choice(("pause", "move")), now + a.action_every
            else:
                kind = "request"
            if kind == "request" and written[j.id] is None:  # unknown after a cut request
                try:
                    written[j.id] = int(j.exec("cat /root/soak.count", timeout=30).out.strip())
                except Exception:  # noqa: BLE001 (read again on the next round)
                    continue
            if kind == "request":  # write the next value, read the last one back
                counts["sent"] += 1
                n = written[j.id] + 1
                try:
                    r = j.exec_raw(f"c=$(cat /root/soak.count); echo {n} > /root/soak.count; "
                                   f"echo $c", timeout=30)
                except OSError as e:
                    counts["errors"] += 1
                    errors.append(f"exec: {e!r}")
                    continue
                if r.status == 200 and b'"exit_code":0' in r.body:
                    counts["ok"] += 1
                    before = r.body.split(b'"data":"', 1)[-1].split(b"\\n", 1)[0]
                    if before != str(written[j.id]).encode():
                        counts["lost_files"] += 1
                        errors.append(f"{j.id}: found {before!r}, last written "
                                      f"{written[j.id]}")
                    written[j.id] = n
                elif r.status in (409, 503) or r.headers.get("x-sbx-outcome") == "unknown":
                    counts["raced"] += 1  # a transition; the write may or may not have happened
                    written[j.id] = None if r.status == 502 else written[j.id]
                else:
                    counts["errors"] += 1
                    errors.append(f"exec: {r}")
            elif kind == "pause":
                counts["actions"] += 1
                j.action("pause")
                wait_until(lambda: j.inspect()["stage"] == "PAUSED", 30)
                j.action("resume")
            elif kind == "move":
                counts["actions"] += 1
                j.action("move", {"node": "*"})
            else:
                counts["kills"] += 1
                node = rnd.choice(plat.nodes)
                sig = rnd.choice((signal.SIGKILL, signal.SIGTERM))
                node.proc.proc.send_signal(sig)
                node.proc.proc.wait()
                node.proc.crashed = False
                node.proc.stop()
                again = Node(plat, node.name, plat.control.port, port=node.port)
                plat.nodes[plat.nodes.index(node)] = again
                wait_until(lambda: again.health().get("registered"), 30)
        stuck = []
        for j in jobs:
            if not wait_until(lambda: j.inspect()["stage"] == "RUNNING", 90):
                stuck.append(j.id)
        orphans = []
        for n in plat.nodes:
            for jid in os.listdir(os.path.join(n.state, "runs")):
                rec = n.run_record(jid) or {}
                pid = rec.get("pid") or 0
                if pid > 0 and rec.get("state") != "running" and os.path.exists(f"/proc/{pid}"):
                    orphans.append(f"{n.name}/{jid} pid {pid}")
        clean = counts["sent"] - counts["raced"]
        rate = 100.0 * counts["errors"] / clean if clean else 0.0
        print(f"soak: {a.jobs} jobs, {a.minutes} min, seed {a.seed}: {counts['sent']} requests "
              f"({counts['ok']} ok, {counts['raced']} raced a transition, {counts['errors']} "
              f"errors: {rate:.3f} % of those that did not race), {counts['actions']} "
              f"pause/resume/move, {counts['kills']} node kills")
        print(f"lost files: {counts['lost_files']}, stuck jobs: {len(stuck)}, orphan runs: "
              f"{len(orphans)}")
        for e in errors[:10] + stuck + orphans:
            print("  " + e)
        ok = counts["lost_files"] == 0 and not stuck and not orphans and rate < 0.01
        return 0 if ok else 1
    finally:
        plat.stop(check=False)


if __name__ == "__main__":
    sys.exit(main())
