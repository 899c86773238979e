/**
 * `cairn serve` workers failing over on Durable Streams, with real processes against the reference
 * server (file-backed, in a temporary directory), as on etcd and sqlite (chaos/sched.test.ts):
 *
 * - a second `cairn serve` on the same database waits in standby (/readyz 503 naming the owner; its
 *   stderr says standby) while the first renews its owner lease; `cairn submit` reaches the owner and
 *   the run starts there;
 * - the owner SIGKILLed while the run's cell runs: the standby takes over (the wait is a hang guard,
 *   never a timed assertion), recovers the run (the in-flight cell is UnknownExecution, its process
 *   stopped), loses nothing committed before the kill, runs no cell twice, and a later `cairn submit`
 *   runs on it;
 * - an owner frozen with SIGSTOP stops renewing: a standby takes over, and the owner, thawed, finds
 *   itself fenced (exit 3).
 */
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, describe, it } from "node:test";
import { cleanupProcesses, describe as said, runCairn, startCairn, type CliProcess } from "../../chaos/support/cli.js";
import { ofKind, readAll } from "../../chaos/support/log.js";
import { cmdPatch, concludePatch, writeScript } from "../../chaos/support/patches.js";
import { until } from "../support/wait.js";
import { main } from "../../src/cli/main.js";
import type { LogEvent } from "../../src/state/events.js";
import { createDurableStreamsStorage } from "../../storage-adapters/durable-streams/index.js";
import { freePort } from "../../storage-adapters/durable-streams/devserver.js";
import { assertWellFormed, devServer } from "./helpers.js";

after(() => cleanupProcesses());

async function readyz(port: number): Promise<{ status: number; text: string } | undefined> {
  try {
    const r = await fetch(`http://127.0.0.1:${port}/readyz`);
    return { status: r.status, text: await r.text() };
  } catch {
    return undefined;
  }
}

/** Polls until `/readyz` on `port` answers `status` with a text starting `prefix` (a hang guard, never a speed assertion). */
async function readyzIs(port: number, status: number, limitMs = 120_000, prefix = ""): Promise<string> {
  return until(`/readyz on ${port} to answer ${status} ${prefix}`, async () => {
    const r = await readyz(port);
    return r?.status === status && r.text.startsWith(prefix) ? r.text : undefined;
  }, limitMs);
}

describe("cairn serve failing over on --storage durable-streams", { timeout: 600_000 }, () => {
  it("standby while the owner renews; submit reaches the owner; SIGKILL: the standby takes over and recovers the run; SIGSTOP: the thawed owner is fenced", async () => {
    const server = await devServer("failover");
    const work = join(server.root, "work");
    mkdirSync(work, { recursive: true });
    const model = join(server.root, "model.json");
    // Cell 1 appends a line (each execution leaves one), then, until the test creates `go`, says it
    // started and sleeps: the owner is killed while it runs.
    writeScript(model, [cmdPatch(0, 1, ["sh", "-c", "echo ran >> ran.txt; [ -e go ] || { touch started; exec sleep 600; }"]), concludePatch(1, 2, "failure", "the run ended")]);
    const storageFlags = ["--db", "fo", "--storage", "durable-streams", "--url", server.url];
    const serve = async (name: string): Promise<{ proc: CliProcess; port: number }> => {
      const port = await freePort();
      const args = ["serve", ...storageFlags, "--data-dir", join(server.root, name), "--model", `scripted:${model}`, "--cwd", work, "--listen", `127.0.0.1:${port}`, "--create", "--lease", "2s", "--fenced-linger", "1s"];
      return { proc: startCairn(args, {}, 400_000), port };
    };
    const submit = (goal: string, session: string) => runCairn(["submit", goal, ...storageFlags, "--data-dir", join(server.root, "cli"), "--session", session], {}, 120_000);
    const log = (): Promise<LogEvent[]> => readAll(createDurableStreamsStorage({ url: server.url }), "fo");
    const status = async (session: string): Promise<string | undefined> => {
      const out: string[] = [];
      const code = await main(["status", ...storageFlags, "--data-dir", join(server.root, "cli"), "--json", "--session", session], { out: (l) => out.push(l), err: () => {}, env: {} });
      if (code !== 0) return undefined;
      return (JSON.parse(out.join("\n")) as { sessions: { status: string }[] }).sessions[0]?.status;
    };
    const ended = (session: string) => until(`run ${session} to end`, async () => {
      const s = await status(session);
      return s !== undefined && s !== "running" && s !== "pending" ? s : undefined;
    }, 180_000);

    const a = await serve("a");
    await readyzIs(a.port, 200);
    const b = await serve("b");
    const standby = await readyzIs(b.port, 503, 120_000, "standby");
    assert.match(standby, new RegExp(`^standby: owned by .* since .*pid ${a.proc.pid}, serve`), "the standby names the live owner");

    const sub = await submit("job one", "job-1");
    assert.equal(sub.code, 0, said(sub));
    await until("the run's cell to start on the owner", () => (existsSync(join(work, "started")) ? true : undefined), 120_000);
    const before = await log();
    assert.ok(ofKind(before, "execution_started").some((e) => e.session === "job-1"), "the owner started the run's cell");
    assert.equal((await readyz(b.port))?.status, 503, "still standby while the owner renews");

    a.proc.child.kill("SIGKILL");
    assert.equal((await a.proc.result).signal, "SIGKILL");
    const owner = await readyzIs(b.port, 200, 180_000);
    assert.match(owner, /^owns "fo" at epoch \d+/);
    assert.equal(await ended("job-1"), "failure", "the run was recovered and went on to its end on the new owner");

    const afterKill = await log();
    assertWellFormed(afterKill, "after the takeover");
    assert.deepEqual(afterKill.slice(0, before.length), before, "everything committed before the kill is still there, unchanged");
    const starts = ofKind(afterKill, "execution_started").filter((e) => e.session === "job-1" && e.body.cell_id === 1);
    assert.equal(starts.length, 1, "the in-flight cell was not run again");
    const finished = ofKind(afterKill, "execution_finished").filter((e) => e.session === "job-1" && e.body.cell_id === 1);
    assert.equal(finished.length, 1);
    assert.equal(finished[0]!.body.result, "UnknownExecution", "the in-flight cell is UnknownExecution");
    assert.equal(finished[0]!.body.unknown?.worker_stopped, true, `the killed owner's cell was stopped by the new owner (same host): ${finished[0]!.body.detail}`);
    assert.equal(readFileSync(join(work, "ran.txt"), "utf8"), "ran\n", "the cell ran once");

    writeFileSync(join(work, "go"), "");
    const sub2 = await submit("job two", "job-2");
    assert.equal(sub2.code, 0, said(sub2));
    assert.equal(await ended("job-2"), "failure", "a run submitted later runs on the new owner");
    assert.equal(readFileSync(join(work, "ran.txt"), "utf8"), "ran\nran\n", "its cell ran, once");
    assert.equal((await readyz(b.port))?.status, 200);

    // A third worker waits behind the new owner; the owner is frozen, the third takes over, and the
    // thawed owner stops, fenced.
    const c = await serve("c");
    await readyzIs(c.port, 503, 120_000, "standby");
    process.kill(b.proc.pid, "SIGSTOP");
    try {
      await readyzIs(c.port, 200, 180_000);
    } finally {
      process.kill(b.proc.pid, "SIGCONT");
    }
    const rb = await b.proc.result;
    assert.equal(rb.code, 3, said(rb));
    assert.match(rb.stderr, /cairn: standby: database "fo" is owned by/, "the second worker said it waited in standby");
    assert.match(rb.stderr, /cairn: fenced: another process owns database "fo" now/, said(rb));
    assert.equal((await readyz(c.port))?.status, 200, "the new owner keeps the database");
    assertWellFormed(await log(), "after the second takeover");
    c.proc.child.kill("SIGTERM");
    const rc = await c.proc.result;
    assert.equal(rc.code, 0, said(rc));
  });
});
