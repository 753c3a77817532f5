# SPDX-License-Identifier: MIT
"""The platform under test: one (or more) sbx-control and N sbx-node processes on loopback.

Each process has its own state directory under one temporary directory and its own free port;
its stderr goes to a file that tests read (log lines) and that teardown scans for sanitizer
reports. Helpers create sandbox jobs, wait for stages, exec through the edge proxy, mint
capabilities with tests/capmint, and call a node directly.

(Named sbxplatform, not platform: a tests/integration/platform.py would shadow Python's own
`platform` module, which pytest imports.)
"""
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse

from conftest import (BUILD, ExecResult, assert_no_sanitizer_report, free_port, id_range,
                      wait_until)

CONTROL_BIN = os.path.join(BUILD, "sbx-control")
NODE_BIN = os.path.join(BUILD, "sbx-node")
CAPMINT_BIN = os.path.join(BUILD, "tests", "capmint")
# The agent each run starts: the static server where the build has it (the ASan build does
# not: there the dynamically linked, instrumented sbx-server runs inside the runs).
AGENT_BIN = next((p for p in (os.path.join(BUILD, "sbx-server-static"),
                              os.path.join(BUILD, "sbx-server")) if os.path.exists(p)),
                 os.path.join(BUILD, "sbx-server-static"))
# Nodes that serve images run a static agent: a run in an image has the image's libraries, not
# the host's (the ASan build's dynamic agent would not start there). In the ASan stage that is
# the regular build's static agent (scripts/test.sh builds build/ first), or SBX_STATIC_AGENT.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_AGENT_BIN = next((p for p in (os.environ.get("SBX_STATIC_AGENT"),
                                    os.path.join(BUILD, "sbx-server-static"),
                                    os.path.join(_ROOT, "build", "sbx-server-static"))
                        if p and os.path.exists(p)), AGENT_BIN)

AGENT_PORT = 49983
_ADMIN = object()  # default token: the platform's admin token


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers  # lowercase keys
        self.body = body

    def json(self):
        return json.loads(self.body) if self.body else None

    @property
    def text(self):
        return self.body.decode(errors="replace")

    def __repr__(self):
        return f"Response({self.status}, {self.headers.get('x-sbx-verdict')}, {self.body[:600]!r})"


# Ports of platform daemons that speak TLS, with the client context that trusts their CA (the
# control plane's tls/ca.crt). Any other port (an agent under test) is plain HTTP.
TLS_PORTS = {}


def tls_context(cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx


def connection(port, timeout=30, host="127.0.0.1", source=None):
    """An http.client connection to a daemon: HTTPS checked against its CA where it speaks TLS.
    source: the local address to connect from (e.g. "127.0.0.3"; None: any)."""
    ctx = TLS_PORTS.get(port)
    src = (source, 0) if source else None
    if ctx:
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx,
                                           source_address=src)
    return http.client.HTTPConnection(host, port, timeout=timeout, source_address=src)


def open_socket(port, timeout=10, host="127.0.0.1", source=None):
    """A connected stream socket to a daemon (TLS-wrapped where it speaks TLS), from the local
    address source if given."""
    s = socket.create_connection((host, port), timeout=timeout,
                                 source_address=(source, 0) if source else None)
    ctx = TLS_PORTS.get(port)
    if ctx:
        try:
            s = ctx.wrap_socket(s, server_hostname=host)
        except BaseException:
            s.close()
            raise
    return s


def fresh_pubkey():
    """A new P-256 public key (PEM): what a node registers (tls_pubkey) to get a certificate."""
    key = subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt",
                          "ec_paramgen_curve:P-256"], capture_output=True, check=True,
                         timeout=10).stdout
    return subprocess.run(["openssl", "pkey", "-pubout"], input=key, capture_output=True,
                          check=True, timeout=10).stdout.decode()


def http_request(port, method, path, body=None, headers=None, timeout=30, source=None):
    """One request on a fresh connection to 127.0.0.1:port (from the address source, e.g.
    "127.0.0.3", if given); returns a Response."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    c = connection(port, timeout, source=source)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    finally:
        c.close()


def parse_ndjson(data):
    return [json.loads(line) for line in data.split(b"\n") if line.strip()]


class Stream:
    """A streamed request read line by line on a thread: events with arrival times, and how
    and when the stream ended (EOF or an error)."""

    def __init__(self, port, method, path, body, headers, timeout=90):
        self.events = []
        self.times = []
        self.ended_at = None
        self.error = None
        self.status = None
        self._conn = connection(port, timeout)
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self._conn.request(method, path, body=body, headers=headers)
        self._resp = self._conn.getresponse()
        self.status = self._resp.status
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            while True:
                line = self._resp.readline()
                if not line:
                    break
                if line.strip():
                    self.events.append(json.loads(line))
                    self.times.append(time.monotonic())
        except (http.client.IncompleteRead, ConnectionError, OSError, ValueError) as e:
            self.error = repr(e)  # a chunked body cut mid-way: the stream ended all the same
        finally:
            self.ended_at = time.monotonic()

    def wait_events(self, n, timeout=10):
        return wait_until(lambda: len(self.events) >= n or self.ended_at is not None, timeout)

    def ended(self):
        return self.ended_at is not None

    def has_exit(self):
        return any(e.get("event") == "exit" for e in self.events)

    def stdout_events(self):
        return [e for e in self.events if e.get("event") == "stdout"]

    def close(self):
        try:
            self._conn.sock and self._conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._conn.close()
        self.thread.join(5)


class Proc:
    """One platform process with its stderr in a file."""

    def __init__(self, name, argv, log_path, env=None):
        """env: variables added to the process's environment (the caller's SBX_* never are)."""
        self.name = name
        self.argv = argv
        self.log_path = log_path
        full = {k: v for k, v in os.environ.items() if not k.startswith("SBX_")}
        full.update(env or {})
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, env=full, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=self._log)

    def alive(self):
        return self.proc.poll() is None

    def log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def stop(self, timeout=10):
        """SIGTERM (then SIGKILL); returns the exit status. self.crashed tells whether the
        process had already exited on its own before we asked it to stop."""
        if not hasattr(self, "crashed"):
            self.crashed = self.proc.poll() is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


# Each node gets a subordinate id range of its own (32 blocks of 65,536 ids) from this test
# session's share (conftest.id_range), never shared with another node of this test process nor
# with a session that runs at the same time.
_ID_BLOCKS = 32


def _id_range():
    return id_range(65536 * _ID_BLOCKS)


class Node:
    def __init__(self, platform, name, control_port, port=None, join=None, images=None,
                 agent=None, env=None, args=()):
        """join: join material as a string (sbxjoin1.<token>.<key>) instead of the control
        plane's node-join.token file. images: the node's --images directory (OCI layouts); by
        default one of its own under the platform's directory, empty, so that tests never
        depend on (or unpack) the host's /var/lib/sbx/images. agent: the --agent binary
        (default the build's sbx-server). env: extra environment (SBX_TEST_CRASH_AT). args: more
        sbx-node arguments."""
        self.platform = platform
        self.id_start, self.id_count = _id_range()
        self.name = name
        self.port = port or free_port()
        self.state = os.path.join(platform.dir, name)
        how = ["--join", join] if join else ["--join-token-file", platform.join_token_file]
        if platform.tls:
            TLS_PORTS[self.port] = platform.tls_ctx
        else:
            how.append("--insecure-plain-http")
        self.images = images or os.path.join(platform.dir, f"{name}-images")
        self.proc = Proc(name, [NODE_BIN, "--state", self.state, "--listen",
                                f"127.0.0.1:{self.port}", "--control",
                                f"127.0.0.1:{control_port}"] + how +
                         ["--name", name, "--agent",
                          agent or (IMAGE_AGENT_BIN if images else AGENT_BIN),
                          "--id-range", f"{self.id_start}:{self.id_count}",
                          "--images", self.images] + list(args),
                         os.path.join(platform.dir, f"{name}.log"), env=env)

    def health(self):
        try:
            r = http_request(self.port, "GET", "/v1/health", timeout=2)
            return r.json() if r.status == 200 else {}
        except OSError:
            return {}

    def log(self):
        return self.proc.log()

    def run_dir(self, job_id):
        return os.path.join(self.state, "runs", job_id)

    def root_path(self, job_id, path):
        """Host path of `path` inside the run's root on this node."""
        return os.path.join(self.run_dir(job_id), "root", path.lstrip("/"))

    def request(self, method, path, cap=None, body=None, headers=None, timeout=30):
        h = dict(headers or {})
        if cap is not None:
            h["X-Sbx-Capability"] = cap
        return http_request(self.port, method, path, body, h, timeout)

    def ports_path(self, job_id, port, rest):
        return f"/v1/runs/{job_id}/ports/{port}{rest}"

    def exec(self, job, cmd, cap, token=None, timeout=30):
        """POST /v1/exec straight to this node; (Response, ExecResult or None)."""
        r = self.request("POST", self.ports_path(job.id, AGENT_PORT, "/v1/exec"), cap,
                         {"cmd": cmd}, {"X-Sandbox-Token": token or job.token}, timeout)
        res = None
        if r.status == 200 and "ndjson" in r.headers.get("content-type", ""):
            res = ExecResult(parse_ndjson(r.body))
        return r, res

    def open_stream(self, job, cmd, cap):
        return Stream(self.port, "POST", self.ports_path(job.id, AGENT_PORT, "/v1/exec"),
                      {"cmd": cmd}, {"X-Sbx-Capability": cap, "X-Sandbox-Token": job.token})

    def run_record(self, job_id):
        try:
            with open(os.path.join(self.run_dir(job_id), "run.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None


class Control:
    def __init__(self, platform, name, state, publish_delay_ms=None, port=None, env=None):
        """env: variables for the process (e.g. SBX_TEST_CRASH_AT)."""
        self.platform = platform
        self.name = name
        self.state = state
        self.publish_delay_ms = publish_delay_ms
        self.port = port or free_port()
        argv = [CONTROL_BIN, "--state", state, "--listen", f"127.0.0.1:{self.port}",
                "--admin-token-file", platform.token_file,
                "--default-image", platform.default_image]
        if not platform.tls:
            argv.append("--insecure-plain-http")
        argv += platform.control_args
        if publish_delay_ms is not None:
            argv += ["--key-publish-delay-ms", str(publish_delay_ms)]
        self.proc = Proc(name, argv, os.path.join(platform.dir, f"{name}.log"), env=env)
        ok = wait_until(lambda: self._healthy() or not self.proc.alive(), 10)
        if not ok or not self.proc.alive():
            raise RuntimeError(f"{name} did not start:\n{self.proc.log()}")

    def _healthy(self):
        if self.platform.tls:  # the CA exists once the control plane has started
            if not os.path.exists(self.platform.ca_file):
                return False
            if self.platform.tls_ctx is None:
                self.platform.tls_ctx = tls_context(self.platform.ca_file)
            TLS_PORTS[self.port] = self.platform.tls_ctx
        try:
            return http_request(self.port, "GET", "/v1/health", timeout=2).status == 200
        except OSError:
            return False

    def log(self):
        return self.proc.log()


class Job:
    """A sandbox job: its namespace, id and job token (the secret SBX_TOKEN)."""

    def __init__(self, platform, ns, j, token):
        self.p = platform
        self.ns = ns
        self.id = j["id"]
        self.created = j
        self.token = token

    def path(self, rest=""):
        return f"/v1/jobs/{self.ns}/{self.id}{rest}"

    def inspect(self, control=None):
        r = self.p.request("GET", self.path(), control=control)
        assert r.status == 200, r
        return r.json()

    def action(self, what, body=None, token=_ADMIN):
        return self.p.request("POST", self.path("/" + what), body if body is not None else {},
                              token=token)

    def wait_stage(self, stage, timeout=20, generation=None, node=None):
        """Wait until the job is in `stage` (for RUNNING: its run is running), optionally
        with a generation of at least `generation` and on `node`; returns the job JSON."""
        def ok():
            j = self.inspect()
            if j.get("stage") != stage:
                return None
            run = j.get("run") or {}
            if stage == "RUNNING" and run.get("state") != "running":
                return None
            if generation is not None and (run.get("generation") or 0) < generation:
                return None
            if node is not None and run.get("node") != node:
                return None
            return j
        j = wait_until(ok, timeout, 0.05)
        assert j, f"job {self.id} not {stage} (gen>={generation}, node={node}) within " \
                  f"{timeout}s: {self.inspect()}\n{self.p.logs_tail()}"
        return j

    def run(self):
        """The run identity (capability fields) the control plane records for the job."""
        r = self.inspect()["run"]
        return {"sandbox": self.id, "generation": r["generation"], "node": r["node"],
                "substrate": r["substrate"], "activation": r["activation"],
                "instance": r["instance"]}

    def node(self):
        return self.p.node(self.inspect()["run"]["node"])

    def proxy(self, method, port, rest, body=None, headers=None, token=_ADMIN, control=None,
              timeout=30):
        """A request through the edge proxy: /v1/jobs/{ns}/{id}/proxy/{port}{rest}."""
        h = {"X-Sandbox-Token": self.token}
        h.update(headers or {})
        return self.p.request(method, self.path(f"/proxy/{port}{rest}"), body, token=token,
                              headers=h, control=control, timeout=timeout)

    def exec_raw(self, cmd, token=_ADMIN, control=None, timeout=30, **body):
        b = {"cmd": cmd}
        b.update(body)
        return self.proxy("POST", AGENT_PORT, "/v1/exec", b, token=token, control=control,
                          timeout=timeout)

    def exec(self, cmd, token=_ADMIN, control=None, timeout=30, **body):
        """Run cmd through the edge proxy; expect a stream; return an ExecResult."""
        r = self.exec_raw(cmd, token=token, control=control, timeout=timeout, **body)
        assert r.status == 200 and "ndjson" in r.headers.get("content-type", ""), r
        return ExecResult(parse_ndjson(r.body))

    def sh(self, cmd, **kw):
        """exec that must exit 0; returns stdout."""
        res = self.exec(cmd, **kw)
        assert res.code == 0, res
        return res.out

    def open_stream(self, cmd, control=None):
        c = control or self.p.control
        return Stream(c.port, "POST", self.path(f"/proxy/{AGENT_PORT}/v1/exec"), {"cmd": cmd},
                      {"Authorization": f"Bearer {self.p.admin}", "X-Sandbox-Token": self.token})

    def start_process(self, cmd, **body):
        b = {"cmd": cmd}
        b.update(body)
        r = self.proxy("POST", AGENT_PORT, "/v1/processes", b)
        assert r.status == 200, r
        return r.json()

    def read_file(self, path):
        return self.proxy("GET", AGENT_PORT,
                          "/v1/files/read?path=" + urllib.parse.quote(path, safe=""))

    def mint(self, access="exec", run=None, **kw):
        """A capability for this job's current run (or `run`), fields overridable."""
        return self.p.mint(run or self.run(), access, **kw)

    def cancel(self):
        r = self.action("cancel")
        assert r.status == 202, r
        return self.wait_stage("CANCELED")


class Platform:
    """sbx-control(s) + sbx-node(s) as separate processes on loopback.

    controls > 1 starts more control processes on the same state directory (one SQLite store),
    each with its own port; nodes register with the first."""

    def __init__(self, nodes=("nodeA", "nodeB"), controls=1, publish_delay_ms=None, images=None,
                 default_image="host", agent=None, tls=True, control_args=(), node_args=()):
        """images: {node name: --images directory} for nodes that should serve images.
        default_image: what jobs that name none run (the suites' default: "host", which needs
        no image on the nodes; the platform's own default is "debian"). agent: every node's
        --agent binary (default the build's sbx-server). tls: False runs every daemon with
        --insecure-plain-http. control_args, node_args: more arguments for every sbx-control
        and every sbx-node (add_node can override the nodes')."""
        self.default_image = default_image
        self.tls = tls
        self.tls_ctx = None
        self.control_args = list(control_args)
        self.node_args = list(node_args)
        self.source = None  # the address requests to the control plane come from (None: any)
        self.dir = tempfile.mkdtemp(prefix="sbxp-")  # short: unix socket paths live below
        os.chmod(self.dir, 0o700)
        self.ctl_state = os.path.join(self.dir, "ctl")
        self.token_file = os.path.join(self.dir, "home", "token")
        self.join_token_file = os.path.join(self.ctl_state, "node-join.token")
        self.ca_file = os.path.join(self.ctl_state, "tls", "ca.crt")
        self.controls = []
        self._retired = []  # controls replaced by restart_control (their logs are checked too)
        self.nodes = []
        self._stopped = False
        try:
            for i in range(controls):
                self.controls.append(Control(self, f"control{i}" if i else "control",
                                             self.ctl_state, publish_delay_ms))
            self.control = self.controls[0]
            with open(self.token_file) as f:
                self.admin = f.read().strip()
            for name in nodes:
                self.nodes.append(Node(self, name, self.control.port,
                                       images=(images or {}).get(name), agent=agent,
                                       args=self.node_args))
            self.wait_nodes_live()
        except BaseException:
            self.stop(check=False)
            raise

    def restart_control(self, i, same_port=False):
        """Stop control i (SIGTERM) and start a new process in its place on the same store
        (on the same port if asked: the nodes keep talking to it)."""
        old = self.controls[i]
        old.proc.stop()
        self._retired.append(old)
        c = Control(self, f"{old.name}-r{len(self._retired)}", self.ctl_state,
                    old.publish_delay_ms, port=old.port if same_port else None)
        self.controls[i] = c
        if i == 0:
            self.control = c
        return c

    def add_node(self, name, images=None, args=None):
        """Start one more node (registered with the first control) and wait until it is live.
        args: its extra sbx-node arguments (default the platform's node_args)."""
        n = Node(self, name, self.control.port, images=images,
                 args=self.node_args if args is None else args)
        self.nodes.append(n)
        self.wait_nodes_live()
        return n

    def wait_nodes_live(self):
        ok = wait_until(self._all_live, 15, 0.05)
        assert ok, f"nodes not live: {self._nodes_json()}\n{self.logs_tail()}"

    # ---- plumbing --------------------------------------------------------------------------
    def _nodes_json(self):
        try:
            r = self.request("GET", "/v1/nodes")
            return r.json() if r.status == 200 else []
        except OSError:
            return []

    def _all_live(self):
        live = {n["name"] for n in self._nodes_json() if n.get("live")}
        return all(n.name in live for n in self.nodes) and all(
            n.proc.alive() for n in self.nodes)

    def node(self, name):
        return next(n for n in self.nodes if n.name == name)

    def logs_tail(self, n=30):
        out = []
        for p in [c.proc for c in self.controls] + [x.proc for x in self.nodes]:
            try:
                lines = p.log().splitlines()[-n:]
            except OSError:
                lines = []
            out.append(f"--- {p.name} ---\n" + "\n".join(lines))
        return "\n".join(out)

    def request(self, method, path, body=None, token=_ADMIN, headers=None, control=None,
                timeout=30):
        """A request to the control plane (the first control unless told otherwise)."""
        h = {}
        tok = self.admin if token is _ADMIN else token
        if tok is not None:
            h["Authorization"] = f"Bearer {tok}"
        h.update(headers or {})
        return http_request((control or self.control).port, method, path, body, h, timeout,
                            source=self.source)

    def token(self, principal, namespace, role):
        r = self.request("POST", "/v1/tokens",
                         {"principal": principal, "namespace": namespace, "role": role})
        assert r.status == 201, r
        return r.json()["token"]

    # ---- jobs --------------------------------------------------------------------------------
    def create(self, ns="t", wait=True, token=_ADMIN, control=None, secrets_=None, **fields):
        """Create a sandbox job (the job token is the secret SBX_TOKEN); wait until RUNNING."""
        tok = secrets.token_hex(16)
        body = dict(fields)
        sec = {"SBX_TOKEN": tok}
        sec.update(secrets_ or {})
        body["secrets"] = sec
        r = self.request("POST", f"/v1/jobs/{ns}", body, token=token, control=control)
        assert r.status == 201, r
        job = Job(self, ns, r.json(), tok)
        if wait:
            job.wait_stage("RUNNING")
        return job

    def create_on(self, node_name, ns="t", **fields):
        """A running job whose current run is on node_name (moved there if placed elsewhere)."""
        job = self.create(ns, **fields)
        j = job.inspect()
        if j["run"]["node"] != node_name:
            r = job.action("move", {"node": node_name})
            assert r.status == 202, r
            job.wait_stage("RUNNING", generation=j["run"]["generation"] + 1, node=node_name)
        return job

    # ---- capabilities ------------------------------------------------------------------------
    def mint(self, run, access="exec", port=None, protocol=None, iat_offset=None, lifetime=None,
             forge=False, kid=None, method=None, target=None, body=None, store=None,
             **override):
        """Mint a capability with tests/capmint from the control plane's signing keys.

        Capabilities name their request: method + target (what the node receives), by default
        POST of the agent's /v1/exec on the run's sandbox. body (str or dict, JSON-encoded as
        http_request sends it) names the body's digest too (manage capabilities must)."""
        rid = dict(run)
        rid.update(override)
        if method is None and target is None:
            method = "POST"
            target = f"/v1/runs/{rid['sandbox']}/ports/{AGENT_PORT}/v1/exec"
        assert method and target, "a capability names its request: method= and target="
        argv = [CAPMINT_BIN, "--store", store or os.path.join(self.ctl_state, "store.db"),
                "--sandbox", rid["sandbox"], "--generation", str(rid["generation"]),
                "--node", rid["node"], "--substrate", rid["substrate"],
                "--activation", rid["activation"], "--instance", rid["instance"],
                "--access", access, "--method", method, "--target", target]
        if body is not None:
            argv += ["--body", body if isinstance(body, str) else json.dumps(body)]
        if port is not None:
            argv += ["--port", str(port)]
        if protocol is not None:
            argv += ["--protocol", protocol]
        if iat_offset is not None:
            argv += ["--iat-offset", str(iat_offset)]
        if lifetime is not None:
            argv += ["--lifetime", str(lifetime)]
        if forge:
            argv.append("--forge")
        if kid is not None:
            argv += ["--kid", kid]
        out = subprocess.run(argv, capture_output=True, timeout=10)
        assert out.returncode == 0, out.stderr.decode()
        return out.stdout.decode().strip()

    # ---- teardown ----------------------------------------------------------------------------
    def _procs(self):
        """Every process started: nodes first (they stop their runs), then the controls."""
        return [x.proc for x in self.nodes] + [c.proc for c in self.controls + self._retired]

    def _kill_leftover_runs(self):
        """A node that had to be killed leaves its runs behind (and an egress run's pasta and
        namespace holder): end them (pid + start time)."""
        for n in self.nodes:
            runs = os.path.join(n.state, "runs")
            for job_id in os.listdir(runs) if os.path.isdir(runs) else []:
                rec = n.run_record(job_id)
                if not rec or rec.get("state") not in ("running", "installing"):
                    continue
                for k, ks in (("pid", "start_time"), ("pasta_pid", "pasta_start"),
                              ("holder_pid", "holder_start")):
                    pid = rec.get(k) or 0
                    try:
                        with open(f"/proc/{pid}/stat") as f:
                            start = int(f.read().rsplit(")", 1)[1].split()[19])
                        if pid > 0 and start == rec.get(ks):
                            os.kill(pid, signal.SIGKILL)
                    except (OSError, ValueError, IndexError):
                        pass

    def stop(self, check=True):
        """Stop nodes (they stop their runs) then controls; fail on a sanitizer report."""
        if self._stopped:
            return
        self._stopped = True
        for x in self.controls + self._retired + self.nodes:  # a port may serve plain HTTP next
            TLS_PORTS.pop(x.port, None)
        logs = []
        for p in self._procs():
            p.stop()
            logs.append(p.log())
        self._kill_leftover_runs()
        for n in self.nodes:  # the agents' own logs (an instrumented sbx-server in ASan builds)
            runs = os.path.join(n.state, "runs")
            for job_id in os.listdir(runs) if os.path.isdir(runs) else []:
                try:
                    with open(os.path.join(runs, job_id, "log"), "rb") as f:
                        logs.append(f.read().decode(errors="replace"))
                except OSError:
                    pass
        try:
            if check:
                for text in logs:
                    assert_no_sanitizer_report(text)
                dead = [f"{p.name} exited on its own (status {p.proc.returncode}):\n"
                        + "\n".join(p.log().splitlines()[-40:]) for p in self._procs()
                        if p.crashed]
                assert not dead, "\n".join(dead)
        finally:
            self._unmount_leftover_disks()
            shutil.rmtree(self.dir, ignore_errors=True)

    def _unmount_leftover_disks(self):
        """Runs' disks that a killed node left mounted (a stopped node unmounts its own)."""
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        for mp in sorted((m for m in points if m.startswith(self.dir + "/")), reverse=True):
            subprocess.run(["umount", "-l", mp], capture_output=True)

