// SPDX-License-Identifier: MIT
// E2B's SDK (the npm package, unmodified) against sbx-control's E2B control API. Reads
// E2B_API_URL and E2B_API_KEY from the environment (NODE_EXTRA_CA_CERTS trusts the platform's
// CA); prints one JSON line per step, and exits 1 at the first unexpected answer.
import { Sandbox } from "e2b";

const out = (step, v) => console.log(JSON.stringify({ step, ...v }));
function check(cond, what) {
  if (!cond) {
    console.error(`FAIL: ${what}`);
    process.exit(1);
  }
}

const tag = `t${Date.now()}`;
const t0 = Date.now();
const sbx = await Sandbox.create("base", { metadata: { suite: tag }, timeoutMs: 120_000 });
out("create", { id: sbx.sandboxId, ms: Date.now() - t0 });
check(/^[A-Za-z0-9]+$/.test(sbx.sandboxId), "a sandbox id without '-' or '.'");

const info = await sbx.getInfo();
out("getInfo", { state: info.state, templateId: info.templateId, metadata: info.metadata });
check(info.state === "running" && info.metadata.suite === tag, "getInfo: running, its metadata");

const paginator = Sandbox.list({ query: { metadata: { suite: tag } } });
const listed = await paginator.nextItems();
out("list", { ids: listed.map((s) => s.sandboxId) });
check(listed.length === 1 && listed[0].sandboxId === sbx.sandboxId, "list by metadata: exactly it");

await sbx.setTimeout(60_000);
out("setTimeout", {});

const again = await Sandbox.connect(sbx.sandboxId);
out("connect", { id: again.sandboxId });
check(again.sandboxId === sbx.sandboxId, "connect: the same sandbox");

check((await sbx.kill()) === undefined || true, "kill");
out("kill", {});
const gone = await Sandbox.kill(sbx.sandboxId);
out("kill-again", { result: gone });
check(gone === false, "killing a killed sandbox answers false (404 with code 404)");

let notFound = false;
try {
  await Sandbox.connect("0123456789abcdef01234567");
} catch (e) {
  notFound = e.constructor.name;
}
out("connect-unknown", { error: notFound });
check(notFound && /NotFound/.test(notFound), "connect to an unknown id: SandboxNotFoundError");
out("done", {});
