/**
 * The effect-ledger demo (examples/effects/demo.sh, `npm run demo:effects`) as a user runs it, with
 * the CLI from source: the worker is killed (kill -9) between the script's two effects, the run is
 * resumed and the script run again; the pull request is opened once, the message sent once. Where
 * this machine can build the cell sandbox, the script ran inside it without network, so the
 * `cairn_effects` module and the cell socket were reached from inside.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { probeSandbox } from "../../src/exec/sandbox.js";
import { cairnIn, ENTRY, ROOT } from "./support.js";

describe("the effect-ledger demo", () => {
  const tmp = mkdtempSync(join(tmpdir(), "cairn-effects-demo-test-"));
  after(() => rmSync(tmp, { recursive: true, force: true }));

  it("an interrupted script, resumed, does not repeat its completed effect", { timeout: 300_000 }, async () => {
    const r = await new Promise<{ code: number | null; out: string }>((resolve, reject) => {
      const child = spawn("bash", [join(ROOT, "examples", "effects", "demo.sh")], {
        cwd: ROOT,
        env: { ...process.env, TMPDIR: tmp, CAIRN_CLI: `${process.execPath} --import tsx ${ENTRY}` },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      child.stdout.setEncoding("utf8").on("data", (d: string) => (out += d));
      child.stderr.setEncoding("utf8").on("data", (d: string) => (out += d));
      const guard = setTimeout(() => child.kill("SIGKILL"), 240_000);
      child.on("error", reject);
      child.on("close", (code) => {
        clearTimeout(guard);
        resolve({ code, out });
      });
    });
    assert.equal(r.code, 0, r.out);
    const count = (re: RegExp) => r.out.split("\n").filter((l) => re.test(l)).length;
    assert.equal(count(/open-pr: made now: pr-1/), 1, r.out);
    assert.equal(count(/open-pr: done before, not repeated: \{"id": "pr-1"\}/), 1, r.out);
    assert.equal(count(/notify-team: made now: message-1/), 1, r.out);
    const work = /demo: workspace (\S+)\/repo;/.exec(r.out)![1]!;
    const api = readdirSync(join(work, "repo", "api")).sort();
    assert.equal(api.length, 2, `the API holds one pull request and one message: ${api.join(", ")}`);
    assert.match(api[0]!, /^message-[0-9a-f-]{36}\.json$/);
    assert.match(api[1]!, /^pr-[0-9a-f-]{36}\.json$/);

    const status = await cairnIn(["status", "--db", "effects", "--data-dir", join(work, ".cairn"), "--json"]);
    assert.equal(status.code, 0, status.stderr);
    type Session = { status: string; cells_ran_in: { sandbox: string; network: string } | null; effects: { name: string; status: string; key: string; attempts: unknown[] }[] };
    const s = (JSON.parse(status.stdout) as { sessions: Session[] }).sessions[0]!;
    assert.equal(s.status, "success");
    if (probeSandbox().ok) assert.deepEqual(s.cells_ran_in, { sandbox: "bwrap", network: "off" }, "the script ran in the sandbox, without network");
    assert.deepEqual(s.effects.map((e) => [e.name, e.status, e.attempts.length]), [["open-pr", "done", 1], ["notify-team", "done", 1]]);
    assert.ok(api[1]!.includes(s.effects[0]!.key), "the API was given the run's key of open-pr");
  });
});
