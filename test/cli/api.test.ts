/**
 * The HTTP API of `cairn serve` on sqlite, driven with fetch against a real serve process (a
 * scripted model, cells in the sandbox): submit, status, events by page, the live event stream and
 * its resumption, observations, pause / unpause / cancel, approve / deny under a run's
 * --require-approval rule, and every refusal (401, 404, 405, 400, 409, 413, 415) as a JSON sentence
 * that changes nothing. /metrics, /healthz, /readyz and the --ui page keep working beside it. And
 * requests pending when their serve is SIGKILLed, applied once by the standby that takes over.
 */
import { after, before, describe, it } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tempDir } from "../harness/support.js";
import { until } from "../support/wait.js";
import { call, cmdRound, concludeRound, GATED, killAll, pendingRequestSurvivesKill, readSse, startServe, TOKEN, writeModel, type Serve } from "./api-support.js";

const t = tempDir("cairn-api-");
const data = join(t.dir, "data");
const work = join(t.dir, "work");
mkdirSync(work, { recursive: true });
const model = writeModel(join(t.dir, "model.json"), [cmdRound(0, 1, GATED), cmdRound(1, 2, ["touch", "touched"]), concludeRound(2, 3, "done")]);
let serve: Serve;

before(async () => {
  serve = await startServe(["--db", "api", "--create", "--data-dir", data, "--cwd", work, "--model", `scripted:${model}`]);
});
after(async () => {
  killAll();
  t.cleanup();
});

const api = (method: string, path: string, body?: unknown, headers?: Record<string, string>) => call(serve.url, method, `/api/v1${path}`, body, headers);
const run = async (id: string) => (await api("GET", `/runs/${id}`)).json.run;
const release = (on: boolean) => (on ? writeFileSync(join(work, "release"), "") : rmSync(join(work, "release"), { force: true }));
const effect = () => (existsSync(join(work, "effect.txt")) ? readFileSync(join(work, "effect.txt"), "utf8").split("\n").filter(Boolean).length : 0);

/** The run's events, every page, through GET .../events. */
async function allEvents(id: string, limit: number): Promise<{ seq: number; kind: string }[]> {
  const out: { seq: number; kind: string }[] = [];
  let after = 0;
  for (;;) {
    const r = await api("GET", `/runs/${id}/events?after=${after}&limit=${limit}`);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    out.push(...r.json.events);
    if (r.json.next_after === after) return out;
    assert.ok(r.json.events.length <= limit);
    after = r.json.next_after;
  }
}

describe("the HTTP API of cairn serve (sqlite)", () => {
  it("refuses bad requests with a JSON sentence (401, 404, 405, 400, 413, 415) and keeps /metrics, /healthz, /readyz", async () => {
    const anon = await fetch(`${serve.url}/api/v1/runs`);
    assert.equal(anon.status, 401);
    assert.match(((await anon.json()) as { error: { message: string } }).error.message, /token is required/);
    const wrong = await call(serve.url, "GET", "/api/v1/runs", undefined, { authorization: "Bearer not-the-token-at-all" });
    assert.equal(wrong.status, 401);
    assert.equal(wrong.json.error.code, "token_required");

    const unknownRoute = await api("GET", "/nope");
    assert.equal(unknownRoute.status, 404);
    assert.match(unknownRoute.json.error.message, /POST \/api\/v1\/runs, GET \/api\/v1\/runs, GET \/api\/v1\/runs\/\{id\}/);
    const method = await api("DELETE", "/runs");
    assert.equal(method.status, 405);
    assert.equal(method.headers.get("allow"), "POST, GET");
    const badJson = await api("POST", "/runs", "{goal:");
    assert.equal(badJson.status, 400);
    assert.equal(badJson.json.error.code, "bad_json");
    const unknownField = await api("POST", "/runs", { goal: "x", colour: "red" });
    assert.equal(unknownField.status, 400);
    assert.match(unknownField.json.error.message, /unknown field "colour" in the body; this route takes goal, session, id/);
    const emptyGoal = await api("POST", "/runs", { goal: " " });
    assert.equal(emptyGoal.status, 400);
    const badSession = await api("POST", "/runs", { goal: "x", session: "s7" });
    assert.equal(badSession.status, 400);
    assert.match(badSession.json.error.message, /reserves/);
    const badRule = await api("POST", "/runs", { goal: "x", require_approval: ["sometimes"] });
    assert.equal(badRule.status, 400);
    const notJson = await api("POST", "/runs", "goal=x", { "content-type": "text/plain" });
    assert.equal(notJson.status, 415);
    const huge = await api("POST", "/runs", { goal: "x".repeat(300 * 1024) });
    assert.equal(huge.status, 413);
    const unknownRun = await api("GET", "/runs/ghost");
    assert.equal(unknownRun.status, 404);
    assert.equal(unknownRun.json.error.code, "unknown_run");
    for (const path of ["/runs/ghost/pause", "/runs/ghost/events", "/runs/ghost/cells/1/approve"]) {
      const r = await api(path.endsWith("events") ? "GET" : "POST", path);
      assert.equal(r.status, 404, path);
    }
    const badAfter = await api("GET", "/runs/ghost/events?after=-1");
    assert.equal(badAfter.status, 400);
    // Nothing above created a run.
    const list = await api("GET", "/runs");
    assert.deepEqual([list.json.runs, list.json.pending_starts], [[], []]);

    assert.equal((await fetch(`${serve.url}/healthz`)).status, 200);
    assert.equal((await fetch(`${serve.url}/readyz`)).status, 200);
    assert.equal((await fetch(`${serve.url}/metrics`)).status, 401, "the token guards /metrics as before");
    const metrics = await fetch(`${serve.url}/metrics`, { headers: { authorization: `Bearer ${TOKEN}` } });
    assert.equal(metrics.status, 200);
    assert.match(await metrics.text(), /cairn_owner/);
    const page = await fetch(`${serve.url}/api/timeline?db=api`, { headers: { authorization: `Bearer ${TOKEN}` } });
    assert.equal(page.status, 404, "without --ui the page's paths say where the page is");
  });

  it("submit, status, events by page, the live stream, an observation, pause and unpause, retries that change nothing", async () => {
    release(false);
    const sub = await api("POST", "/runs", { goal: "append a line", session: "alpha", budgets: { max_rounds: 10 } });
    assert.equal(sub.status, 201, JSON.stringify(sub.json));
    assert.equal(sub.json.run, "alpha");
    assert.equal(sub.headers.get("location"), "/api/v1/runs/alpha");
    const again = await api("POST", "/runs", { goal: "append a line", session: "alpha", budgets: { max_rounds: 10 } });
    assert.equal(again.status, 200);
    assert.match(again.json.status, /^(exists|pending)$/);
    const other = await api("POST", "/runs", { goal: "something else", session: "alpha" });
    assert.equal(other.status, 409);
    assert.match(other.json.error.message, /another goal or settings.*choose another run id/);

    const live = readSse(`${serve.url}/api/v1/runs/alpha/events/stream`);
    assert.equal(await live.status, 200);
    await until("cell 1 to run", async () => ((await run("alpha")).executions?.[0]?.phase === "started" && effect() === 1 ? true : undefined));

    const pause = await api("POST", "/runs/alpha/pause", { reason: "look first" }, { "idempotency-key": "pause-alpha-1" });
    assert.equal(pause.status, 200, JSON.stringify(pause.json));
    assert.deepEqual(pause.json, { status: "applied", message: "pause of run alpha: done", request: "pause-alpha-1" });
    const paused = await run("alpha");
    assert.equal(paused.status, "paused");
    assert.equal(paused.paused.reason, "look first");
    await until("the open stream to deliver the pause, live", () => live.events.some((e) => JSON.parse(e.data).kind === "run_paused"));
    const retry = await api("POST", "/runs/alpha/pause", { reason: "look first" }, { "idempotency-key": "pause-alpha-1" });
    assert.equal(retry.status, 200);
    assert.equal(retry.json.status, "applied");
    assert.match(retry.json.message, /was applied before/);
    const reused = await api("POST", "/runs/alpha/cancel", {}, { "idempotency-key": "pause-alpha-1" });
    assert.equal(reused.status, 409, "an id used for a pause is not a cancel");
    assert.equal((await run("alpha")).status, "paused", "the refused cancel changed nothing");
    const mismatch = await api("POST", "/runs/alpha/unpause", { id: "a" }, { "idempotency-key": "b" });
    assert.equal(mismatch.status, 400);

    const obs = await api("POST", "/runs/alpha/observations", { id: "ci-1", kind: "ci_result", payload: { ok: true } });
    assert.equal(obs.status, 202, JSON.stringify(obs.json));
    const obsRetry = await api("POST", "/runs/alpha/observations", { kind: "ci_result", payload: { ok: true } }, { "idempotency-key": "ci-1" });
    assert.ok(obsRetry.status === 200 || obsRetry.status === 202, JSON.stringify(obsRetry.json));
    await until("the observation to be delivered", async () => ((await run("alpha")).inbox.delivered + (await run("alpha")).inbox.unread >= 1 ? true : undefined));
    const obsOther = await api("POST", "/runs/alpha/observations", { id: "ci-1", kind: "ci_result", payload: { ok: false } });
    assert.equal(obsOther.status, 409);
    const obsNoId = await api("POST", "/runs/alpha/observations", { kind: "ci_result", payload: 1 });
    assert.equal(obsNoId.status, 400);
    const obsHuge = await api("POST", "/runs/alpha/observations", { id: "big", kind: "blob", payload: "x".repeat(70 * 1024) });
    assert.equal(obsHuge.status, 413);
    assert.match(obsHuge.json.error.message, /post a reference/);
    const limitZero = await api("GET", "/runs/alpha/events?limit=0");
    assert.equal(limitZero.status, 400);
    const obsReserved = await api("POST", "/runs/alpha/observations", { id: "x", kind: "cairn.start", payload: 1 });
    assert.equal(obsReserved.status, 400);

    // The running cell finishes while the run is paused; the model reads its end and the observation
    // in one round once unpaused (a paused run asks it nothing).
    release(true);
    await until("cell 1 to finish", async () => ((await run("alpha")).executions[0].phase === "finished" ? true : undefined));
    assert.equal((await run("alpha")).rounds, 1, "no round while paused");
    const unpause = await api("POST", "/runs/alpha/unpause", {});
    assert.equal(unpause.status, 200, JSON.stringify(unpause.json));
    await until("the run to end", async () => ((await run("alpha")).status === "success" ? true : undefined)).catch(async (err: Error) => {
      throw new Error(`${err.message}: ${JSON.stringify(await run("alpha"))}`);
    });
    await live.done;

    // The stream saw the run from its first event to its end, live, in order, then said "end".
    const data = live.events.filter((e) => e.event === "message").map((e) => JSON.parse(e.data) as { seq: number; kind: string; session: string });
    assert.deepEqual(live.events.map((e) => e.event).slice(-1), ["end"]);
    assert.ok(data.every((e, i) => e.session === "alpha" && String(e.seq) === live.events[i]!.id && (i === 0 || e.seq > data[i - 1]!.seq)));
    const kinds = data.map((e) => e.kind);
    for (const k of ["session_created", "run_paused", "run_unpaused", "inbox_received", "run_ended"]) assert.ok(kinds.includes(k), `${k} in ${kinds.join(",")}`);

    // Pages of the events endpoint are the same events, in the same order.
    const paged = await allEvents("alpha", 3);
    assert.deepEqual(paged.map((e) => e.seq), data.map((e) => e.seq));
    const last = await api("GET", `/runs/alpha/events?after=0&limit=5000`);
    assert.equal(last.json.ended, true);

    // Resuming with Last-Event-ID starts after that event and ends with the run's end.
    const middle = data[Math.floor(data.length / 2)]!.seq;
    const resumed = readSse(`${serve.url}/api/v1/runs/alpha/events/stream`, { "last-event-id": String(middle) });
    await resumed.done;
    assert.deepEqual(
      resumed.events.filter((e) => e.event === "message").map((e) => Number(e.id)),
      data.filter((e) => e.seq > middle).map((e) => e.seq),
    );
    const badLast = readSse(`${serve.url}/api/v1/runs/alpha/events/stream`, { "last-event-id": "abc" });
    assert.equal(await badLast.status, 400);
    await badLast.done;

    // A request to an ended run is refused with the reason, and a submit keyed by Idempotency-Key is one run.
    const late = await api("POST", "/runs/alpha/pause", {});
    assert.equal(late.status, 409);
    assert.match(late.json.message, /has ended \(success\)/);
    assert.deepEqual(late.json.error, { code: "refused", message: late.json.message });
    const k1 = await api("POST", "/runs", { goal: "keyed" }, { "idempotency-key": "submit-key-1" });
    const k2 = await api("POST", "/runs", { goal: "keyed" }, { "idempotency-key": "submit-key-1" });
    assert.equal(k1.status, 201);
    assert.equal(k2.status, 200);
    assert.equal(k1.json.run, k2.json.run);
    const cancelKeyed = await api("POST", `/runs/${k1.json.run}/cancel`, { reason: "not needed" });
    assert.equal(cancelKeyed.status, 200, JSON.stringify(cancelKeyed.json));
  });

  it("approve and deny a cell waiting under the run's rule; cancel a running run; nothing runs before approval", async () => {
    release(true);
    const beta = await api("POST", "/runs", { goal: "touch with approval", session: "beta", require_approval: ["argv:touch"] });
    assert.equal(beta.status, 201, JSON.stringify(beta.json));
    const waiting = await until("cell 2 to wait for approval", async () => {
      const r = await run("beta");
      return r.status === "awaiting_approval" ? r : undefined;
    });
    assert.deepEqual(waiting.awaiting_approval.map((a: { cell_id: number; rule: string }) => [a.cell_id, a.rule]), [[2, "argv:touch"]]);
    assert.equal(waiting.executions.find((e: { cell_id: number }) => e.cell_id === 2).phase, "queued");
    const wrongCell = await api("POST", "/runs/beta/cells/9/approve", {});
    assert.equal(wrongCell.status, 409);
    assert.match(wrongCell.json.message, /cell 9 of run beta has no execution/);
    const badCell = await api("POST", "/runs/beta/cells/x/approve", {});
    assert.equal(badCell.status, 400);
    const approve = await api("POST", "/runs/beta/cells/2/approve", { reason: "fine" });
    assert.equal(approve.status, 200, JSON.stringify(approve.json));
    await until("beta to end", async () => ((await run("beta")).status === "success" ? true : undefined));
    const events = await allEvents("beta", 1000);
    const decided = events.find((e) => e.kind === "approval_decided")!;
    const started2 = events.filter((e) => e.kind === "execution_started" && (e as unknown as { body: { cell_id: number } }).body.cell_id === 2);
    assert.equal(started2.length, 1);
    assert.ok(started2[0]!.seq > decided.seq, "cell 2 started only after the approval");

    const gamma = await api("POST", "/runs", { goal: "touch, denied", session: "gamma", require_approval: ["argv:touch"] });
    assert.equal(gamma.status, 201);
    await until("gamma's cell 2 to wait", async () => ((await run("gamma")).status === "awaiting_approval" ? true : undefined));
    const noReason = await api("POST", "/runs/gamma/cells/2/deny", {});
    assert.equal(noReason.status, 400);
    assert.match(noReason.json.error.message, /"reason" is required/);
    const deny = await api("POST", "/runs/gamma/cells/2/deny", { reason: "not on this machine" });
    assert.equal(deny.status, 200, JSON.stringify(deny.json));
    const denied = await run("gamma");
    const ex2 = denied.executions.find((e: { cell_id: number }) => e.cell_id === 2);
    assert.equal(ex2.approval.state, "denied");
    assert.equal(ex2.pid, null, "a denied cell never started");

    release(false);
    const delta = await api("POST", "/runs", { goal: "to be cancelled", session: "delta" });
    assert.equal(delta.status, 201);
    await until("delta's cell to run", async () => ((await run("delta")).executions?.[0]?.phase === "started" ? true : undefined));
    const cancel = await api("POST", "/runs/delta/cancel", { reason: "wrong goal" });
    assert.equal(cancel.status, 200, JSON.stringify(cancel.json));
    const cancelled = await until("delta to end cancelled", async () => {
      const r = await run("delta");
      return r.status === "cancelled" ? r : undefined;
    });
    assert.equal(cancelled.executions[0].result, "cancelled");
    const again = await api("POST", "/runs/delta/cancel", {});
    assert.equal(again.status, 200);
    assert.equal(again.json.status, "already");
  });

  it("forks a run after a round: the fork holds the origin's cells as they ran, a retry is the same fork, bad forks are refused in a sentence", async () => {
    const before = effect();
    const fork = await api("POST", "/runs/beta/fork", { at_round: 1, new_session: "beta-again", reason: "try again" }, { "idempotency-key": "fork-beta-1" });
    assert.equal(fork.status, 200, JSON.stringify(fork.json));
    assert.equal(fork.json.status, "applied");
    assert.equal(fork.json.session, "beta-again");
    const f = await until("the fork to be listed with its origin", async () => {
      const r = await run("beta-again");
      return r?.fork_of ? r : undefined;
    });
    assert.deepEqual(f.fork_of, { session: "beta", round: 1 });
    const events = await allEvents("beta-again", 1000);
    assert.ok(events.some((e) => e.kind === "fork_completed"), "the copy is complete");
    assert.equal(events.filter((e) => e.kind === "execution_started").length, 1, "cell 1 is copied as it ran in beta");
    assert.equal(effect(), before, "the fork re-runs nothing of its origin");

    const retry = await api("POST", "/runs/beta/fork", { at_round: 1, new_session: "beta-again", reason: "try again" }, { "idempotency-key": "fork-beta-1" });
    assert.equal(retry.status, 200, JSON.stringify(retry.json));
    assert.equal(retry.json.status, "already");
    const beyond = await api("POST", "/runs/beta/fork", { at_round: 99 });
    assert.equal(beyond.status, 409);
    assert.match(beyond.json.error.message, /the round to fork after must be between 0 and \d+/);
    const taken = await api("POST", "/runs/beta/fork", { at_round: 0, new_session: "gamma" });
    assert.equal(taken.status, 409);
    assert.match(taken.json.message, /run gamma already exists/);
    const missing = await api("POST", "/runs/beta/fork", { new_session: "x1" });
    assert.equal(missing.status, 400);
    assert.match(missing.json.error.message, /at_round/);
    const unknown = await api("POST", "/runs/nope/fork", { at_round: 0 });
    assert.equal(unknown.status, 404);
  });
});

describe("a serve without a token", () => {
  it("keeps its API closed (401 saying how to set a token), and /metrics and the --ui page as they were", async () => {
    const open = await startServe(["--db", "api", "--data-dir", data, "--cwd", work, "--model", `scripted:${model}`, "--ui", "--takeover"], { CAIRN_UI_TOKEN: "" });
    const r = await fetch(`${open.url}/api/v1/runs`);
    assert.equal(r.status, 401);
    assert.match(((await r.json()) as { error: { message: string } }).error.message, /started without a token, so its API is closed/);
    assert.equal((await fetch(`${open.url}/metrics`)).status, 200);
    assert.equal((await fetch(`${open.url}/`)).status, 200);
    const timeline = await fetch(`${open.url}/api/timeline?db=api`);
    assert.equal(timeline.status, 200);
    open.child.kill("SIGTERM");
    assert.equal((await open.exited).code, 0);
  });
});

describe("an API request pending when its serve is SIGKILLed (sqlite: the standby on the same machine)", () => {
  it("is applied exactly once, by the standby that takes over, and its retry says so", async (ctx) => {
    const dir = join(t.dir, "kill");
    const killWork = join(dir, "work");
    mkdirSync(killWork, { recursive: true });
    const killModel = writeModel(join(dir, "model.json"), [cmdRound(0, 1, GATED), concludeRound(1, 2, "done")]);
    // sqlite: every serve of the database on this machine shares its data dir.
    const flags = (_role: string, extra: string[] = []) => ["--db", "api-kill", "--data-dir", join(dir, "data"), "--cwd", killWork, "--model", `scripted:${killModel}`, ...extra];
    const effectFile = join(killWork, "effect.txt");
    await pendingRequestSurvivesKill(flags, () => (existsSync(effectFile) ? readFileSync(effectFile, "utf8").split("\n").filter(Boolean).length : 0), (line) => ctx.diagnostic(line));
  });
});
