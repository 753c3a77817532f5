// SPDX-License-Identifier: MIT
// E2B's SDK (the npm package, unmodified) straight against one sbx-server's envd routes, no
// control plane: the Sandbox object is built from what a create would answer. Reads
// E2B_SANDBOX_URL (the agent, or a pool sandbox's /v1/sandboxes/<id> prefix), SBX_ENVD_TOKEN
// (the access token), SBX_ENVD_DIR (a directory to work in, as the SDK names it) and
// SBX_ENVD_PWD (what pwd prints there: in a pool sandbox paths are rooted at its home);
// prints one JSON line per step and exits 1 at the first unexpected answer.
import { Sandbox, CommandExitError } from "e2b";

const out = (step, v) => console.log(JSON.stringify({ step, ...v }));
function check(cond, what) {
  if (!cond) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
}

const dir = process.env.SBX_ENVD_DIR;
const pwd = process.env.SBX_ENVD_PWD || dir;
const sbx = new Sandbox({
  sandboxId: "sbxenvdtest",
  envdVersion: "0.5.7",
  envdAccessToken: process.env.SBX_ENVD_TOKEN,
  sandboxUrl: process.env.E2B_SANDBOX_URL,
  apiKey: "unused",
});

check((await sbx.isRunning()) === true, "isRunning");
out("isRunning", {});

// commands: streamed output, envs, cwd, exit codes
const chunks = [];
const r = await sbx.commands.run('printf "%s" "$GREETING"; echo; pwd; echo err >&2', {
  envs: { GREETING: "hello e2b" },
  cwd: dir,
  onStdout: (d) => chunks.push(d),
});
out("run", { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode });
check(r.exitCode === 0 && r.stdout === `hello e2b\n${pwd}\n` && r.stderr === "err\n", "run");
check(chunks.join("") === r.stdout, "onStdout saw the output");

let failed = null;
try {
  await sbx.commands.run("exit 7");
} catch (e) {
  failed = e;
}
out("run-exit-7", { name: failed?.name, exitCode: failed?.exitCode });
check(failed instanceof CommandExitError && failed.exitCode === 7, "CommandExitError(7)");

// background, list, stdin, kill
const bg = await sbx.commands.run("read line; echo \"got $line\"", { background: true, stdin: true });
const listed = await sbx.commands.list();
out("list", { pids: listed.map((p) => p.pid), bg: bg.pid });
check(listed.some((p) => p.pid === bg.pid), "list shows the background command");
await sbx.commands.sendStdin(bg.pid, "ping\n");
const bgr = await bg.wait();
out("stdin", { stdout: bgr.stdout });
check(bgr.stdout === "got ping\n", "sendStdin reached the command");

const sleeper = await sbx.commands.run("sleep 60", { background: true });
check((await sbx.commands.kill(sleeper.pid)) === true, "kill: true");
let killed = null;
try {
  await sleeper.wait();
} catch (e) {
  killed = e;
}
out("kill", { exitCode: killed?.exitCode });
check(killed instanceof CommandExitError && killed.exitCode === -1, "a killed command: exit -1");
check((await sbx.commands.kill(999999)) === false, "kill of an unknown pid: false");

// files
const w = await sbx.files.write(`${dir}/hello.txt`, "hi from the sdk\n");
out("write", { path: w.path });
check(w.path === `${dir}/hello.txt`, "write: its path");
check((await sbx.files.read(`${dir}/hello.txt`)) === "hi from the sdk\n", "read");
const bytes = await sbx.files.read(`${dir}/hello.txt`, { format: "bytes" });
check(bytes.length === 16, "read as bytes");
await sbx.files.write([
  { path: `${dir}/multi/a.txt`, data: "A" },
  { path: `${dir}/multi/b.txt`, data: "B" },
]);
const entries = await sbx.files.list(`${dir}/multi`);
out("list-files", { names: entries.map((e) => e.name) });
check(entries.map((e) => e.name).sort().join() === "a.txt,b.txt", "files.list");
check((await sbx.files.exists(`${dir}/multi/a.txt`)) === true, "exists");
check((await sbx.files.exists(`${dir}/nope`)) === false, "exists: false");
check((await sbx.files.makeDir(`${dir}/made`)) === true, "makeDir");
check((await sbx.files.makeDir(`${dir}/made`)) === false, "makeDir again: false");
const info = await sbx.files.getInfo(`${dir}/hello.txt`);
out("getInfo", { type: info.type, size: info.size, name: info.name });
check(info.type === "file" && info.size === 16 && info.name === "hello.txt", "getInfo");
const moved = await sbx.files.rename(`${dir}/hello.txt`, `${dir}/made/moved.txt`);
check(moved.path === `${dir}/made/moved.txt`, "rename");
await sbx.files.remove(`${dir}/multi`);
check((await sbx.files.exists(`${dir}/multi`)) === false, "remove");

// presigned URLs: fetched with no header at all. The SDK builds them as new URL("/files",
// base): a path prefix of E2B_SANDBOX_URL is dropped, so SBX_ENVD_PRESIGNED=0 skips them when
// the agent is reached through one (a pool sandbox's /v1/sandboxes/<id>).
if (process.env.SBX_ENVD_PRESIGNED !== "0") {
  const dl = await sbx.downloadUrl(`${dir}/made/moved.txt`);
  const got = await (await fetch(dl)).text();
  out("downloadUrl", { ok: got === "hi from the sdk\n" });
  check(got === "hi from the sdk\n", "downloadUrl");
  const ul = await sbx.uploadUrl(`${dir}/uploaded.txt`, { useSignatureExpiration: 60 });
  const form = new FormData();
  form.append("file", new Blob(["via url"]), `${dir}/uploaded.txt`);
  const up = await fetch(ul, { method: "POST", body: form });
  check(up.status === 200, `uploadUrl: ${up.status}`);
  check((await sbx.files.read(`${dir}/uploaded.txt`)) === "via url", "uploadUrl wrote it");
  const forged = new URL(dl);
  forged.searchParams.set("path", `${dir}/uploaded.txt`);
  check((await fetch(forged)).status === 401, "a signature is for its own path only");
  out("uploadUrl", {});
}

// watchDir
const seen = [];
const handle = await sbx.files.watchDir(dir, (ev) => seen.push(ev));
await sbx.files.write(`${dir}/watched.txt`, "x");
for (let i = 0; i < 50 && !seen.some((e) => e.name === "watched.txt"); i++)
  await new Promise((res) => setTimeout(res, 100));
await handle.stop();
out("watchDir", { events: seen.map((e) => `${e.type}:${e.name}`) });
check(seen.some((e) => e.name === "watched.txt" && e.type === "create"), "watchDir: create");

// pty
let ptyOut = "";
const dec = new TextDecoder();
const term = await sbx.pty.create({
  cols: 80,
  rows: 24,
  onData: (d) => {
    ptyOut += dec.decode(d, { stream: true });
  },
  cwd: dir,
  envs: { PS1: "$ " },
});
await sbx.pty.resize(term.pid, { cols: 100, rows: 33 });
await sbx.pty.sendInput(term.pid, new TextEncoder().encode("stty size; exit\n"));
const tr = await term.wait();
out("pty", { exitCode: tr.exitCode, sawSize: ptyOut.includes("33 100") });
check(ptyOut.includes("33 100"), "pty: resized, input reached it");

out("done", {});
