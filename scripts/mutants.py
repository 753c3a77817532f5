# SPDX-License-Identifier: MIT
"""Mutation harness for the security checks (run it through scripts/mutants.sh).

Each mutant in tests/mutants/mutants.toml is one precise edit of one check: the original text
(which must occur exactly once in its file) and its replacement. For each mutant, in a scratch
copy of the tree (build-mutants/src, never the real tree) with one reused build directory
(build-mutants/build): apply the edit, build incrementally, run the tests mapped to it, and
require a failure whose output matches the mutant's `expect` regex (the message names the
mutated behaviour), then restore the file.

Result per mutant: killed, SURVIVED (the tests passed, or failed without naming the behaviour),
BROKEN-BUILD (the edit does not compile), STALE (the original text is not found exactly once:
the check was rewritten, so the mutant must be refreshed), TIMEOUT (a test ran past its limit).
The exit status is non-zero unless every selected mutant is killed.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "tests", "mutants", "mutants.toml")
WORK = os.path.join(ROOT, "build-mutants")
SRC = os.path.join(WORK, "src")
BUILD = os.path.join(WORK, "build")
LOGS = os.path.join(WORK, "logs")
FIELDS = {"id", "file", "original", "replacement", "tests", "expect", "what", "quick", "timeout"}


def load(path=TABLE):
    with open(path, "rb") as f:
        table = tomllib.load(f)
    mutants = table.get("mutant", [])
    seen = set()
    for m in mutants:
        missing = {"id", "file", "original", "replacement", "tests", "expect", "what"} - set(m)
        extra = set(m) - FIELDS
        if missing or extra:
            sys.exit(f"mutants.toml: {m.get('id', '?')}: missing {sorted(missing)}, "
                     f"unknown {sorted(extra)}")
        if m["id"] in seen:
            sys.exit(f"mutants.toml: duplicate id {m['id']}")
        if m["original"] == m["replacement"]:
            sys.exit(f"mutants.toml: {m['id']}: the replacement equals the original")
        re.compile(m["expect"])
        seen.add(m["id"])
    return mutants


def tree_files():
    """Tracked and untracked-but-not-ignored files of the real tree (what a commit would hold);
    outside a git checkout, every file but build outputs."""
    r = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                       capture_output=True)
    if r.returncode == 0:
        names = r.stdout.decode().split("\0")
    else:
        names = []
        for dirpath, dirnames, filenames in os.walk(ROOT):
            dirnames[:] = [d for d in dirnames
                           if not (d.startswith("build") or d in (".git", "__pycache__"))]
            names += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames]
    return sorted(f for f in names if f and os.path.isfile(os.path.join(ROOT, f)))


def sync_scratch():
    """Mirror the tree into build-mutants/src, touching only files that differ (so the build
    directory stays incremental)."""
    files = tree_files()
    keep = set(files)
    for rel in files:
        src, dst = os.path.join(ROOT, rel), os.path.join(SRC, rel)
        with open(src, "rb") as f:
            data = f.read()
        try:
            with open(dst, "rb") as f:
                same = f.read() == data
        except OSError:
            same = False
        if not same:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            with open(dst, "wb") as f:
                f.write(data)
        shutil.copymode(src, dst)
    for dirpath, dirnames, filenames in os.walk(SRC):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            rel = os.path.relpath(os.path.join(dirpath, name), SRC)
            if rel not in keep:
                os.unlink(os.path.join(dirpath, name))


def ninja_jobs():
    return os.environ.get("MUTANTS_NINJA_JOBS", "")


# what the integration tests run (SBX_BUILD); unit tests add their own executable
# (the static agent too: a node that serves images runs it in every image run)
BINARIES = ["sbx-server", "sbx-server-static", "sbx-node", "sbx-control", "tests/capmint",
            "sbx", "tests/libsbx-check"]


def targets(m):
    """Only what the mutant's tests run: a mutated library relinks every executable else."""
    t = set()
    for spec in m["tests"]:
        kind, _, rest = spec.partition(" ")
        t.update(BINARIES if kind == "pytest" else ["tests/test-" + rest.strip()])
    return sorted(t)


def build(log, only=None):
    argv = ["ninja", "-C", BUILD, *(only or [])]
    if ninja_jobs():
        argv += ["-j", ninja_jobs()]
    with open(log, "ab") as f:
        return subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT).returncode == 0


def static_server_configured():
    try:
        with open(os.path.join(BUILD, "meson-info", "intro-buildoptions.json")) as f:
            return any(o["name"] == "static_server" and o["value"] is True for o in json.load(f))
    except (OSError, ValueError):
        return False


def configure():
    argv = ["meson", "setup", BUILD, SRC, "-Dstatic_server=true"]
    if os.path.exists(os.path.join(BUILD, "build.ninja")):
        if static_server_configured():
            return True
        argv.insert(2, "--reconfigure")
    r = subprocess.run(argv, capture_output=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout.decode() + r.stderr.decode())
    return r.returncode == 0


def test_argv(spec):
    """'unit NAME' (a meson unit test) or 'pytest NODE...' (pytest node ids)."""
    kind, _, rest = spec.partition(" ")
    if kind == "unit":
        return ["meson", "test", "-C", BUILD, "--no-rebuild", "--print-errorlogs", rest.strip()]
    if kind == "pytest":
        return [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                "--tb=short", *rest.split()]
    raise SystemExit(f"unknown test kind in {spec!r} (expected 'unit NAME' or 'pytest NODE...')")


def run_tests(m, log):
    """(failed, timed_out, output of the failing commands)."""
    env = dict(os.environ, SBX_BUILD=BUILD, PYTHONDONTWRITEBYTECODE="1")
    failed_out, failed, timed_out = [], False, False
    for spec in m["tests"]:
        try:
            r = subprocess.run(test_argv(spec), cwd=SRC, env=env, capture_output=True,
                               timeout=m.get("timeout", 600))
            out, rc = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace"), \
                r.returncode
        except subprocess.TimeoutExpired as e:
            out = ((e.stdout or b"") + (e.stderr or b"")).decode(errors="replace")
            rc, timed_out = None, True
        with open(log, "a") as f:
            f.write(f"\n==== {spec} (exit {rc})\n{out}")
        if rc != 0:
            failed = True
            failed_out.append(out)
    return failed, timed_out, "\n".join(failed_out)


def baseline(sel):
    """Every distinct test command of the selection on the unmutated build: each must pass, or
    a mutant 'killed' by it would prove nothing."""
    specs = sorted({spec for m in sel for spec in m["tests"]})
    log = os.path.join(LOGS, "baseline-tests.log")
    open(log, "w").close()
    bad = []
    for spec in specs:
        failed, _, _ = run_tests({"id": "baseline", "tests": [spec]}, log)
        if failed:
            bad.append(spec)
    for spec in bad:
        print(f"baseline FAILED (unmutated tree): {spec}")
    print(f"baseline: {len(specs) - len(bad)}/{len(specs)} test commands pass unmutated",
          flush=True)
    return not bad


def run_one(m):
    log = os.path.join(LOGS, m["id"] + ".log")
    with open(log, "w") as f:
        f.write(f"mutant {m['id']}: {m['what']}\nfile {m['file']}\n")
    path = os.path.join(SRC, m["file"])
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return "STALE", "file not found"
    n = text.count(m["original"])
    if n != 1:
        return "STALE", f"original text found {n} times"
    with open(path, "w") as f:
        f.write(text.replace(m["original"], m["replacement"]))
    try:
        if not build(log, targets(m)):
            return "BROKEN-BUILD", f"see {os.path.relpath(log, ROOT)}"
        failed, timed_out, out = run_tests(m, log)
        if failed and not re.search(m["expect"], out):
            # a failure for another reason (a port taken by a concurrent test run, say) proves
            # nothing either way: run the tests once more before calling it a survivor
            with open(log, "a") as f:
                f.write("\n==== the failure did not name the check: running the tests again\n")
            failed, timed_out, out = run_tests(m, log)
    finally:
        with open(path, "w") as f:
            f.write(text)
    if timed_out and not re.search(m["expect"], out):
        return "TIMEOUT", "a test ran past its limit"
    if not failed:
        return "SURVIVED", "every mapped test passed"
    if not re.search(m["expect"], out):
        return "SURVIVED", f"tests failed, but not with /{m['expect']}/ (see {os.path.relpath(log, ROOT)})"
    return "killed", ""


def changed_files(ref):
    """Files this branch (and its working tree) changed since it left ref."""
    b = subprocess.run(["git", "merge-base", ref, "HEAD"], cwd=ROOT, capture_output=True)
    if b.returncode != 0:
        sys.exit(f"git merge-base {ref} HEAD failed: {b.stderr.decode().strip()}")
    base = b.stdout.decode().strip()
    r = subprocess.run(["git", "diff", "--name-only", base], cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        sys.exit(f"git diff {ref} failed: {r.stderr.decode().strip()}")
    return set(r.stdout.decode().split())


def main():
    ap = argparse.ArgumentParser(prog="scripts/mutants.sh", description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--check", action="store_true",
                    help="only check that every original text occurs exactly once (no build)")
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only these mutants")
    ap.add_argument("--quick", action="store_true", help="the fixed sample (quick = true)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="a full run first runs every mapped test on the unmutated tree "
                         "(each must pass); skip that (--quick, --only, --changed never do it)")
    ap.add_argument("--changed", nargs="?", const="main", metavar="REF",
                    help="the mutants whose file this branch changed since it left REF "
                         "(default main)")
    args = ap.parse_args()

    mutants = load()
    if args.list:
        for m in mutants:
            print(f"{m['id']:34} {m['file']:28} {'quick ' if m.get('quick') else ''}{m['what']}")
        print(f"{len(mutants)} mutants")
        return 0
    if args.check:
        stale = 0
        for m in mutants:
            try:
                with open(os.path.join(ROOT, m["file"])) as f:
                    n = f.read().count(m["original"])
            except OSError:
                n = 0
            if n != 1:
                stale += 1
                print(f"STALE {m['id']} ({m['file']}): original text found {n} times")
        print(f"{len(mutants) - stale}/{len(mutants)} mutants apply")
        return 1 if stale else 0
    sel = mutants
    if args.only:
        unknown = set(args.only) - {m["id"] for m in mutants}
        if unknown:
            sys.exit(f"unknown mutant ids: {' '.join(sorted(unknown))}")
        sel = [m for m in sel if m["id"] in args.only]
    if args.quick:
        sel = [m for m in sel if m.get("quick")]
    if args.changed:
        files = changed_files(args.changed)
        sel = [m for m in sel if m["file"] in files]
    if not sel:
        print("no mutants selected")
        return 0

    t0 = time.monotonic()
    os.makedirs(LOGS, exist_ok=True)
    sync_scratch()
    if not configure() or not build(os.path.join(LOGS, "baseline-build.log")):
        sys.exit("mutants: the unmutated tree does not build (see build-mutants/logs/)")
    full = not (args.only or args.quick or args.changed)
    if full and not args.no_baseline and not baseline(sel):
        sys.exit("mutants: mapped tests fail on the unmutated tree; fix them first")
    results = []
    for m in sel:
        t = time.monotonic()
        status, note = run_one(m)
        results.append((m, status))
        print(f"{status:13} {m['id']:34} {time.monotonic() - t:6.1f}s  {note}", flush=True)
    # the scratch copy ends unmutated, and so does its build
    build(os.path.join(LOGS, "baseline-build.log"))
    killed = sum(1 for _, s in results if s == "killed")
    print(f"\n{killed}/{len(results)} killed in {time.monotonic() - t0:.0f}s")
    bad = [(m, s) for m, s in results if s != "killed"]
    for m, s in bad:
        print(f"  {s}: {m['id']} ({m['file']}): {m['what']}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
