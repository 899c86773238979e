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
import { sleep, until } from "../support/wait.js";
import { startDevCluster, type DevCluster } from "../../src/cli/devcluster/index.js";
import { call, cmdRound, concludeRound, GATED, killAll, readSse, startServe, writeModel, type Serve } from "./api-support.js";

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

const runOf = async (s: Serve, id: string) => (await call(s.url, "GET", `/api/v1/runs/${id}`)).json.run;

/** Every event of run `id`, through the events route (all pages). */
async function eventsOf(s: Serve, id: string): Promise<{ seq: number; kind: string; body: Record<string, unknown> }[]> {
  const out: { seq: number; kind: string; body: Record<string, unknown> }[] = [];
  for (let after = 0; ; ) {
    const r = await call(s.url, "GET", `/api/v1/runs/${id}/events?after=${after}&limit=5000`);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    out.push(...r.json.events);
    if (r.json.next_after === after) return out;
    after = r.json.next_after;
  }
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
    // A kills itself right after it commits a steer request: the API client's request is pending then.
    const a = await startServe(c.flags("a", ["--create", "--lease", "2s"]), { CAIRN_CHAOS_KILL_AT: "steer:committed" });
    const b = await startServe(c.flags("b", ["--lease", "2s"]), {}, false);
    await until("b to wait in standby", () => /standby/.test(b.stderr()));
    const sub = await call(a.url, "POST", "/api/v1/runs", { goal: "stay running", session: "k1" });
    assert.equal(sub.status, 201, JSON.stringify(sub.json));
    await until("cell 1 to run", async () => ((await runOf(a, "k1")).executions?.[0]?.phase === "started" && c.effect() === 1 ? true : undefined));

    // 1. The owner dies with the request pending: the client sees no answer.
    const pending = await call(a.url, "POST", "/api/v1/runs/k1/pause", { reason: "hold" }, { "idempotency-key": "kill-pause-1" }).then(
      (r) => ({ answered: r.status }),
      (err: Error) => ({ dropped: err.message }),
    );
    assert.ok("dropped" in pending, `the owner died before answering: ${JSON.stringify(pending)}`);
    assert.equal((await a.exited).signal, "SIGKILL");
    await until("the standby to take over", async () => ((await fetch(`${b.url}/readyz`)).status === 200 ? true : undefined), 180_000);
    // The client retries the same request on the new owner: applied before, not again.
    const retry = await call(b.url, "POST", "/api/v1/runs/k1/pause", { reason: "hold" }, { "idempotency-key": "kill-pause-1" });
    assert.equal(retry.status, 200, JSON.stringify(retry.json));
    assert.equal(retry.json.status, "applied");
    assert.match(retry.json.message, /applied before/);
    assert.equal((await runOf(b, "k1")).status, "paused", "the pause holds across the failover");
    let log = await eventsOf(b, "k1");
    assert.equal(log.filter((e) => e.kind === "run_paused" && e.body.request === "kill-pause-1").length, 1, "the pause is in the log once");

    // 2. A request sent to a standby while the owner is frozen, then the owner SIGKILLed: it waits in
    // the mailbox; the standby takes over and applies it once.
    const d = await startServe(c.flags("d", ["--lease", "2s"]), {}, false);
    await until("d to wait in standby", () => /standby/.test(d.stderr()));
    b.child.kill("SIGSTOP");
    const answer = call(d.url, "POST", "/api/v1/runs/k1/unpause", { reason: "go on" }, { "idempotency-key": "kill-unpause-1" });
    // Either order of post and kill is correct (posted to a frozen owner, or to none): give it a moment.
    await sleep(500);
    b.child.kill("SIGKILL");
    assert.equal((await b.exited).signal, "SIGKILL");
    const got = await answer;
    ctx.diagnostic(`the pending unpause answered ${got.status} ${JSON.stringify(got.json)}`);
    assert.ok(got.status === 200 || got.status === 202, JSON.stringify(got.json));
    assert.ok(got.status === 200 ? got.json.status === "applied" : ["unconfirmed", "waiting"].includes(got.json.status), `an honest answer: ${JSON.stringify(got.json)}`);
    await until("the standby to take over and apply the unpause", async () => ((await runOf(d, "k1")).paused === null ? true : undefined), 180_000);
    log = await eventsOf(d, "k1");
    assert.equal(log.filter((e) => e.kind === "run_unpaused" && e.body.request === "kill-unpause-1").length, 1, "the unpause is in the log once");
    const again = await call(d.url, "POST", "/api/v1/runs/k1/unpause", { reason: "go on" }, { "idempotency-key": "kill-unpause-1" });
    assert.equal(again.status, 200);
    assert.match(again.json.message, /applied before/);
    assert.equal((await eventsOf(d, "k1")).filter((e) => e.kind === "run_unpaused").length, 1, "the retry added nothing");
    d.child.kill("SIGTERM");
    assert.equal((await d.exited).code, 0);
  });
});
