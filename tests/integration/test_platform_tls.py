# SPDX-License-Identifier: MIT
"""TLS between the platform's daemons, attacked from the network.

A squatter is a different process bound to a daemon's address (here: the port of a stopped or
killed daemon on loopback) that records every byte it gets, and every byte it can decrypt.
- On the control plane's address it must learn nothing from the nodes that keep calling it:
  no node token, no join token, no request at all (the node checks the chain against the CA
  its join material pins, and the address). It must change nothing (the node's key set stays).
- On a node's address it must get no request from the control plane: neither a client's exec
  (capability, sandbox token, body) through the edge nor a reconciler's manage call; the client
  is told honestly that nothing was sent. A certificate from the platform's own CA for the
  right address is not enough: the control plane pins the key each node registered.
Positive controls: a squatter holding what the check demands (a certificate from the real CA;
the node's own key) does receive the requests, so the capture would have seen them.
And: plain HTTP only on loopback, and only with --insecure-plain-http."""
import os
import socket
import ssl
import subprocess
import threading
import time

import pytest

from conftest import free_port, wait_until
from sbxplatform import CONTROL_BIN, NODE_BIN, Control, Node, Platform, http_request


@pytest.fixture
def plat():
    p = Platform(nodes=("tl-a", "tl-b"))
    yield p
    p.stop()


def openssl(*args, cwd):
    out = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr.decode()


CONTROL_NAME = "control.sbx.invalid"  # the DNS name only the control plane's certificate has


def make_cert(d, name, ca_dir=None, ip="127.0.0.1", dns=None, append=None):
    """A P-256 key and a server certificate for ip (and dns) in directory d: self-signed (a CA
    of its own), or issued by the CA in ca_dir (its ca.crt + ca.key). Returns (chain, key)."""
    key, crt, chain = (os.path.join(d, f"{name}.{x}") for x in ("key", "crt", "chain"))
    ext = os.path.join(d, f"{name}.ext")
    san = f"IP:{ip}" + (f",DNS:{dns}" if dns else "")
    with open(ext, "w") as f:
        f.write(f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n")
    if ca_dir is None:
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", key, "-out", crt, "-days", "1", "-subj", f"/CN={name}",
                "-addext", f"subjectAltName={san}", cwd=d)
        extra = b""
    else:
        csr = os.path.join(d, f"{name}.csr")
        openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}", cwd=d)
        openssl("x509", "-req", "-in", csr, "-CA", os.path.join(ca_dir, "ca.crt"), "-CAkey",
                os.path.join(ca_dir, "ca.key"), "-set_serial", str(int.from_bytes(
                    os.urandom(8), "big")), "-days", "1", "-extfile", ext, "-out", crt, cwd=d)
        with open(os.path.join(ca_dir, "ca.crt"), "rb") as f:
            extra = f.read()
    if append:  # more certificates sent along (the chain does not have to be true)
        with open(append, "rb") as f:
            extra += f.read()
    with open(crt, "rb") as f, open(chain, "wb") as g:
        g.write(f.read() + extra)
    return chain, key


class Squatter:
    """Bound to 127.0.0.1:port: records the raw bytes of every connection and, with a
    certificate (chain, key), the bytes it could decrypt after a completed handshake."""

    def __init__(self, port, cert=None):
        self.raw = b""
        self.plain = b""
        self.connections = 0
        self.handshakes = 0
        self.ctx = None
        if cert:
            self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ctx.load_cert_chain(*cert)
        self.ls = socket.socket()
        self.ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ls.bind(("127.0.0.1", port))
        self.ls.listen(64)
        self.ls.settimeout(0.2)
        self.stopping = False
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stopping:
            try:
                c, _ = self.ls.accept()
            except (socket.timeout, OSError):
                continue
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        with self.lock:
            self.connections += 1
        c.settimeout(2)
        try:
            if self.ctx is None:
                data = c.recv(65536)
                with self.lock:
                    self.raw += data
                return
            s = self.ctx.wrap_socket(c, server_side=True)
            with self.lock:
                self.handshakes += 1
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                data = s.recv(65536)
                if not data:
                    break
                with self.lock:
                    self.plain += data
                if b"\r\n\r\n" in self.plain:
                    break
        except (OSError, ssl.SSLError):
            pass
        finally:
            c.close()

    def stop(self):
        self.stopping = True
        self.thread.join(5)
        self.ls.close()


def secrets_of(node, plat):
    with open(os.path.join(node.state, "node.token")) as f:
        node_token = f.read().strip()
    with open(plat.join_token_file) as f:
        join_token = f.read().strip().split(".")[1]
    return [node_token.encode(), join_token.encode()]


def test_a_squatter_on_the_control_address_learns_nothing(plat):
    node = plat.node("tl-a")
    secret = secrets_of(node, plat)
    v0 = node.health()["keyset_version"]
    d = plat.dir
    ca_dir = os.path.join(plat.ctl_state, "tls")
    foreign = make_cert(d, "foreign", dns=CONTROL_NAME)                # a CA of its own
    elsewhere = make_cert(d, "elsewhere", ca_dir, ip="127.0.0.2", dns=CONTROL_NAME)
    other = plat.node("tl-b")  # a node's own certificate: the right CA and address, no name
    a_node = (os.path.join(other.state, "tls", "node.crt"),
              os.path.join(other.state, "tls", "node.key"))
    # the real CA's certificate is public: sent along, it does not make a leaf it did not sign
    with_ca = make_cert(d, "with-ca", dns=CONTROL_NAME, append=os.path.join(ca_dir, "ca.crt"))
    stolen_ca = make_cert(d, "ca-issued", ca_dir, dns=CONTROL_NAME)
    ctl = plat.control
    port = ctl.port
    ctl.proc.stop()
    plat._retired.append(ctl)

    for what, cert in (("plain TCP", None), ("a foreign CA", foreign),
                       ("the real CA's certificate in a chain it did not sign", with_ca),
                       ("the platform's CA for another address", elsewhere),
                       ("another node's certificate", a_node)):
        sq = Squatter(port, cert)
        try:
            assert wait_until(lambda: sq.connections >= 3, 10), f"{what}: nodes never called"
        finally:
            sq.stop()
        got = sq.raw + sq.plain
        for s in secret:
            assert s not in got, f"ATTACK: a squatter with {what} learned a node secret"
        assert b"Authorization" not in got and b"POST" not in got, \
            f"ATTACK: a squatter with {what} saw a request: {got[:200]!r}"
        assert sq.handshakes == 0 and sq.plain == b"", \
            f"ATTACK: a node completed a TLS handshake with a squatter with {what}"
    assert node.health()["keyset_version"] == v0  # changed nothing
    assert "refused the TLS identity of whatever answers" in node.log(), node.log()[-2000:]

    # positive control: with a certificate from the platform's CA for this address and the
    # control plane's name, the same capture sees the heartbeat and the node's token (what the
    # checks keep from everyone else)
    sq = Squatter(port, stolen_ca)
    try:
        assert wait_until(lambda: secret[0] in sq.plain, 10), sq.plain[:300]
    finally:
        sq.stop()

    # the real control plane comes back on the address and the node is live again
    c = Control(plat, "control-back", plat.ctl_state, port=port)
    plat.controls[0] = plat.control = c
    plat.wait_nodes_live()


def test_a_squatter_on_a_node_address_gets_no_request(plat):
    job = plat.create_on("tl-a")
    assert job.exec("echo before").out == "before\n"
    node = plat.node("tl-a")
    key_path = os.path.join(node.state, "tls", "node.key")
    crt_path = os.path.join(node.state, "tls", "node.crt")
    with open(crt_path, "rb") as f:
        assert f.read().count(b"BEGIN CERTIFICATE") == 2  # issued at registration: leaf + CA
    node.proc.proc.kill()  # SIGKILL: its record still says running, the route still points here
    node.proc.proc.wait()
    node.proc.crashed = False
    d = plat.dir
    same_ca = make_cert(d, "other-key", os.path.join(plat.ctl_state, "tls"))  # right CA + IP
    foreign = make_cert(d, "foreign")

    for what, cert in (("the platform's CA but another key", same_ca),
                       ("a foreign CA", foreign), ("plain TCP", None)):
        sq = Squatter(node.port, cert)
        try:
            r = job.exec_raw("echo leaked", timeout=20)
            time.sleep(0.3)
        finally:
            sq.stop()
        got = sq.raw + sq.plain
        assert sq.connections >= 1, f"{what}: the edge never connected"
        assert b"X-Sbx-Capability" not in got and b"X-Sandbox-Token" not in got \
            and job.token.encode() not in got, \
            f"ATTACK: a squatter with {what} on the node's address got the request"
        assert sq.plain == b"", f"ATTACK: the edge talked TLS to a squatter with {what}"
        # honest: nothing was sent, and the client is told so
        assert r.status == 502, (what, r)
        assert "nothing was sent" in r.text or "did not answer" in r.text, (what, r)

    # positive control: the node's own key and certificate (what the pin demands) get it
    sq = Squatter(node.port, (crt_path, key_path))
    try:
        job.exec_raw("echo reached", timeout=10)
        assert wait_until(lambda: b"X-Sbx-Capability" in sq.plain, 5), sq.plain[:300]
    finally:
        sq.stop()


def test_plain_http_only_on_loopback_and_only_when_asked(plat):
    # the TLS listener does not answer plain HTTP
    with socket.create_connection(("127.0.0.1", plat.control.port), timeout=5) as s:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = s.recv(1024)
        except OSError:
            data = b""
        assert not data.startswith(b"HTTP/"), data
    assert http_request(plat.control.port, "GET", "/v1/health").status == 200  # over TLS

    state = os.path.join(plat.dir, "plain-ctl")
    for bind in ("0.0.0.0", "192.0.2.1"):
        p = subprocess.Popen([CONTROL_BIN, "--state", state, "--listen", f"{bind}:{free_port()}",
                              "--insecure-plain-http"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
        try:
            _, err = p.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            raise AssertionError(f"ATTACK: --insecure-plain-http served {bind}")
        assert p.returncode == 2 and b"loopback" in err, \
            f"ATTACK: --insecure-plain-http served {bind}: {err!r}"
    out = subprocess.run([NODE_BIN, "--state", os.path.join(plat.dir, "plain-node"), "--listen",
                          f"0.0.0.0:{free_port()}", "--control", f"127.0.0.1:{plat.control.port}",
                          "--join", "sbxjoin1.x.y", "--insecure-plain-http"],
                         capture_output=True, timeout=10)
    assert out.returncode != 0 and b"loopback" in out.stderr, \
        f"ATTACK: a node served plain HTTP on 0.0.0.0: {out}"
    # join material without a CA pin is refused unless plain HTTP was asked for
    out = subprocess.run([NODE_BIN, "--state", os.path.join(plat.dir, "v1-node"), "--listen",
                          f"127.0.0.1:{free_port()}", "--control",
                          f"127.0.0.1:{plat.control.port}", "--join", "sbxjoin1.x.y"],
                         capture_output=True, timeout=10)
    assert out.returncode != 0 and b"pins no TLS CA" in out.stderr, out


def test_nodes_get_certificates_for_their_address_and_are_pinned(plat):
    r = plat.request("GET", "/v1/nodes")
    assert r.status == 200
    for n in r.json():
        assert len(n.get("tls_pin", "")) == 43, n  # base64url SHA-256 of the registered key
    node = plat.node("tl-b")
    out = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-subject",
                          "-in", os.path.join(node.state, "tls", "node.crt")],
                         capture_output=True, timeout=10, text=True)
    assert "IP Address:127.0.0.1" in out.stdout and "CN = tl-b" in out.stdout, out.stdout
    key_mode = os.stat(os.path.join(node.state, "tls", "node.key")).st_mode & 0o777
    ca_mode = os.stat(os.path.join(plat.ctl_state, "tls", "ca.key")).st_mode & 0o777
    assert key_mode == 0o600 and ca_mode == 0o600
    with open(plat.join_token_file) as f:
        assert f.read().startswith("sbxjoin2."), "the join material pins the CA"


def test_a_node_key_rotates_by_registering_again(plat):
    """docs/platform.md: remove a node's key and certificate, start it again: it registers
    under its name (its node token) and the control plane pins the new key."""
    job = plat.create_on("tl-b")
    node = plat.node("tl-b")
    pin = {n["name"]: n["tls_pin"] for n in plat.request("GET", "/v1/nodes").json()}["tl-b"]
    node.proc.stop()
    for f in ("node.key", "node.crt"):
        os.unlink(os.path.join(node.state, "tls", f))
    again = Node(plat, "tl-b", plat.control.port, port=node.port)
    plat.nodes[plat.nodes.index(node)] = again

    def new_pin():
        nodes = {n["name"]: n for n in plat.request("GET", "/v1/nodes").json()}
        return nodes["tl-b"]["tls_pin"] != pin and nodes["tl-b"]["live"]
    assert wait_until(new_pin, 15), again.log()[-2000:]
    job2 = plat.create_on("tl-b")  # the control plane reaches it with the new key
    assert job2.exec("echo rotated").out == "rotated\n"
    job.cancel()


def test_an_operator_ca_makes_new_join_material_and_old_pins_refuse_it(plat):
    """docs/platform.md: replace the CA (here with one an operator made with openssl) and
    restart the control plane: node-join.token pins the new CA; a node still pinned to the old
    CA refuses to talk to it; a node given the new join material registers with a certificate
    from the operator's CA. --tls-san names end up in the control plane's certificate."""
    import base64
    import hashlib
    with open(plat.join_token_file) as f:
        old_join = f.read().strip()
    ctl = plat.control
    ctl.proc.stop()
    plat._retired.append(ctl)
    tls_dir = os.path.join(plat.ctl_state, "tls")
    for f in ("ca.key", "ca.crt"):
        os.unlink(os.path.join(tls_dir, f))
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", "ca.key", "-out", "ca.crt", "-days", "30", "-subj", "/CN=operator CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash", cwd=tls_dir)
    der = subprocess.run(["openssl", "x509", "-outform", "DER", "-in",
                          os.path.join(tls_dir, "ca.crt")], capture_output=True,
                         timeout=10).stdout
    want_pin = base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()
    plat.tls_ctx = None  # the harness trusts the new CA
    plat.control_args = ["--tls-san", "127.0.0.7", "--tls-san", "sbx.example"]
    c = Control(plat, "control-newca", plat.ctl_state, port=ctl.port)
    plat.controls[0] = plat.control = c
    with open(plat.join_token_file) as f:
        new_join = f.read().strip()
    assert new_join.split(".")[:3] == old_join.split(".")[:3]  # same token and identity
    assert new_join.split(".")[3] != old_join.split(".")[3]    # another CA pin
    assert new_join.split(".")[3] == want_pin                   # the operator's
    node = plat.node("tl-a")
    assert wait_until(lambda: "refused the TLS identity of whatever answers" in node.log(), 10), \
        "ATTACK: a node pinned to the old CA talked to a control plane of another CA"
    fresh = Node(plat, "tl-new", c.port)
    plat.nodes.append(fresh)
    assert wait_until(lambda: fresh.health().get("registered"), 15), fresh.log()[-2000:]
    issuer = subprocess.run(["openssl", "x509", "-noout", "-issuer", "-in",
                             os.path.join(fresh.state, "tls", "node.crt")], capture_output=True,
                            text=True, timeout=10).stdout
    assert "operator CA" in issuer, issuer
    out = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in",
                          os.path.join(tls_dir, "control.crt")], capture_output=True, text=True,
                         timeout=10)
    for want in ("IP Address:127.0.0.7", "DNS:sbx.example", "DNS:control.sbx.invalid",
                 "IP Address:127.0.0.1", "DNS:localhost"):
        assert want in out.stdout, out.stdout


def established(port, pid=None):
    """Established TCP connections to 127.0.0.1:port (owned by pid, when given)."""
    out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
                         capture_output=True, text=True, timeout=10).stdout
    return [line for line in out.splitlines() if pid is None or f"pid={pid}," in line]


def test_one_client_connection_and_one_node_connection_carry_many_requests(plat):
    """Keep-alive on both hops: requests on one TLS connection to the control plane are relayed
    over one kept TLS connection to the node (one handshake per node, not per request). Each
    answer is complete and framed: streamed exec (chunked), a file read (Content-Length), a
    refusal; the next request on the same connections works."""
    import json
    job = plat.create_on("tl-a")
    node = plat.node("tl-a")
    c = __import__("sbxplatform").connection(plat.control.port)
    hdr = {"Authorization": f"Bearer {plat.admin}", "X-Sandbox-Token": job.token}
    ctl_pid = plat.control.proc.proc.pid
    # the control plane's own calls to the node (the install) keep a connection of their own
    before = len(established(node.port, ctl_pid))
    try:
        for i in range(6):
            c.request("POST", job.path(f"/proxy/49983/v1/exec"),
                      body=json.dumps({"cmd": f"echo kept-{i} > /tmp/f{i}; cat /tmp/f{i}"}),
                      headers=hdr)
            r = c.getresponse()
            body = r.read()
            assert r.status == 200 and f"kept-{i}".encode() in body and b'"exit"' in body, body
            assert r.getheader("connection") is None  # not closed after the answer
            c.request("GET", job.path(f"/proxy/49983/v1/files/read?path=/tmp/f{i}"), headers=hdr)
            r = c.getresponse()
            assert (r.status, r.read()) == (200, f"kept-{i}\n".encode())
        c.request("GET", job.path("/proxy/49983/v1/files/read?path=/nope"), headers=hdr)
        r = c.getresponse()
        assert r.status == 404, r.read()
        r.read()
        to_node = established(node.port, ctl_pid)
        assert len(to_node) == before + 1, (before, to_node)  # 13 requests, one connection
        assert len(established(plat.control.port)) >= 1
    finally:
        c.close()


def health_seconds(port, timeout=3):
    """How long GET /v1/health takes on a new connection (None: no answer within timeout)."""
    t0 = time.monotonic()
    try:
        r = http_request(port, "GET", "/v1/health", timeout=timeout)
        return time.monotonic() - t0 if r.status == 200 else None
    except OSError:
        return None


@pytest.mark.parametrize("phase", ["hello", "app"])
def test_part_of_a_tls_record_holds_nothing_up(plat, phase):
    """A connection that sends the first three bytes of a TLS record (before the handshake, or
    after it) and waits: the daemon waits for the rest on that connection alone, and serves
    everyone else meanwhile (a red-team pass found the control plane's and the nodes' loops
    spinning on it, serving nobody). Positive control: the same probe before the attack."""
    for port in (plat.control.port, plat.nodes[0].port):
        assert health_seconds(port) is not None  # positive control
        a = socket.create_connection(("127.0.0.1", port), timeout=5)
        try:
            if phase == "app":  # a whole handshake, then raw bytes beside the TLS layer
                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
                inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
                obj = ctx.wrap_bio(inc, out, server_side=False)
                for _ in range(20):
                    try:
                        obj.do_handshake()
                        break
                    except ssl.SSLWantReadError:
                        a.sendall(out.read())
                        inc.write(a.recv(65536))
                a.sendall(out.read())
            a.sendall(b"\x17\x03\x03" if phase == "app" else b"\x16\x03\x01")
            time.sleep(0.3)
            took = health_seconds(port)
            assert took is not None and took < 2, \
                f"LOCKUP: part of a TLS record held the daemon on port {port} ({took})"
        finally:
            a.close()
