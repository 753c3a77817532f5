# SPDX-License-Identifier: MIT
"""Refusals added after a review of the platform's trust boundaries, each with its positive
control: no second request rides a forwarded connection (an Upgrade header that is not a
WebSocket upgrade does not keep it open); a capability to read a run's state cannot install or
stop runs; a registered node name cannot be taken over with the join token alone; the agent's
own port proxy is not a way around the exposed ports."""
import json
import os
import socket

import pytest

from sbxplatform import AGENT_PORT, Platform, fresh_pubkey, http_request, open_socket


@pytest.fixture(scope="module")
def plat():
    p = Platform(nodes=("hd-a",))
    yield p
    p.stop()


def read_response(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data, True
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    # read whatever follows until the server closes (or 3 s pass)
    s.settimeout(3)
    closed = False
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                closed = True
                break
            body += chunk
    except socket.timeout:
        pass
    return head + b"\r\n\r\n" + body, closed


@pytest.mark.parametrize("upgrade", ["foo", "h2c"])
def test_no_request_rides_a_refused_upgrade(plat, upgrade):
    job = plat.create()
    path = job.path(f"/proxy/{AGENT_PORT}/v1/files/read?path=/etc/hostname")
    smuggled = json.dumps({"cmd": ["sh", "-c", "touch /root/smuggled"]}).encode()
    first = (f"GET {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {plat.admin}\r\n"
             f"X-Sandbox-Token: {job.token}\r\nUpgrade: {upgrade}\r\nConnection: Upgrade\r\n\r\n")
    second = (f"POST /v1/exec HTTP/1.1\r\nHost: x\r\nX-Sandbox-Token: {job.token}\r\n"
              f"Content-Length: {len(smuggled)}\r\n\r\n").encode() + smuggled
    s = open_socket(plat.control.port, timeout=10)
    s.sendall(first.encode() + second)
    data, closed = read_response(s)
    s.close()
    assert data.startswith(b"HTTP/1.1 200"), data[:300]
    assert closed, "the forwarded connection stayed open after the answer"
    assert data.count(b"HTTP/1.1 ") == 1, data[:600]
    node = plat.node("hd-a")
    assert not os.path.exists(node.root_path(job.id, "/root/smuggled"))
    # positive control: the same exec as its own authorized request runs
    assert job.sh("touch /root/allowed && echo ok") == "ok\n"
    assert os.path.exists(node.root_path(job.id, "/root/allowed"))
    job.cancel()


def test_state_read_capability_cannot_manage(plat):
    job = plat.create()
    node = plat.node("hd-a")
    run = job.run()
    state = plat.mint(run, "state_read", method="GET", target=f"/v1/runs/{job.id}/state")
    nxt = dict(run, generation=run["generation"] + 1, activation="a-hd1", instance="i-hd1")
    for method, path, body in (("PUT", f"/v1/runs/{job.id}", {"command": ["/bin/true"]}),
                               ("POST", f"/v1/runs/{job.id}/pause", None),
                               ("DELETE", f"/v1/runs/{job.id}", None)):
        cap = plat.mint(nxt if method == "PUT" else run, "state_read", method=method, target=path,
                        body=body or "")
        r = node.request(method, path, cap, body)
        assert r.status == 403 and r.json()["reason"] == "purpose", (method, r)
    assert job.sh("echo still-running") == "still-running\n"
    # and a management capability does not read state either: each route wants its own bit
    r = node.request("GET", f"/v1/runs/{job.id}/state",
                     plat.mint(run, "manage", method="GET", target=f"/v1/runs/{job.id}/state",
                               body=""))
    assert r.status == 403 and r.json()["reason"] == "purpose", r
    # positive control: pause (manage), then the state capability reads the root
    pause = f"/v1/runs/{job.id}/pause"
    assert node.request("POST", pause, plat.mint(run, "manage", method="POST", target=pause,
                                                 body="")).status == 200
    r = node.request("GET", f"/v1/runs/{job.id}/state", state, timeout=60)
    assert r.status == 200 and len(r.body) > 0, r
    node.request("DELETE", f"/v1/runs/{job.id}",
                 plat.mint(run, "manage", method="DELETE", target=f"/v1/runs/{job.id}", body=""))
    job.cancel()


def test_registered_node_name_cannot_be_taken_over(plat):
    with open(plat.join_token_file) as f:
        join = f.read().strip().split(".")[1]  # sbxjoin2.<token>.<identity key>.<CA pin>
    body = {"name": "hd-a", "url": "127.0.0.1:9", "capacity": 1, "tls_pubkey": fresh_pubkey()}
    r = http_request(plat.control.port, "POST", "/v1/nodes/register", body,
                     {"Authorization": f"Bearer {join}"})
    assert r.status == 409, r
    r = http_request(plat.control.port, "POST", "/v1/nodes/register", body,
                     {"Authorization": f"Bearer {join}", "X-Sbx-Node-Token": "sbxnode_wrong"})
    assert r.status == 409, r
    nodes = plat.request("GET", "/v1/nodes").json()
    assert [n["port"] for n in nodes if n["name"] == "hd-a"] == [plat.node("hd-a").port]
    # positive control: a new name registers with the join token
    r = http_request(plat.control.port, "POST", "/v1/nodes/register",
                     dict(body, name="hd-new"), {"Authorization": f"Bearer {join}"})
    assert r.status == 200 and r.json()["node_token"].startswith("sbxnode_"), r
    # the real node keeps working
    job = plat.create()
    assert job.sh("echo fine") == "fine\n"
    job.cancel()


def test_agent_port_proxy_is_not_a_way_around_expose(plat):
    job = plat.create(flavor="cpu-small-nonet")
    r = job.proxy("GET", AGENT_PORT, "/v1/proxy/8080/")
    assert r.status == 403 and r.json()["reason"] == "port", r
    r = job.proxy("GET", AGENT_PORT, "/health")  # control: the agent port itself works
    assert r.status == 200, r
    job.cancel()
