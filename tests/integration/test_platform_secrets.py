# SPDX-License-Identifier: MIT
"""Secrets at rest: signing keys and job secrets are sealed in the control plane's store under
a key file kept outside it (src/control/seal.c, atrest.c).

Looked at from outside, as someone who copied the control's state directory without the key
file would: no file of it holds a signing key's secret bytes or a job secret's value, while the
same scan finds the public key and a plain env value stored beside them (positive controls).
The runs still get their secrets and capabilities still verify, across a control restart and a
rotation of the secrets key; an altered or moved ciphertext is refused loudly and never starts a
run; a key file that group or other may read, or that another user owns, stops the control."""
import base64
import hashlib
import json
import os
import re
import secrets
import signal
import subprocess

import pytest

from conftest import assert_no_sanitizer_report, free_port, wait_until
from sbxplatform import CAPMINT_BIN, CONTROL_BIN, Control, Platform, http_request

NODES = ("sec-n1", "sec-n2")


@pytest.fixture
def plat():
    p = Platform(nodes=NODES)
    yield p
    p.stop()


# ---- helpers ---------------------------------------------------------------------------------

def db_path(plat):
    return os.path.join(plat.ctl_state, "store.db")


def key_file(plat):
    return os.path.join(plat.ctl_state, "secrets.key")


def sql(plat, query):
    out = subprocess.run(["sqlite3", "-cmd", ".timeout 5000", db_path(plat), query],
                         capture_output=True, timeout=20)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode().strip()


def store_value(plat, key):
    h = sql(plat, f"SELECT hex(value) FROM kv WHERE key = '{key}'")
    assert h, f"no record {key} in the store"
    return bytes.fromhex(h).decode()


def set_store_value(plat, key, text):
    sql(plat, f"UPDATE kv SET value = X'{text.encode().hex()}' WHERE key = '{key}'")
    assert store_value(plat, key) == text


def store_keys(plat, prefix):
    return sql(plat, f"SELECT key FROM kv WHERE key LIKE '{prefix}%' ORDER BY key").split()


def key_file_kids(plat, path=None):
    with open(path or key_file(plat)) as f:
        return [ln.split()[0] for ln in f if ln.strip() and not ln.startswith("#")]


def dump_signing_keys(plat):
    """{kid: secret key bytes} of every signing key, opened by capmint with the key file."""
    out = subprocess.run([CAPMINT_BIN, "--store", db_path(plat), "--dump-secret-keys"],
                         capture_output=True, timeout=10)
    assert out.returncode == 0, out.stderr.decode()
    keys = {}
    for line in out.stdout.decode().split("\n"):
        if line:
            kid, b = line.split()
            keys[kid] = base64.urlsafe_b64decode(b + "=" * (-len(b) % 4))
    assert keys and all(len(v) == 64 for v in keys.values()), keys
    return keys


def forms(raw):
    """The ways a secret could sit in a file: raw, hex, base64 (standard, URL-safe, padded or
    not), as text."""
    out = {raw, raw.hex().encode()}
    for enc in (base64.b64encode, base64.urlsafe_b64encode):
        e = enc(raw)
        out |= {e, e.rstrip(b"=")}
    return out


def state_files(plat):
    """Every file under the control's state directory but the key file (the store, its WAL,
    the identity and join material)."""
    found = {}
    for root, _, names in os.walk(plat.ctl_state):
        for n in names:
            p = os.path.join(root, n)
            if p != key_file(plat):
                with open(p, "rb") as f:
                    found[p] = f.read()
    assert db_path(plat) in found, found.keys()
    return found


def found_in(files, needles):
    return sorted({os.path.basename(p) for p, data in files.items()
                   if any(n in data for n in needles)})


def stop_control(plat):
    c = plat.control
    c.proc.stop()
    plat._retired.append(c)
    return c.port


def start_control(plat, port):
    c = Control(plat, f"control-s{len(plat._retired)}", plat.ctl_state, port=port)
    plat.controls[0] = c
    plat.control = c
    plat.wait_nodes_live()
    return c


def try_control(state, extra=(), token_file=None, timeout=10):
    """Start sbx-control on `state` outside the platform: (exit status, output) when it exits,
    (None, output) when it became healthy (then it is stopped)."""
    port = free_port()
    argv = [CONTROL_BIN, "--state", state, "--listen", f"127.0.0.1:{port}",
            "--admin-token-file", token_file or os.path.join(state, "..", "try-token"),
            "--default-image", "host", "--insecure-plain-http", *extra]
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT)

    def healthy():
        if p.poll() is not None:
            return True
        try:
            return http_request(port, "GET", "/v1/health", timeout=1).status == 200
        except OSError:
            return False
    wait_until(healthy, timeout, 0.05)
    rc = p.poll()
    if rc is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    out = p.stdout.read().decode(errors="replace")
    p.stdout.close()
    assert_no_sanitizer_report(out)
    return rc, out


def rotate(plat):
    out = subprocess.run([CONTROL_BIN, "--state", plat.ctl_state, "--rotate-secrets-key"],
                         capture_output=True, timeout=30)
    text = out.stdout.decode() + out.stderr.decode()
    assert_no_sanitizer_report(text)
    return out.returncode, text


def move_to_other(job):
    """Move the job to the other node: a fresh install, for which the control opens the job's
    secrets in the store again."""
    j = job.inspect()
    other = next(n for n in NODES if n != j["run"]["node"])
    r = job.action("move", {"node": other})
    assert r.status == 202, r
    return j["run"]["generation"], other


def secret_seen_by_run(job, name):
    return job.exec(f'printf "%s" "${name}"').out


# ---- tests -----------------------------------------------------------------------------------

def test_store_files_hold_no_secret_and_runs_still_get_theirs(plat):
    secret = "at-rest-" + secrets.token_hex(20)
    plain = "plain-env-" + secrets.token_hex(20)
    job = plat.create("t", secrets_={"API_SECRET": secret}, env={"PLAIN_VALUE": plain})
    # positive control: the run has its secret and its env
    assert secret_seen_by_run(job, "API_SECRET") == secret
    assert secret_seen_by_run(job, "PLAIN_VALUE") == plain
    versions = {n.name: n.health().get("keyset_version", 0) for n in plat.nodes}
    r = plat.request("POST", "/v1/admin/keys/rotate", {})  # a second signing key, sealed too
    assert r.status == 200, r
    # the nodes hold the new key before capabilities signed with it come (the publish delay is
    # meant for that; on a loaded machine publishing can take longer, and the control restart
    # below would then sign with a key the nodes do not have yet)
    assert wait_until(lambda: all(n.health().get("keyset_version", 0) > versions[n.name]
                                  for n in plat.nodes), 30), plat.logs_tail()
    sks = dump_signing_keys(plat)
    assert len(sks) == 2, sks

    files = state_files(plat)
    # positive controls: the scan sees what the store holds beside the secrets
    assert found_in(files, forms(plain.encode())), \
        "at-rest scan: a plain env value of the job is not found: the scan reads nothing"
    for kid, sk in sks.items():
        assert found_in(files, forms(sk[32:])), \
            f"at-rest scan: signing key {kid}'s public key is not found: the scan reads nothing"
    # at-rest check: neither the job secret nor any signing key's secret part (the seed, or
    # the 64-byte secret key) in any file of the state directory but the key file
    assert not found_in(files, forms(secret.encode())), \
        "at-rest check: a job secret's value is in the control's state directory"
    for kid, sk in sks.items():
        hit = found_in(files, forms(sk) | forms(sk[:32]))
        assert not hit, f"at-rest check: signing key {kid}'s secret bytes are in {hit}"

    # the records are sealed under the key file's current key, bound to their names
    kid = key_file_kids(plat)[0]
    assert store_value(plat, f"secrets/{job.id}").startswith(f"sbxenc1.{kid}.")
    for k in store_keys(plat, "signing-keys/"):
        assert json.loads(store_value(plat, k))["sk"].startswith(f"sbxenc1.{kid}."), k
    st = os.stat(key_file(plat))
    assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()

    # a control restart: capabilities it signs still verify on the nodes, and a new install
    # (a move) still gets the secret
    plat.restart_control(0, same_port=True)
    plat.wait_nodes_live()
    assert secret_seen_by_run(job, "API_SECRET") == secret
    gen, other = move_to_other(job)
    job.wait_stage("RUNNING", generation=gen + 1, node=other)
    assert secret_seen_by_run(job, "API_SECRET") == secret
    assert not found_in(state_files(plat), forms(secret.encode())), \
        "at-rest check: a job secret's value is in the control's state directory"


def test_rotation_reseals_everything_and_drops_the_old_key(plat):
    secret = "rotate-" + secrets.token_hex(20)
    job = plat.create("t", secrets_={"API_SECRET": secret})
    old_kids = key_file_kids(plat)
    with open(key_file(plat)) as f:
        old_text = f.read()
    old_lines = [ln for ln in old_text.splitlines() if ln and not ln.startswith("#")]
    assert len(old_kids) == 1
    sks_before = dump_signing_keys(plat)
    # the ciphertexts under the old key: the store's files hold them now (positive control)
    old_sealed = [store_value(plat, f"secrets/{job.id}").split(".")[2].encode()]
    old_sealed += [json.loads(store_value(plat, k))["sk"].split(".")[2].encode()
                   for k in store_keys(plat, "signing-keys/")]
    assert all(found_in(state_files(plat), [c]) for c in old_sealed)

    port = stop_control(plat)
    rc, out = rotate(plat)
    assert rc == 0, out
    new_kids = key_file_kids(plat)
    assert len(new_kids) == 1 and new_kids != old_kids, (old_kids, new_kids)
    with open(key_file(plat)) as f:
        new_text = f.read()
    assert old_lines[0].split()[1] not in new_text, "rotation: the old key is still in the file"
    assert os.stat(key_file(plat)).st_mode & 0o777 == 0o600
    assert not os.path.exists(key_file(plat) + ".new")
    # every sealed value carries the new kid
    assert store_value(plat, f"secrets/{job.id}").startswith(f"sbxenc1.{new_kids[0]}.")
    for k in store_keys(plat, "signing-keys/"):
        sk = json.loads(store_value(plat, k))["sk"]
        assert sk.startswith(f"sbxenc1.{new_kids[0]}."), (k, sk)
    assert dump_signing_keys(plat) == sks_before  # the same signing keys, re-sealed
    hit = [c[:16] for c in old_sealed if found_in(state_files(plat), [c])]
    assert not hit, f"rotation: ciphertexts under the old key stayed in the store's files: {hit}"

    # the old key file alone no longer opens anything: a store stolen with it learns nothing
    with open(key_file(plat), "w") as f:
        f.write(old_text)
    out = subprocess.run([CAPMINT_BIN, "--store", db_path(plat), "--dump-secret-keys"],
                         capture_output=True, timeout=10)
    assert out.returncode != 0 and b"does not hold" in out.stderr, out
    with open(key_file(plat), "w") as f:
        f.write(new_text)

    start_control(plat, port)
    assert secret_seen_by_run(job, "API_SECRET") == secret  # capabilities verify
    gen, other = move_to_other(job)
    job.wait_stage("RUNNING", generation=gen + 1, node=other)
    assert secret_seen_by_run(job, "API_SECRET") == secret


def test_interrupted_rotation_keeps_the_old_key(plat):
    """A value that cannot be re-sealed stops the rotation before the old key leaves the file;
    once the value is back, the control starts and a second rotation finishes."""
    secret = "interrupted-" + secrets.token_hex(16)
    job = plat.create("t", secrets_={"API_SECRET": secret})
    other_job = plat.create("t", secrets_={"API_SECRET": "other-" + secret})
    old_kid = key_file_kids(plat)[0]
    rec = f"secrets/{job.id}"
    good = store_value(plat, rec)
    port = stop_control(plat)
    set_store_value(plat, rec, flip(good))
    rc, out = rotate(plat)
    assert rc != 0, f"rotation safety: it succeeded with a value it could not re-seal:\n{out}"
    kids = key_file_kids(plat)
    assert len(kids) == 2 and kids[1] == old_kid, \
        f"rotation safety: the old key left the file before every value was re-sealed: {kids}"
    assert store_value(plat, f"secrets/{other_job.id}").startswith(f"sbxenc1.{kids[0]}.")
    set_store_value(plat, rec, good)  # still sealed under the old key, still in the file
    start_control(plat, port)
    gen, other = move_to_other(job)
    job.wait_stage("RUNNING", generation=gen + 1, node=other)
    assert secret_seen_by_run(job, "API_SECRET") == secret
    port = stop_control(plat)
    rc, out = rotate(plat)
    assert rc == 0, out
    assert key_file_kids(plat) != kids and len(key_file_kids(plat)) == 1
    start_control(plat, port)
    assert secret_seen_by_run(job, "API_SECRET") == secret


def flip(sealed):
    """The sealed value with one character of its ciphertext changed."""
    head = len("sbxenc1.") + 9
    i = head + (len(sealed) - head) // 2
    return sealed[:i] + ("A" if sealed[i] != "A" else "B") + sealed[i + 1:]


def test_altered_or_moved_ciphertext_fails_loudly(plat):
    sa, sb = "tamper-a-" + secrets.token_hex(16), "tamper-b-" + secrets.token_hex(16)
    a = plat.create("t", secrets_={"API_SECRET": sa})
    b = plat.create("t", secrets_={"API_SECRET": sb})
    c = plat.create("t", secrets_={"API_SECRET": "c"})
    set_store_value(plat, f"secrets/{a.id}", flip(store_value(plat, f"secrets/{a.id}")))
    # job b's record gets job c's (intact) ciphertext: moved, not altered
    set_store_value(plat, f"secrets/{b.id}", store_value(plat, f"secrets/{c.id}"))
    targets = {job.id: move_to_other(job)[1] for job in (a, b)}
    # positive control: an untouched job moves and keeps its secret
    gen, other = move_to_other(c)
    c.wait_stage("RUNNING", generation=gen + 1, node=other)
    assert secret_seen_by_run(c, "API_SECRET") == "c"
    for job, how in ((a, "altered"), (b, "moved from another record")):
        def ended(job=job):
            j = job.inspect()
            run = j.get("run") or {}
            return j["stage"] == "ERROR" or (j["stage"] == "RUNNING" and run.get("generation", 0)
                                             > 1 and run.get("state") == "running")
        ended = wait_until(ended, 30, 0.05)
        j = job.inspect()
        assert ended and j["stage"] == "ERROR", \
            f"tampered secrets check: secrets {how} were not refused: {j}"
        assert "secrets cannot be decrypted" in j["message"], \
            f"tampered secrets check: {j['message']}"
        assert re.search(f"secrets/{job.id}: cannot decrypt", plat.control.log()), \
            "tampered secrets check: the control does not say which record failed"
        # the node it was to move to never got an install (with garbage, or without secrets)
        assert plat.node(targets[job.id]).run_record(job.id) is None, \
            "tampered secrets check: the target node got a run"


def test_altered_signing_key_stops_the_control(plat):
    kid_rec = store_keys(plat, "signing-keys/")[0]
    good = store_value(plat, kid_rec)
    rec = json.loads(good)
    port = stop_control(plat)
    rec["sk"] = flip(rec["sk"])
    set_store_value(plat, kid_rec, json.dumps(rec, separators=(",", ":")))
    rc, out = try_control(plat.ctl_state, token_file=plat.token_file)
    assert rc is not None and rc != 0, f"altered signing key check: the control started:\n{out}"
    assert f"{kid_rec}: cannot decrypt" in out, f"altered signing key check:\n{out}"
    set_store_value(plat, kid_rec, good)  # positive control: the intact record starts
    start_control(plat, port)
    job = plat.create("t")
    assert job.exec("echo ok").out == "ok\n"


def test_plaintext_records_of_an_older_version_are_resealed(plat):
    secret = "legacy-" + secrets.token_hex(16)
    job = plat.create("t", secrets_={"API_SECRET": secret})
    sks = dump_signing_keys(plat)
    port = stop_control(plat)
    # as the version before secrets at rest wrote them
    set_store_value(plat, f"secrets/{job.id}",
                    json.dumps({"SBX_TOKEN": job.token, "API_SECRET": secret},
                               separators=(",", ":")))
    for k in store_keys(plat, "signing-keys/"):
        rec = json.loads(store_value(plat, k))
        rec["sk"] = base64.urlsafe_b64encode(sks[rec["kid"]]).decode().rstrip("=")
        set_store_value(plat, k, json.dumps(rec, separators=(",", ":")))
    start_control(plat, port)
    kid = key_file_kids(plat)[0]
    log = plat.control.log()
    assert f"secrets/{job.id}: plaintext" in log and "re-sealed" in log, log
    assert store_value(plat, f"secrets/{job.id}").startswith(f"sbxenc1.{kid}.")
    for k in store_keys(plat, "signing-keys/"):
        assert json.loads(store_value(plat, k))["sk"].startswith(f"sbxenc1.{kid}."), k
    assert dump_signing_keys(plat) == sks
    # the plaintext the older version left is gone from the files too (the store compacted)
    files = state_files(plat)
    assert found_in(files, [f"sbxenc1.{kid}.".encode()])  # positive control: the scan reads
    assert not found_in(files, forms(secret.encode())), \
        "at-rest check: a migrated job secret's plaintext stayed in the store's files"
    for k, sk in sks.items():
        hit = found_in(files, forms(sk) | forms(sk[:32]))
        assert not hit, f"at-rest check: migrated signing key {k}'s bytes stayed in {hit}"
    assert secret_seen_by_run(job, "API_SECRET") == secret
    gen, other = move_to_other(job)
    job.wait_stage("RUNNING", generation=gen + 1, node=other)
    assert secret_seen_by_run(job, "API_SECRET") == secret


def test_key_file_mode_owner_and_path(tmp_path):
    state = str(tmp_path / "state")
    token = str(tmp_path / "token")
    rc, out = try_control(state, token_file=token)
    assert rc is None, out  # positive control: a first start makes the key file and runs
    kf = os.path.join(state, "secrets.key")
    assert os.stat(kf).st_mode & 0o777 == 0o600
    for mode in (0o644, 0o640, 0o604):
        os.chmod(kf, mode)
        rc, out = try_control(state, token_file=token)
        assert rc not in (None, 0), f"key file mode check: started with mode {mode:o}:\n{out}"
        assert "secrets key file" in out and "group or other" in out, \
            f"key file mode check: no clear message:\n{out}"
    os.chmod(kf, 0o600)
    os.chown(kf, 65534, 65534)
    rc, out = try_control(state, token_file=token)
    assert rc not in (None, 0) and "owned by another user" in out, \
        f"key file owner check:\n{out}"
    os.chown(kf, 0, 0)
    rc, out = try_control(state, token_file=token)
    assert rc is None, out
    # --secrets-key-file: a key file outside the state directory (made there on first start)
    state2, kf2 = str(tmp_path / "state2"), str(tmp_path / "keys" / "ctl.key")
    os.makedirs(os.path.dirname(kf2), mode=0o700)
    rc, out = try_control(state2, ["--secrets-key-file", kf2], token_file=token)
    assert rc is None, out
    assert os.stat(kf2).st_mode & 0o777 == 0o600
    assert not os.path.exists(os.path.join(state2, "secrets.key"))
    # that store is sealed under that file: without it, the control does not start
    rc, out = try_control(state2, token_file=token)
    assert rc not in (None, 0) and "does not hold" in out, out


def test_admin_token_rotation(plat):
    """docs/platform.md's API token rotation: make the new token, then revoke the old one."""
    old = plat.admin
    r = plat.request("POST", "/v1/tokens", {"principal": "ops", "namespace": "*", "role": "admin"})
    assert r.status == 201, r
    new, new_id = r.json()["token"], r.json()["id"]
    listed = {t["id"]: t for t in plat.request("GET", "/v1/tokens", token=new).json()}
    old_id = "t-" + hashlib.sha256(old.encode()).hexdigest()[:16]
    assert old_id in listed and new_id in listed, listed
    r = plat.request("DELETE", f"/v1/tokens/{old_id}", token=new)
    assert r.status == 200, r
    assert wait_until(lambda: plat.request("GET", "/v1/tokens", token=old).status == 401, 2), \
        "token rotation: the old admin token still works"
    assert plat.request("GET", "/v1/tokens", token=new).status == 200
    plat.admin = new  # the operator's token file gets the new token
    with open(plat.token_file, "w") as f:
        f.write(new + "\n")
    job = plat.create("t")
    assert job.exec("echo ok").out == "ok\n"
