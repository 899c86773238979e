import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { admit } from "../../src/state/admission.js";
import { identity, observationId, parseLogEvent } from "../../src/state/events.js";
import { LogCorrupt, RECENT_IDENTITIES, Reducer, reduce } from "../../src/state/reducer.js";
import { State } from "../../src/state/schema.js";
import { cmd, LogBuilder, note, observation, rev } from "./helpers.js";

const S = "s1";

/** A hand-written two-round run: a command runs, a timer fires, the model concludes. */
function handWrittenLog(): LogBuilder {
  const log = new LogBuilder(S);
  log.add("session_created", identity.session(S), { goal: "make tests pass", cwd: "/tmp/w", validators: [["python3", "-m", "unittest"]], budgets: { max_rounds: 10 } });
  log.add("inbox_received", identity.inbox(S, "hello"), { observation: observation("hello") });
  log.add("turn_prepared", identity.turn("s1:t1"), { turn: "s1:t1", n: 1, revision: 0, delivered: ["hello"] });
  log.add("model_attempt", identity.attempt("s1:t1", 1), { turn: "s1:t1", attempt: 1 });
  const p1 = [rev(0), { op: "add", path: "/cells/-", value: cmd(1, ["pytest", "-q"]) }, { op: "add", path: "/cells/-", value: note(2, "running the tests") }];
  log.add("model_response", identity.response("s1:t1", 1), { turn: "s1:t1", attempt: 1, patch: p1, usage: { input_tokens: 100, output_tokens: 20 } });
  log.add("patch_accepted", identity.patch("s1:t1"), { turn: "s1:t1", attempt: 1, patch: p1, revision: 1, new_cell_ids: [1, 2], removed_ids: [], consumed: ["hello"] });
  log.add("execution_queued", identity.queued(S, 1), { cell_id: 1, kind: "cmd" });
  log.add("execution_started", identity.execution(S, 1), { cell_id: 1, host: "h", boot_id: "b", pid: 4242, pgid: 4242, start_time: "123" });
  log.add("execution_output", identity.output(S, 1, 0), { cell_id: 1, n: 0, stream: "stdout", data: "1 passed\n" });
  log.add("execution_finished", identity.finished(S, 1), { cell_id: 1, result: "success", exit_code: 0, signal: null, duration_ms: 12, output_bytes: 9, dropped_bytes: 0, detail: null, unknown: null });
  log.add("inbox_received", identity.inbox(S, observationId.execution(1)), { observation: { id: "execution:1", source: "execution", kind: "finished", at: log.at, payload: { cell_id: 1 } } });
  log.add("timer_registered", identity.timer(S, "t-a"), { timer_id: "t-a", cell_id: 1, due_at: "2026-01-01T00:01:00.000Z", note: "check again" });
  log.add("timer_fired", identity.timerFired(S, "t-a"), { timer_id: "t-a", due_at: "2026-01-01T00:01:00.000Z", late_ms: 5 });
  log.add("turn_prepared", identity.turn("s1:t2"), { turn: "s1:t2", n: 2, revision: 1, delivered: ["execution:1"] });
  log.add("model_attempt", identity.attempt("s1:t2", 1), { turn: "s1:t2", attempt: 1 });
  log.add("model_attempt_failed", identity.attemptFailed("s1:t2", 1), { turn: "s1:t2", attempt: 1, error: "timeout", retryable: true, usage: null });
  log.add("model_attempt", identity.attempt("s1:t2", 2), { turn: "s1:t2", attempt: 2 });
  const p2 = [rev(1), { op: "remove", path: "/cells/1" }, { op: "add", path: "/cells/-", value: note(3, "tests pass", { role: "conclusion", result: "success" }) }];
  log.add("model_response", identity.response("s1:t2", 2), { turn: "s1:t2", attempt: 2, patch: p2, usage: { input_tokens: 150, output_tokens: 30 } });
  log.add("patch_accepted", identity.patch("s1:t2"), { turn: "s1:t2", attempt: 2, patch: p2, revision: 2, new_cell_ids: [3], removed_ids: [2], consumed: ["execution:1"] });
  log.add("validator_result", identity.validator(S, 3, 0), { note_id: 3, index: 0, argv: ["python3", "-m", "unittest"], exit_code: 0, passed: true, output: "OK" });
  log.add("control_handled", identity.control(S, 3), { note_id: 3, role: "conclusion", outcome: "concluded", detail: "validators passed" });
  log.add("run_ended", identity.terminal(S), { result: "success", reason: "concluded by note 3" });
  return log;
}

describe("reducer", () => {
  test("every event of the hand-written log is a valid event", () => {
    for (const e of handWrittenLog().events) parseLogEvent(e);
  });

  test("folds a hand-written log into the expected projection", () => {
    const log = handWrittenLog();
    const p = reduce(log.events);
    assert.equal(p.head, log.head);
    assert.deepEqual(p.order, [S]);
    const s = p.sessions.get(S)!;
    State.parse(s.state);
    assert.equal(s.state.revision, 2);
    assert.deepEqual(
      s.state.cells.map((c) => c.id),
      [1, 3],
    );
    assert.equal(s.state.runtime.next_cell_id, 4);
    assert.deepEqual(s.state.runtime.inbox, []);
    assert.deepEqual(s.state.runtime.cells, { "1": { phase: "finished", result: "success", exit_code: 0, output: "1 passed\n" } });
    assert.deepEqual(s.state.runtime.usage, { rounds: 2, attempts: 3, input_tokens: 250, output_tokens: 50, unknown_usage_attempts: 1 });
    assert.deepEqual([...s.cells.keys()].sort(), [1, 2, 3], "removed cell 2 stays in history");
    const ex = s.executions.get(1)!;
    assert.equal(ex.phase, "finished");
    assert.equal(ex.queued_seq, 7);
    assert.equal(ex.started?.pid, 4242);
    assert.equal(ex.output_chunks, 1);
    assert.deepEqual([...s.consumed].sort(), ["execution:1", "hello"]);
    assert.deepEqual(s.pending, []);
    assert.deepEqual(s.delivered, []);
    assert.equal(s.open_turn, null);
    assert.equal(s.turn_count, 2);
    assert.equal(s.turns.get("s1:t2")?.accepted?.revision, 2);
    assert.equal(s.turns.get("s1:t2")?.attempts, 2);
    assert.deepEqual(s.timers.get("t-a"), { timer_id: "t-a", cell_id: 1, due_at: "2026-01-01T00:01:00.000Z", note: "check again", fired: true });
    assert.equal(s.controls.get(3)?.outcome, "concluded");
    assert.equal(s.validators_run.get(3)?.[0]?.passed, true);
    assert.equal(s.terminal?.result, "success");
  });

  test("the folded State equals what admission returned for the same patches", () => {
    const log = handWrittenLog();
    const r = new Reducer();
    for (const e of log.events) {
      if (e.kind === "patch_accepted") {
        const s = r.session(S)!;
        const ctx = { state: s.state, executions: s.executions, cellsEver: s.cells, pendingObservations: s.pending.length, headSeq: r.headSeq, accepted: new Map() };
        const out = admit(ctx, e.body.patch, e.body.turn);
        assert.ok(out.ok, out.ok ? "" : out.reason);
        r.apply([e]);
        assert.deepEqual(r.session(S)!.state, out.receipt.state);
        continue;
      }
      r.apply([e]);
    }
  });

  test("an open turn holds its delivered observations in runtime.inbox; unread ones stay pending", () => {
    const log = new LogBuilder(S);
    log.add("session_created", identity.session(S), { goal: "g", cwd: "/w", validators: [], budgets: {} });
    log.add("inbox_received", identity.inbox(S, "a"), { observation: observation("a") });
    log.add("turn_prepared", identity.turn("s1:t1"), { turn: "s1:t1", n: 1, revision: 0, delivered: ["a"] });
    log.add("inbox_received", identity.inbox(S, "b"), { observation: observation("b") });
    const s = reduce(log.events).sessions.get(S)!;
    assert.deepEqual(
      s.state.runtime.inbox.map((o) => o.id),
      ["a"],
    );
    assert.deepEqual(s.pending, ["b"]);
    assert.equal(s.open_turn, "s1:t1");
  });

  test("refuses a duplicate identity", () => {
    const log = new LogBuilder(S);
    log.add("session_created", identity.session(S), { goal: "g", cwd: "/w", validators: [], budgets: {} });
    log.add("inbox_received", identity.inbox(S, "a"), { observation: observation("a") });
    log.add("inbox_received", identity.inbox(S, "a"), { observation: observation("a") });
    assert.throws(() => reduce(log.events), (err: unknown) => err instanceof LogCorrupt && /inbox:s1:a appears twice/.test(err.message) && err.code === "internal");
  });

  test("remembers owner claims always and other identities only in a bounded recent window", () => {
    const log = new LogBuilder(S);
    log.add("session_created", identity.session(S), { goal: "g", cwd: "/w", validators: [], budgets: {} });
    log.add("owner_claimed", identity.owner(S, 1), { epoch: 1, host: "h", boot_id: "b", pid: 1 });
    for (let n = 1; n <= RECENT_IDENTITIES + 10; n++) log.add("post_refused", identity.postRefused(S, n), { id: `m${n}`, kind: "note", code: "invalid", reason: "r" });
    const r = new Reducer();
    r.apply(log.events);
    assert.equal(r.folded(identity.owner(S, 1)), true, "a claim is remembered however long ago");
    assert.equal(r.folded(identity.postRefused(S, 1)), false, "an old identity has left the window");
    assert.equal(r.folded(identity.postRefused(S, RECENT_IDENTITIES + 10)), true);
    // A repeat within the window is still refused; so is a repeated claim.
    const head = log.events.length;
    const dup = { ...log.events[head - 5]!, seq: head + 1 };
    assert.throws(() => r.apply([dup]), /appears twice/);
    const claim = { ...log.events[1]!, seq: head + 1 };
    assert.throws(() => r.apply([claim]), /appears twice/);
  });

  test("refuses an event for an unknown session", () => {
    const log = new LogBuilder(S);
    log.add("session_created", identity.session(S), { goal: "g", cwd: "/w", validators: [], budgets: {} });
    log.add("inbox_received", identity.inbox("s2", "a"), { observation: observation("a") }, "s2");
    assert.throws(() => reduce(log.events), (err: unknown) => err instanceof LogCorrupt && /unknown session s2/.test(err.message));
  });

  test("refuses an event whose seq is not after the head", () => {
    const log = handWrittenLog();
    const r = new Reducer();
    r.apply(log.events.slice(0, 3));
    assert.throws(() => r.apply([log.events[1]!]), LogCorrupt);
  });

  test("output with multi-byte characters is not marked truncated when the tail shows all of it", () => {
    const log = new LogBuilder(S);
    log.add("session_created", identity.session(S), { goal: "g", cwd: "/w", validators: [], budgets: {} });
    log.add("turn_prepared", identity.turn("s1:t1"), { turn: "s1:t1", n: 1, revision: 0, delivered: [] });
    const p = [rev(0), { op: "add", path: "/cells/-", value: cmd(1) }];
    log.add("patch_accepted", identity.patch("s1:t1"), { turn: "s1:t1", attempt: 1, patch: p, revision: 1, new_cell_ids: [1], removed_ids: [], consumed: [] });
    log.add("execution_queued", identity.queued(S, 1), { cell_id: 1, kind: "cmd" });
    log.add("execution_started", identity.execution(S, 1), { cell_id: 1, host: "h", boot_id: "b", pid: 7, pgid: 7, start_time: "1" });
    const text = "é".repeat(3000); // 3000 characters, 6000 bytes: fits the 4000-character tail.
    log.add("execution_output", identity.output(S, 1, 0), { cell_id: 1, n: 0, stream: "stdout", data: text });
    const view = reduce(log.events).sessions.get(S)!.state.runtime.cells["1"]!;
    assert.equal(view.output, text);
    assert.equal(view.truncated, undefined);
    // And a longer output is marked.
    log.add("execution_output", identity.output(S, 1, 1), { cell_id: 1, n: 1, stream: "stdout", data: "x".repeat(2000) });
    const view2 = reduce(log.events).sessions.get(S)!.state.runtime.cells["1"]!;
    assert.equal(view2.output?.length, 4000);
    assert.equal(view2.truncated, true);
  });

  test("refuses a patch_accepted that cannot be folded or folds to another revision", () => {
    const base = () => {
      const log = new LogBuilder(S);
      log.add("session_created", identity.session(S), { goal: "g", cwd: "/w", validators: [], budgets: {} });
      log.add("turn_prepared", identity.turn("s1:t1"), { turn: "s1:t1", n: 1, revision: 0, delivered: [] });
      return log;
    };
    const a = base();
    a.add("patch_accepted", identity.patch("s1:t1"), { turn: "s1:t1", attempt: 1, patch: [rev(0), { op: "remove", path: "/cells/3" }], revision: 1, new_cell_ids: [], removed_ids: [], consumed: [] });
    assert.throws(() => reduce(a.events), (err: unknown) => err instanceof LogCorrupt && /patch:s1:t1 \(seq 3\) cannot be folded/.test(err.message));
    const b = base();
    b.add("patch_accepted", identity.patch("s1:t1"), { turn: "s1:t1", attempt: 1, patch: [rev(0)], revision: 5, new_cell_ids: [], removed_ids: [], consumed: [] });
    assert.throws(() => reduce(b.events), (err: unknown) => err instanceof LogCorrupt && /folds to revision 1, the log says 5/.test(err.message));
  });
});
