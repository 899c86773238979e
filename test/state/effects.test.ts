/**
 * The effect ledger's fold (src/state/effects.ts and the reducer): begins and ends, retries, the
 * answers a begin gets, what a cell's view, outcome and UnknownExecution list, snapshots (both decodes,
 * and a snapshot written before the ledger existed), and what a fork copies.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { decideBegin, forkLedger, MAX_CELL_EFFECTS, MAX_RUN_EFFECTS, type EffectRecord } from "../../src/state/effects.js";
import { identity, parseLogEvent, type LogEvent } from "../../src/state/events.js";
import { executionObservation, lostWorker, processFinished } from "../../src/state/outcomes.js";
import { Reducer, reduce } from "../../src/state/reducer.js";
import { State } from "../../src/state/schema.js";
import { encodeSnapshot, restoreSnapshot } from "../../src/state/snapshot.js";
import { cmd, LogBuilder, rev } from "./helpers.js";

const S = "s1";
const SEED = "0123456789abcdef0123456789abcdef";

/** A run whose cell 1 has started (and, with `finish`, ended with exit 0). */
function started(log = new LogBuilder(S)): LogBuilder {
  log.add("session_created", identity.session(S), { goal: "open a pull request", cwd: "/w", validators: [], budgets: {}, effect_seed: SEED });
  log.add("turn_prepared", identity.turn("s1:t1"), { turn: "s1:t1", n: 1, revision: 0, delivered: [] });
  const p1 = [rev(0), { op: "add", path: "/cells/-", value: cmd(1, ["python3", "pr.py"]) }];
  log.add("patch_accepted", identity.patch("s1:t1"), { turn: "s1:t1", attempt: 1, patch: p1, revision: 1, new_cell_ids: [1], removed_ids: [], consumed: [] });
  log.add("execution_queued", identity.queued(S, 1), { cell_id: 1, kind: "cmd" });
  log.add("execution_started", identity.execution(S, 1), { cell_id: 1, host: "h", boot_id: "b", pid: 40, pgid: 40, start_time: "9" });
  return log;
}

const begin = (log: LogBuilder, name: string, cell: number, attempt = 1) => log.add("effect_begun", identity.effectBegun(S, name, attempt), { name, cell_id: cell, attempt });
const end = (log: LogBuilder, name: string, cell: number, result: unknown) => log.add("effect_ended", identity.effectEnded(S, name), { name, cell_id: cell, result });
const finish = (log: LogBuilder, cell: number) =>
  log.add("execution_finished", identity.finished(S, cell), { cell_id: cell, result: "success", exit_code: 0, signal: null, duration_ms: 5, output_bytes: 0, dropped_bytes: 0, detail: null, unknown: null });

/** Cell 2, a new cell for the same work, queued and started after cell 1 ended. */
function secondCell(log: LogBuilder): void {
  log.add("turn_prepared", identity.turn("s1:t2"), { turn: "s1:t2", n: 2, revision: 1, delivered: [] });
  const p2 = [rev(1), { op: "add", path: "/cells/-", value: cmd(2, ["python3", "pr.py"]) }];
  log.add("patch_accepted", identity.patch("s1:t2"), { turn: "s1:t2", attempt: 1, patch: p2, revision: 2, new_cell_ids: [2], removed_ids: [], consumed: [] });
  log.add("execution_queued", identity.queued(S, 2), { cell_id: 2, kind: "cmd" });
  log.add("execution_started", identity.execution(S, 2), { cell_id: 2, host: "h", boot_id: "b", pid: 41, pgid: 41, start_time: "10" });
}

const session = (events: readonly LogEvent[]) => reduce(events).sessions.get(S)!;

describe("the effect ledger's fold", () => {
  test("every effect event of these logs is a valid event; names and results are checked", () => {
    const log = started();
    begin(log, "open-pr", 1);
    end(log, "open-pr", 1, { number: 42, url: "https://example.test/pr/42" });
    for (const e of log.events) parseLogEvent(e);
    const bad = (body: unknown) => assert.throws(() => parseLogEvent({ seq: 99, identity: "x", kind: "effect_begun", session: S, at: log.at, body }));
    bad({ name: "a b", cell_id: 1, attempt: 1 });
    bad({ name: "a:b", cell_id: 1, attempt: 1 });
    bad({ name: "", cell_id: 1, attempt: 1 });
    bad({ name: "a", cell_id: 1, attempt: 0 });
    bad({ name: "a", cell_id: 1, attempt: 1, session: "s2" });
    assert.throws(() => parseLogEvent({ seq: 99, identity: "x", kind: "session_created", session: S, at: log.at, body: { goal: "g", cwd: "/", validators: [], budgets: {}, effect_seed: "short" } }));
  });

  test("begin then end: the ledger holds the attempt and the result; the cell lists it begun, then done", () => {
    const log = started();
    begin(log, "open-pr", 1);
    let s = session(log.events);
    assert.equal(s.effect_seed, SEED);
    const r = s.effects.get("open-pr")!;
    assert.deepEqual(r.attempts.map((a) => [a.attempt, a.cell_id, a.seq]), [[1, 1, log.head]]);
    assert.equal(r.ended, null);
    assert.deepEqual(s.state.runtime.cells["1"]!.effects, [{ name: "open-pr", status: "begun" }]);
    State.parse(s.state);
    end(log, "open-pr", 1, { number: 42 });
    s = session(log.events);
    assert.deepEqual(s.effects.get("open-pr")!.ended, { cell_id: 1, seq: log.head, at: log.at, result: { number: 42 } });
    assert.deepEqual(s.state.runtime.cells["1"]!.effects, [{ name: "open-pr", status: "done", result: { number: 42 } }]);
    State.parse(s.state);
  });

  test("a begin never ended shows uncertain once its cell finished; in the outcome and in an UnknownExecution it is the one to reconcile", () => {
    const log = started();
    begin(log, "open-pr", 1);
    end(log, "open-pr", 1, "pr-1");
    begin(log, "send-mail", 1);
    const before = session(log.events);
    const ex = before.executions.get(1)!;
    // What the model is told when the worker was lost: only send-mail needs checking outside.
    const lost = lostWorker(ex, { worker_stopped: true, detail: "stopped" });
    assert.deepEqual(lost.unknown!.uncertain_effects, ["send-mail"]);
    assert.deepEqual(lost.unknown!.done_effects, ["open-pr"]);
    const cancelled = processFinished(before, 1, { result: "cancelled", exit_code: null, signal: "SIGTERM", duration_ms: 1, output_bytes: 0, dropped_bytes: 0, detail: null }, true);
    assert.deepEqual(cancelled.unknown!.uncertain_effects, ["send-mail"]);
    // A cell that declared no effect says nothing about effects (it may have made some).
    const none = started();
    assert.equal(lostWorker(session(none.events).executions.get(1)!, { worker_stopped: true, detail: "" }).unknown!.uncertain_effects, undefined);
    // Its outcome, and its view once finished.
    const obs = executionObservation({ cell_id: 1, result: "success", exit_code: 0, signal: null, duration_ms: 1, output_bytes: 0, dropped_bytes: 0, detail: null, unknown: null }, log.at, ex);
    assert.deepEqual((obs.payload as { effects: unknown }).effects, [{ name: "open-pr", status: "done", result: "pr-1" }, { name: "send-mail", status: "uncertain" }]);
    finish(log, 1);
    const s = session(log.events);
    assert.deepEqual(s.state.runtime.cells["1"]!.effects, [{ name: "open-pr", status: "done", result: "pr-1" }, { name: "send-mail", status: "uncertain" }]);
    assert.equal(lost.unknown!.evidence_refs.length, 1, "evidence_refs still cite the launch");
  });

  test("a later cell of the run: done answers with the result; uncertain until retried; a retry is attempt 2, and its end turns both cells' listings done", () => {
    const log = started();
    begin(log, "open-pr", 1);
    end(log, "open-pr", 1, { number: 42 });
    begin(log, "send-mail", 1);
    finish(log, 1);
    secondCell(log);
    let s = session(log.events);
    const done = decideBegin(s.effects, "open-pr", false);
    assert.equal(done.answer, "done");
    assert.deepEqual((done as { record: EffectRecord }).record.ended!.result, { number: 42 });
    assert.equal(decideBegin(s.effects, "open-pr", true).answer, "done", "a retry never proceeds past done");
    assert.equal(decideBegin(s.effects, "send-mail", false).answer, "uncertain");
    assert.deepEqual(decideBegin(s.effects, "send-mail", true), { answer: "proceed", attempt: 2 });
    assert.deepEqual(decideBegin(s.effects, "new-one", false), { answer: "proceed", attempt: 1 });
    begin(log, "send-mail", 2, 2);
    s = session(log.events);
    assert.deepEqual(s.state.runtime.cells["2"]!.effects, [{ name: "send-mail", status: "begun" }]);
    assert.deepEqual(s.state.runtime.cells["1"]!.effects!.map((e) => e.status), ["done", "uncertain"]);
    end(log, "send-mail", 2, "mail-9");
    s = session(log.events);
    assert.deepEqual(s.effects.get("send-mail")!.attempts.map((a) => [a.attempt, a.cell_id]), [[1, 1], [2, 2]]);
    assert.deepEqual(s.state.runtime.cells["1"]!.effects, [{ name: "open-pr", status: "done", result: { number: 42 } }, { name: "send-mail", status: "done", result: "mail-9" }]);
    assert.deepEqual(s.state.runtime.cells["2"]!.effects, [{ name: "send-mail", status: "done", result: "mail-9" }]);
  });

  test("an uncertain effect a later cell found done outside is ended by it: listed done under both", () => {
    const log = started();
    begin(log, "deploy", 1);
    finish(log, 1);
    secondCell(log);
    end(log, "deploy", 2, { found: true });
    const s = session(log.events);
    assert.deepEqual(s.state.runtime.cells["1"]!.effects, [{ name: "deploy", status: "done", result: { found: true } }]);
    assert.deepEqual(s.state.runtime.cells["2"]!.effects, [{ name: "deploy", status: "done", result: { found: true } }]);
  });

  test("the same begin or end twice is refused by identity; the fold of a log it cannot come from keeps done final", () => {
    const log = started();
    begin(log, "x", 1);
    const dup = { ...log.events.at(-1)!, seq: log.head + 1 };
    assert.throws(() => new Reducer().apply([...log.events, dup]), /appears twice/);
    end(log, "x", 1, 1);
    // A begin after the end (the harness never commits one) does not reopen it.
    begin(log, "x", 1, 2);
    const s = session(log.events);
    assert.deepEqual(s.effects.get("x")!.ended!.result, 1);
    assert.equal(decideBegin(s.effects, "x", true).answer, "done");
    assert.deepEqual(s.state.runtime.cells["1"]!.effects, [{ name: "x", status: "done", result: 1 }]);
  });

  test("a cell lists at most MAX_CELL_EFFECTS effects and counts the rest; the run's ledger is bounded", () => {
    const log = started();
    for (let i = 0; i < MAX_CELL_EFFECTS + 3; i++) begin(log, `e${i}`, 1);
    const s = session(log.events);
    assert.equal(s.effects.size, MAX_CELL_EFFECTS + 3, "the ledger keeps every name");
    assert.equal(s.state.runtime.cells["1"]!.effects!.length, MAX_CELL_EFFECTS);
    assert.equal(s.state.runtime.cells["1"]!.effects_omitted, 3);
    State.parse(s.state);
    const full = new Map<string, EffectRecord>(Array.from({ length: MAX_RUN_EFFECTS }, (_, i) => [`n${i}`, { name: `n${i}`, attempts: [], ended: null }]));
    assert.equal(decideBegin(full, "one-more", false).answer, "refused");
    assert.equal(decideBegin(full, "n3", false).answer, "uncertain", "names already held are still answered");
  });

  test("snapshots carry the ledger: restored at every cut (full and structure decode) plus the tail folds to the whole fold", () => {
    const log = started();
    begin(log, "open-pr", 1);
    end(log, "open-pr", 1, { number: 42, labels: ["a", "b"] });
    begin(log, "send-mail", 1);
    finish(log, 1);
    secondCell(log);
    begin(log, "send-mail", 2, 2);
    end(log, "send-mail", 2, null);
    const whole = reduce(log.events);
    for (let cut = 1; cut <= log.events.length; cut++) {
      const text = encodeSnapshot(reduce(log.events.slice(0, cut)));
      for (const validate of ["full", "structure"] as const) {
        const r = restoreSnapshot(text, cut, { validate });
        r.apply(log.events.slice(cut));
        assert.deepEqual(r.projection(), whole, `snapshot at ${cut} (${validate}) + tail`);
      }
    }
  });

  test("a snapshot written before the ledger existed restores with an empty ledger and unlisted cells", () => {
    const log = started();
    const doc = JSON.parse(encodeSnapshot(reduce(log.events))) as { sessions: Record<string, unknown>[] };
    for (const s of doc.sessions) {
      delete s.effects;
      delete s.effect_seed;
      for (const [, ex] of s.executions as [number, Record<string, unknown>][]) {
        delete ex.effects;
        delete ex.effects_omitted;
      }
    }
    for (const validate of ["full", "structure"] as const) {
      const r = restoreSnapshot(JSON.stringify(doc), log.head, { validate });
      const s = r.session(S)!;
      assert.equal(s.effects.size, 0);
      assert.equal(s.effect_seed, null);
      assert.deepEqual(s.executions.get(1)!.effects, []);
      // The tail folds onto it as onto a fresh fold.
      r.apply([{ seq: log.head + 1, identity: identity.effectBegun(S, "late", 1), kind: "effect_begun", session: S, at: log.at, body: { name: "late", cell_id: 1, attempt: 1 } }]);
      assert.deepEqual(r.session(S)!.state.runtime.cells["1"]!.effects, [{ name: "late", status: "begun" }]);
    }
  });

  test("a fork copies the ledger as it was at the fork point, with the parent's seed", () => {
    const log = started();
    begin(log, "a", 1);
    end(log, "a", 1, "A");
    begin(log, "b", 1);
    const forkAt = log.head;
    end(log, "b", 1, "B");
    begin(log, "c", 1);
    const parent = session(log.events);
    const ledger = forkLedger(parent, forkAt);
    assert.deepEqual([...ledger.keys()], ["a", "b"]);
    assert.equal(ledger.get("a")!.ended!.result, "A");
    assert.equal(ledger.get("b")!.ended, null, "b ended after the fork point: uncertain in the fork");
    assert.equal(decideBegin(ledger, "b", false).answer, "uncertain");
    assert.equal(decideBegin(ledger, "c", false).answer, "proceed");
    assert.deepEqual(forkLedger(parent, log.head), parent.effects);
  });
});
