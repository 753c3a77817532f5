// SPDX-License-Identifier: MIT
// The E2B SDK's cost on sbx (scripts/bench-e2b.sh runs this): create -> run `echo` -> kill,
// one after another and 8 at once, for a dedicated and a pooled template, through E2B's SDK
// (unmodified) and through sbx's own HTTP API directly (Jobs API / pools API, one kept-alive
// TLS connection pool), in the same run. Reads E2B_API_URL, E2B_API_KEY, NODE_EXTRA_CA_CERTS;
// SBX_BENCH_N (sequential flows per variant, default 10) and SBX_BENCH_POOL (the pool's
// name). Prints figures; exits 1 only on a functional failure (a wrong answer).
import crypto from "node:crypto";
import fs from "node:fs";
import https from "node:https";
import { Sandbox } from "e2b";

const N = Number(process.env.SBX_BENCH_N || 10);
const CONC = 8;
const POOL = process.env.SBX_BENCH_POOL || "bench";
const api = new URL(process.env.E2B_API_URL);
const token = process.env.E2B_API_KEY;
const agent = new https.Agent({
  keepAlive: true,
  ca: fs.readFileSync(process.env.NODE_EXTRA_CA_CERTS),
});

function fail(what, detail) {
  console.error(`FAIL: ${what}: ${JSON.stringify(detail)}`);
  process.exit(1);
}

function request(method, path, body, headers = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const h = { Authorization: `Bearer ${token}`, ...headers };
    if (data) {
      h["Content-Type"] = "application/json";
      h["Content-Length"] = data.length;
    }
    const rq = https.request({ host: api.hostname, port: api.port, method, path, headers: h, agent },
      (r) => {
        const b = [];
        r.on("data", (d) => b.push(d));
        r.on("end", () => resolve({ status: r.statusCode, body: Buffer.concat(b).toString() }));
      });
    rq.on("error", reject);
    if (data) rq.write(data);
    rq.end();
  });
}

// ---- the flows ------------------------------------------------------------------------------------

// What the SDK's commands.run starts (a login shell, as E2B's SDK does): the same for both.
const ECHO = ["/bin/bash", "-l", "-c", "echo hi"];

async function sdkFlow(template) {
  const sbx = await Sandbox.create(template, { timeoutMs: 300_000 });
  const r = await sbx.commands.run("echo hi");
  if (r.stdout !== "hi\n") fail("SDK: echo", r);
  await sbx.kill();
}

function execOut(r) {
  if (r.status !== 200) fail("exec", r);
  const out = r.body.split("\n").filter((l) => l).map((l) => JSON.parse(l));
  const text = out.filter((e) => e.event === "stdout").map((e) => e.data).join("");
  if (text !== "hi\n" || !out.some((e) => e.event === "exit" && e.exit_code === 0)) fail("exec", out);
}

async function directDedicated() {
  const tok = crypto.randomBytes(32).toString("hex");
  const c = await request("POST", "/v1/jobs/e2b", { image: "host", secrets: { SBX_TOKEN: tok } });
  if (c.status !== 201) fail("Jobs API create", c);
  const id = JSON.parse(c.body).id;
  // E2B's create answers once the run serves: wait for that here too
  for (let i = 0; ; i++) {
    const j = await request("GET", `/v1/jobs/e2b/${id}`);
    const job = JSON.parse(j.body);
    if (job.stage === "RUNNING" && job.run && job.run.state === "running") break;
    if (i > 3000) fail("Jobs API: not RUNNING", job);
    await new Promise((r) => setTimeout(r, 5));
  }
  execOut(await request("POST", `/v1/jobs/e2b/${id}/proxy/49983/v1/exec`, { cmd: ECHO },
    { "X-Sandbox-Token": tok }));
  const k = await request("POST", `/v1/jobs/e2b/${id}/cancel`);
  if (k.status !== 202 && k.status !== 200) fail("Jobs API cancel", k);
}

async function directPooled() {
  const c = await request("POST", `/v1/pools/e2b/${POOL}/sandboxes`, { count: 1 });
  if (c.status !== 200) fail("pools API create", c);
  const sb = JSON.parse(c.body).sandboxes[0];
  const base = `/v1/pools/e2b/${POOL}/sandboxes/${sb.id}`;
  execOut(await request("POST", `${base}/exec`, { cmd: ECHO }));
  const d = await request("DELETE", base);
  if (d.status !== 200) fail("pools API delete", d);
}

// ---- timing ----------------------------------------------------------------------------------------

const pct = (a, p) => a.slice().sort((x, y) => x - y)[Math.min(a.length - 1, Math.floor(a.length * p / 100))];

async function sequential(f) {
  const t = [];
  for (let i = 0; i < N; i++) {
    const t0 = performance.now();
    await f();
    t.push(performance.now() - t0);
  }
  return { p50: pct(t, 50), mean: t.reduce((a, b) => a + b, 0) / t.length };
}

async function concurrent(f) {
  const t0 = performance.now();
  await Promise.all(Array.from({ length: CONC }, () => f()));
  return performance.now() - t0;
}

// ---- the run -----------------------------------------------------------------------------------------

const p = await request("POST", "/v1/pools/e2b", { name: POOL, per_host: 64, warm: 1 });
if (p.status !== 201 && p.status !== 409) fail("pool create", p);
await directPooled(); // the pool's first host boots here, not in the figures
await sdkFlow(POOL);
await directDedicated();

console.log(`== create -> run echo -> kill (${N} one after another: p50, mean; ${CONC} at once: the batch)`);
const row = (label, v, unit = "ms") => console.log(`  ${label.padEnd(52)} ${v.toFixed(1).padStart(9)} ${unit}`);
for (const [kind, tpl, direct] of [["dedicated", "base", directDedicated], ["pooled", POOL, directPooled]]) {
  const sdk = await sequential(() => sdkFlow(tpl));
  const http = await sequential(direct);
  const sdkC = await concurrent(() => sdkFlow(tpl));
  const httpC = await concurrent(direct);
  console.log(`-- ${kind} (template ${tpl})`);
  row("E2B SDK, one after another, p50", sdk.p50);
  row("sbx HTTP API directly, one after another, p50", http.p50);
  row("  ratio SDK / direct (p50)", sdk.p50 / http.p50, "x");
  row(`E2B SDK, ${CONC} at once, the batch`, sdkC);
  row(`sbx HTTP API directly, ${CONC} at once, the batch`, httpC);
  row("  ratio SDK / direct (batch)", sdkC / httpC, "x");
}
agent.destroy();
console.log("done");
