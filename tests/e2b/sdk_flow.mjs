// SPDX-License-Identifier: MIT
// E2B's SDK (the npm package, unmodified) through a whole sandbox's life on sbx: commands
// (streamed, failing, in the background with stdin, killed), a PTY, files, a directory watch,
// a port reached by getHost, timeouts, listing, pause and connect, kill. Reads E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY from the environment (NODE_EXTRA_CA_CERTS trusts the
// platform's CA) and the template from SBX_E2B_TEMPLATE ("base": a dedicated sandbox; a pool's
// name: a pooled one). Prints one JSON line per step; exits 1 at the first unexpected answer.
import https from "node:https";
import tls from "node:tls";
import { CommandExitError, Sandbox } from "e2b";

const template = process.env.SBX_E2B_TEMPLATE || "base";
// a pooled sandbox (the template names a pool): no lifetime to move, no pause, writes only in
// its home, services on $SBX_PROXY_DIR/<port>.sock (docs/e2b.md)
const pooled = process.env.SBX_E2B_POOLED === "1";
const out = (step, v = {}) => console.log(JSON.stringify({ step, ...v }));
function check(cond, what, detail) {
  if (!cond) {
    console.error(`FAIL: ${what}${detail === undefined ? "" : ": " + JSON.stringify(detail)}`);
    process.exit(1);
  }
}
async function waitFor(f, ms = 10_000) {
  const end = Date.now() + ms;
  for (;;) {
    if (await f()) return true;
    if (Date.now() > end) return false;
    await new Promise((r) => setTimeout(r, 50));
  }
}
const text = (chunks) => new TextDecoder().decode(Buffer.concat(chunks.map((c) => Buffer.from(c))));

const api = new URL(process.env.E2B_API_URL);
// A request to a sandbox's host name, sent to the control plane's address (no wildcard DNS
// here); Node takes the TLS name from the Host header: the control plane's certificate names
// its address, not the sandbox's host name, which needs a wildcard name of the operator's.
const viaHost = (method, hostName, path, headers = {}, body = undefined) =>
  new Promise((resolve, reject) => {
    const checkServerIdentity = (_, cert) => tls.checkServerIdentity(api.hostname, cert);
    const rq = https.request(
      { host: api.hostname, port: api.port, method, path, headers: { Host: hostName, ...headers },
        checkServerIdentity },
      (r) => {
        const b = [];
        r.on("data", (d) => b.push(d));
        r.on("end", () => resolve({ status: r.statusCode, body: Buffer.concat(b).toString() }));
      });
    rq.on("error", reject);
    if (body !== undefined) rq.write(body);
    rq.end();
  });

const tag = `t${Date.now()}`;
let t0 = Date.now();
const sbx = await Sandbox.create(template, { metadata: { suite: tag }, timeoutMs: 300_000 });
out("create", { id: sbx.sandboxId, template, ms: Date.now() - t0 });
check(/^[A-Za-z0-9]+$/.test(sbx.sandboxId), "a sandbox id without '-' or '.'", sbx.sandboxId);

// ---- commands: streamed output, exit codes -----------------------------------------------------
const seen = [];
// out2 is written only once $HOME/sbx-go exists, which the stdout callback makes on seeing out1:
// so "out2" (not "out2-unreleased") proves out1 reached the client while the command ran
const goHome = (await sbx.commands.run("printf %s \"$HOME\"")).stdout;
let released = null;
const res = await sbx.commands.run(
  "echo out1; echo err1 >&2; i=0; while [ ! -e \"$HOME/sbx-go\" ] && [ $i -lt 600 ]; do " +
  "sleep 0.05; i=$((i+1)); done; [ -e \"$HOME/sbx-go\" ] && echo out2 || echo out2-unreleased", {
  onStdout: (d) => {
    seen.push({ at: Date.now(), d });
    if (!released && d.includes("out1")) released = sbx.files.write(`${goHome}/sbx-go`, "go");
  },
  onStderr: (d) => seen.push({ at: Date.now(), e: d }),
});
if (released) await released;
out("run", { exitCode: res.exitCode, stdout: res.stdout, stderr: res.stderr, chunks: seen.length });
check(res.exitCode === 0 && res.stdout === "out1\nout2\n" && res.stderr === "err1\n", "run", res);
const so = seen.filter((x) => x.d !== undefined);
check(so.map((x) => x.d).join("") === "out1\nout2\n", "stdout callbacks carry the output", seen);
check(so.length >= 2 && released !== null,
  "output streams while the command runs (out1 arrives before out2 is written)", seen);
check(seen.some((x) => x.e === "err1\n"), "stderr callback", seen);

let failed = null;
try {
  await sbx.commands.run("echo bad >&2; exit 3");
} catch (e) {
  failed = e;
}
out("run-fails", { error: failed && failed.constructor.name, exitCode: failed && failed.exitCode });
check(failed instanceof CommandExitError && failed.exitCode === 3 && failed.stderr === "bad\n",
  "a non-zero exit is a CommandExitError with its code and stderr", failed && failed.message);

const home = (await sbx.commands.run("printf %s \"$HOME\"")).stdout;
check(home.startsWith("/"), "a home", home);
const base = pooled ? home : "/tmp";
const env = await sbx.commands.run("echo $GREETING; pwd", { envs: { GREETING: "hi" }, cwd: base });
check(env.stdout === `hi\n${base}\n`, "envs and cwd", env.stdout);

// ---- background, connect, stdin, list, kill ------------------------------------------------------
const bg = await sbx.commands.run("cat", { background: true, stdin: true });
const got = [];
const attached = await sbx.commands.connect(bg.pid, { onStdout: (d) => got.push(d) });
await sbx.commands.sendStdin(bg.pid, "hello stdin\n");
check(await waitFor(() => got.join("").includes("hello stdin\n")), "stdin reaches the process", got);
const procs = await sbx.commands.list();
check(procs.some((p) => p.pid === bg.pid && p.cmd.length > 0), "list shows it", procs);
check((await sbx.commands.kill(bg.pid)) === true, "kill a running process");
let ended = null;
try {
  ended = await attached.wait();
} catch (e) {
  ended = e;
}
check(ended && ended.exitCode !== 0, "a killed process ends with a non-zero code", ended);
check((await sbx.commands.kill(999999)) === false, "kill of an unknown pid answers false");
out("background", { pid: bg.pid, got: got.join("") });

// ---- a PTY --------------------------------------------------------------------------------------
const term = [];
const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => term.push(d) });
await sbx.pty.resize(pty.pid, { cols: 100, rows: 40 });
await sbx.pty.sendInput(pty.pid, new TextEncoder().encode("stty size; tty; exit\n"));
try {
  await pty.wait();
} catch (e) {
  /* a shell's exit code */
}
const screen = text(term);
out("pty", { pid: pty.pid, bytes: screen.length });
check(screen.includes("40 100"), "the PTY has the size it was resized to", screen);
check(/\/dev\/pts\/\d+/.test(screen), "a real terminal", screen);

// ---- files ----------------------------------------------------------------------------------------
const dir = `${base}/e2b-${tag}`;
await sbx.files.makeDir(dir);
await sbx.files.write(`${dir}/a.txt`, "text content\n");
const bin = new Uint8Array([0, 1, 2, 200, 255, 10, 13]);
await sbx.files.write(`${dir}/b.bin`, bin.buffer);
await sbx.files.write([
  { path: `${dir}/m1.txt`, data: "one" },
  { path: `${dir}/m2.txt`, data: "two" },
]);
check((await sbx.files.read(`${dir}/a.txt`)) === "text content\n", "read text");
const back = await sbx.files.read(`${dir}/b.bin`, { format: "bytes" });
check(Buffer.from(back).equals(Buffer.from(bin)), "read binary, byte for byte", Array.from(back));
check((await sbx.files.read(`${dir}/m2.txt`)) === "two", "several files at once");
const names = (await sbx.files.list(dir)).map((e) => e.name).sort();
check(JSON.stringify(names) === JSON.stringify(["a.txt", "b.bin", "m1.txt", "m2.txt"]), "list", names);
check((await sbx.files.exists(`${dir}/a.txt`)) === true, "exists");
check((await sbx.files.exists(`${dir}/nope`)) === false, "exists: a missing file");
await sbx.files.makeDir(`${dir}/sub`);
const sub = (await sbx.files.list(dir)).find((e) => e.name === "sub");
check(sub && sub.type === "dir", "makeDir makes a directory", sub);
await sbx.files.rename(`${dir}/a.txt`, `${dir}/sub/a2.txt`);
check((await sbx.files.read(`${dir}/sub/a2.txt`)) === "text content\n", "rename");
check((await sbx.files.exists(`${dir}/a.txt`)) === false, "rename: the old name is gone");
await sbx.files.remove(`${dir}/sub/a2.txt`);
check((await sbx.files.exists(`${dir}/sub/a2.txt`)) === false, "remove");
const cat = await sbx.commands.run(`cat ${dir}/m1.txt`);
check(cat.stdout === "one", "files written through the SDK are the sandbox's files", cat.stdout);
out("files", { names });

// ---- presigned URLs (downloadUrl, uploadUrl): no token, a signature the agent checks ---------
{
  // with E2B_SANDBOX_URL the SDK signs URLs of that one address, which name no sandbox: they
  // need host routing, so a handle without it (docs/e2b.md)
  const shared = process.env.E2B_SANDBOX_URL;
  delete process.env.E2B_SANDBOX_URL;
  const byHost = await Sandbox.connect(sbx.sandboxId);
  process.env.E2B_SANDBOX_URL = shared;
  const dl = new URL(await byHost.downloadUrl(`${dir}/m1.txt`));
  check(dl.host.startsWith(`49983-${sbx.sandboxId}.`), "downloadUrl names the sandbox", dl.href);
  const send = (method, u, body) => viaHost(method, u.host, u.pathname + u.search, {}, body);
  const got = await send("GET", dl);
  check(got.status === 200 && got.body === "one", "downloadUrl reads the file", got);
  const forged = new URL(dl);
  forged.searchParams.set("path", `${dir}/m2.txt`);
  const refused = await send("GET", forged);
  check(refused.status === 401 && !refused.body.includes("two"),
    "a signature is for its own path only", refused);
  const ul = new URL(await byHost.uploadUrl(`${dir}/up.txt`, { useSignatureExpiration: 60 }));
  const put = await send("POST", ul, "via url");
  check(put.status === 200, "uploadUrl takes a raw body", put);
  check((await sbx.files.read(`${dir}/up.txt`)) === "via url", "uploadUrl wrote it");
  await sbx.files.remove(`${dir}/up.txt`);
  out("presigned", {});
}

// ---- a directory watch ---------------------------------------------------------------------------
const events = [];
const watcher = await sbx.files.watchDir(dir, (e) => events.push({ name: e.name, type: e.type }));
await sbx.files.write(`${dir}/w.txt`, "x");
await sbx.files.remove(`${dir}/w.txt`);
const sawBoth = await waitFor(
  () => events.some((e) => e.name === "w.txt" && e.type === "create") &&
    events.some((e) => e.name === "w.txt" && e.type === "remove"),
);
await watcher.stop();
out("watchDir", { events });
check(sawBoth, "watchDir sees the create and the remove", events);

// ---- a port, by getHost --------------------------------------------------------------------------
await sbx.commands.run(`mkdir -p ${dir}/www && echo hello-port > ${dir}/www/index.txt`);
if (pooled) {
  // an HTTP server of ./www on the unix socket $SBX_PROXY_DIR/<port>.sock
  await sbx.files.write(`${dir}/srv.py`, [
    "import http.server, os, socketserver, sys",
    "os.chdir(sys.argv[2])",
    "class H(http.server.SimpleHTTPRequestHandler):",
    "    def address_string(self):",
    "        return 'unix'",
    "class S(socketserver.UnixStreamServer):",
    "    def get_request(self):",
    "        return self.socket.accept()[0], ('unix', 0)",
    "S(os.path.join(os.environ['SBX_PROXY_DIR'], sys.argv[1] + '.sock'), H).serve_forever()",
    "",
  ].join("\n"));
  await sbx.commands.run(`exec python3 ${dir}/srv.py 8000 ${dir}/www`, { background: true });
} else {
  await sbx.commands.run(`exec python3 -m http.server 8000 --bind 127.0.0.1 --directory ${dir}/www`,
    { background: true });
}
const host = sbx.getHost(8000);
check(host.startsWith(`8000-${sbx.sandboxId}.`), "getHost names the port and the sandbox", host);
const get = (token) =>
  viaHost("GET", host, "/index.txt", token ? { "e2b-traffic-access-token": token } : {});
let page = null;
await waitFor(async () => (page = await get(sbx.trafficAccessToken)).status === 200, 15_000);
out("getHost", { host, status: page.status });
check(page.status === 200 && page.body === "hello-port\n", "getHost(port) reaches the server", page);
const anon = await get(null);
check(anon.status === 401 && !anon.body.includes("hello-port"), "a port without the token", anon);

// ---- timeout, listing -----------------------------------------------------------------------------
if (pooled) {
  let refused = null;
  try {
    await sbx.setTimeout(600_000);
  } catch (e) {
    refused = e.message;
  }
  out("setTimeout", { refused });
  check(refused && /pooled/.test(refused), "a pooled sandbox's setTimeout says why not", refused);
} else {
  const before = await sbx.getInfo();
  await sbx.setTimeout(600_000);
  const after = await sbx.getInfo();
  out("setTimeout", { before: before.endAt, after: after.endAt });
  check(after.endAt.getTime() > before.endAt.getTime(), "setTimeout moves the end", [before, after]);
}
const listed = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems();
check(listed.length === 1 && listed[0].sandboxId === sbx.sandboxId, "list by metadata", listed);

// ---- pause and connect -----------------------------------------------------------------------------
if (!pooled) {
  t0 = Date.now();
  check((await sbx.pause()) === true, "pause");
  check((await Sandbox.getInfo(sbx.sandboxId)).state === "paused", "paused");
  const again = await Sandbox.connect(sbx.sandboxId);
  out("pause-connect", { ms: Date.now() - t0 });
  const kept = await again.commands.run(`cat ${dir}/m1.txt`);
  check(kept.stdout === "one", "its files are kept across pause and connect", kept.stdout);
}

// ---- kill ----------------------------------------------------------------------------------------
await sbx.kill();
check((await Sandbox.kill(sbx.sandboxId)) === false, "a killed sandbox: kill answers false");
check((await sbx.isRunning()) === false, "a killed sandbox is not running");
out("done");
