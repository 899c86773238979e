/**
 * The HTTP API of `cairn serve` on the replicated adapter (a real 3-member etcd cluster started
 * here): submit, pause, approve and the live event stream through the API; and requests whose serve
 * is SIGKILLed while they are pending, applied exactly once:
 *
 *   - a pause sent to the owner, which SIGKILLs itself right after committing it (the client's
 *     connection drops unanswered): the standby that takes over reports the retry of the same
 *     Idempotency-Key as applied before, and the log holds the pause once;
 *   - an unpause sent to a standby while the owner is frozen (SIGSTOP), then SIGKILLed: the request
 *     waits in the mailbox, the standby takes over and applies it, and the pending request answers
 *     applied (or, past its wait, 202 unconfirmed: honest, never a false "done"); the log holds it once.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tempDir } from "../harness/support.js";
import { until } from "../support/wait.js";
import { startDevCluster, type DevCluster } from "../../src/cli/devcluster/index.js";
import { call, cmdRound, concludeRound, GATED, killAll, pendingRequestSurvivesKill, readSse, runOf, startServe, writeModel } from "./api-support.js";

const t = tempDir("cairn-api-etcd-");
let cluster: DevCluster | null = null;

before(async () => {
  cluster = await startDevCluster({ dir: join(t.dir, "etcd") });
});
after(async () => {
  killAll();
  await cluster?.stop();
  t.cleanup();
});

/** A scenario's work dir and the flags of a serve of database `db` with data dir `role`. */
function scenario(name: string, db: string) {
  const dir = join(t.dir, name);
  const work = join(dir, "work");
  mkdirSync(work, { recursive: true });
  const model = writeModel(join(dir, "model.json"), [cmdRound(0, 1, GATED), cmdRound(1, 2, ["touch", "touched"]), concludeRound(2, 3, "done")]);
  const flags = (role: string, extra: string[] = []) => ["--db", db, "--storage", "replicated", "--etcd", cluster!.endpoints.join(","), "--data-dir", join(dir, `data-${role}`), "--cwd", work, "--model", `scripted:${model}`, ...extra];
  return {
    work,
    flags,
    release: () => writeFileSync(join(work, "release"), ""),
    effect: () => (existsSync(join(work, "effect.txt")) ? readFileSync(join(work, "effect.txt"), "utf8").split("\n").filter(Boolean).length : 0),
  };
}

describe("the HTTP API of cairn serve on a 3-member etcd cluster", () => {
  it("submit, pause, unpause, approve and the live stream through the API", async () => {
    const c = scenario("basic", "api-basic");
    const serve = await startServe(c.flags("owner", ["--create"]));
    const sub = await call(serve.url, "POST", "/api/v1/runs", { goal: "touch, approved", session: "r1", require_approval: ["argv:touch"] });
    assert.equal(sub.status, 201, JSON.stringify(sub.json));
    const live = readSse(`${serve.url}/api/v1/runs/r1/events/stream`);
    assert.equal(await live.status, 200);
    await until("cell 1 to run", async () => ((await runOf(serve, "r1")).executions?.[0]?.phase === "started" && c.effect() === 1 ? true : undefined));
    const pause = await call(serve.url, "POST", "/api/v1/runs/r1/pause", { reason: "check" }, { "idempotency-key": "etcd-pause-1" });
    assert.equal(pause.status, 200, JSON.stringify(pause.json));
    assert.equal(pause.json.status, "applied");
    assert.equal((await runOf(serve, "r1")).status, "paused");
    await until("the stream to deliver the pause, live", () => live.events.some((e) => e.event === "message" && JSON.parse(e.data).kind === "run_paused"));
    c.release();
    await until("cell 1 to finish while paused", async () => ((await runOf(serve, "r1")).executions[0].phase === "finished" ? true : undefined));
    const unpause = await call(serve.url, "POST", "/api/v1/runs/r1/unpause", {});
    assert.equal(unpause.status, 200, JSON.stringify(unpause.json));
    await until("cell 2 to wait for approval", async () => ((await runOf(serve, "r1")).status === "awaiting_approval" ? true : undefined));
    assert.equal(existsSync(join(c.work, "touched")), false, "nothing ran before approval");
    const approve = await call(serve.url, "POST", "/api/v1/runs/r1/cells/2/approve", { reason: "ok" });
    assert.equal(approve.status, 200, JSON.stringify(approve.json));
    await until("r1 to end", async () => ((await runOf(serve, "r1")).status === "success" ? true : undefined));
    await live.done;
    const kinds = live.events.filter((e) => e.event === "message").map((e) => JSON.parse(e.data).kind as string);
    for (const k of ["run_paused", "run_unpaused", "approval_requested", "approval_decided", "run_ended"]) assert.ok(kinds.includes(k), `${k} in ${kinds.join(",")}`);
    assert.equal(live.events[live.events.length - 1]!.event, "end");
    assert.ok(existsSync(join(c.work, "touched")));
    serve.child.kill("SIGTERM");
    assert.equal((await serve.exited).code, 0);
  });

  it("a request pending when its serve is SIGKILLed is applied exactly once, by the standby that takes over", async (ctx) => {
    const c = scenario("kill", "api-kill");
    await pendingRequestSurvivesKill(c.flags, c.effect, (line) => ctx.diagnostic(line));
  });
});
