/**
 * The projection keeps a bounded history (src/state/history.ts): a long run's projection stops
 * growing, what the run still needs is never dropped, and the fold stays deterministic (a snapshot
 * restored mid-way plus the tail equals the fold of the whole log).
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { identity, turnId } from "../../src/state/events.js";
import { dropHistory, ENDED_HISTORY_KEEP, HISTORY_KEEP, type HistoryParts } from "../../src/state/history.js";
import { runtimeCellsView } from "../../src/state/projection.js";
import { Reducer, reduce } from "../../src/state/reducer.js";
import type { Cell, Observation } from "../../src/state/schema.js";
import { encodeSnapshot, restoreSnapshot } from "../../src/state/snapshot.js";
import { cmd, execution, LogBuilder, note, observation } from "./helpers.js";

const S = "s1";
const ROUNDS = 2 * HISTORY_KEEP + 600;
const UNKNOWN_CELL = 5;
const ERROR_CELL = 7;

/**
 * A run of `ROUNDS` rounds: each removes the previous round's cell and adds one cmd cell, which runs
 * and finishes. Note 1 stays in context throughout. Cell 5 ends as an UnknownExecution nobody resolves;
 * cell 7 ends with an error; an outside observation arrives every 100 rounds.
 */
function longRun(): LogBuilder {
  const log = new LogBuilder(S);
  log.add("session_created", identity.session(S), { goal: "long", cwd: "/w", validators: [], budgets: {} });
  let context: Cell[] = [];
  let revision = 0;
  let pending: string[] = [];
  for (let n = 1; n <= ROUNDS; n++) {
    if (n % 100 === 0) {
      const o = observation(`msg-${n}`);
      log.add("inbox_received", identity.inbox(S, o.id), { observation: o });
      pending.push(o.id);
    }
    const turn = turnId(S, n);
    const delivered = pending;
    pending = [];
    log.add("turn_prepared", identity.turn(turn), { turn, n, revision, delivered });
    const cellId = n + 1; // note 1 is cell 1 (round 1 adds it with cmd 2)
    const ops: unknown[] = [{ op: "test", path: "/revision", value: revision }];
    for (let i = context.length - 1; i >= 0; i--) if (context[i]!.kind !== "note") ops.push({ op: "remove", path: `/cells/${i}` });
    const removed = context.filter((c) => c.kind !== "note").map((c) => c.id);
    const added: Cell[] = n === 1 ? [note(1, "keep me"), cmd(2)] : [cmd(cellId)];
    for (const c of added) ops.push({ op: "add", path: "/cells/-", value: c });
    context = [...context.filter((c) => c.kind === "note"), ...added];
    revision += 1;
    log.add("model_attempt", identity.attempt(turn, 1), { turn, attempt: 1 });
    log.add("model_response", identity.response(turn, 1), { turn, attempt: 1, patch: ops as never, usage: { input_tokens: 1, output_tokens: 1 } });
    log.add("patch_accepted", identity.patch(turn), { turn, attempt: 1, patch: ops as never, revision, new_cell_ids: added.map((c) => c.id), removed_ids: removed, consumed: delivered });
    const runs = added.filter((c) => c.kind !== "note");
    for (const c of runs) log.add("execution_queued", identity.queued(S, c.id), { cell_id: c.id, kind: "cmd" });
    for (const c of runs) {
      log.add("execution_started", identity.execution(S, c.id), { cell_id: c.id, host: "h", boot_id: "b", pid: 1000 + c.id, pgid: 1000 + c.id, start_time: "1" });
      const result = c.id === UNKNOWN_CELL ? "UnknownExecution" : c.id === ERROR_CELL ? "error" : "success";
      const unknown = result === "UnknownExecution" ? { type: "UnknownExecution" as const, cell_id: c.id, reason: "worker_lost_before_result_commit", worker_stopped: true, evidence_refs: [] } : null;
      log.add("execution_finished", identity.finished(S, c.id), { cell_id: c.id, result, exit_code: result === "success" ? 0 : null, signal: null, duration_ms: 1, output_bytes: 0, dropped_bytes: 0, detail: null, unknown });
      const oid = `execution:${c.id}`;
      log.add("inbox_received", identity.inbox(S, oid), { observation: { id: oid, source: "execution", kind: "finished", at: log.at, payload: { cell_id: c.id, result } } });
      pending.push(oid);
    }
  }
  return log;
}

describe("bounded history", () => {
  const log = longRun();
  const s = reduce(log.events).sessions.get(S)!;

  test("a long run's projection stops growing: each kind holds at most twice HISTORY_KEEP finished entries", () => {
    assert.ok(ROUNDS > 2 * HISTORY_KEEP, "the run is long enough to drop history");
    assert.ok(s.executions.size <= 2 * HISTORY_KEEP + 2, `executions: ${s.executions.size}`);
    assert.ok(s.executions.size >= HISTORY_KEEP, `the most recent history stays: ${s.executions.size}`);
    assert.ok(s.cells.size <= 2 * HISTORY_KEEP + 3, `cells: ${s.cells.size}`);
    assert.ok(s.turns.size <= 2 * HISTORY_KEEP + 1, `turns: ${s.turns.size}`);
    assert.ok(s.observations.size <= 2 * HISTORY_KEEP + ROUNDS / 100 + 1, `observations: ${s.observations.size}`);
    assert.ok(s.consumed.size <= 2 * HISTORY_KEEP + ROUNDS / 100 + 2, `consumed: ${s.consumed.size}`);
    assert.equal(s.turn_count, ROUNDS);
    assert.ok(!s.executions.has(3), "the oldest finished execution out of context was dropped");
    assert.ok(s.executions.has(ROUNDS + 1), "the latest is kept");
  });

  test("what the run still needs is never dropped", () => {
    const unknown = s.executions.get(UNKNOWN_CELL);
    assert.equal(unknown?.result, "UnknownExecution", "an unresolved UnknownExecution stays, out of context and old");
    assert.equal(s.state.runtime.cells[String(UNKNOWN_CELL)]?.result, "UnknownExecution", "and the model still sees it");
    assert.ok(s.cells.has(1) && s.state.cells.some((c) => c.id === 1), "a note in context stays");
    for (let n = 100; n <= ROUNDS; n += 100) assert.ok(s.observations.has(`msg-${n}`), `outside observation msg-${n} stays (a re-post must stay a duplicate)`);
    assert.ok(!s.executions.has(ERROR_CELL), "an error whose observation was consumed may go");
    for (const t of s.turns.values()) for (const id of t.accepted?.new_cell_ids ?? []) assert.ok(s.cells.has(id), `kept turn ${t.turn} names cell ${id}, which is kept too (a replay answers with it)`);
    assert.deepEqual(JSON.stringify(s.state.runtime.cells), JSON.stringify(runtimeCellsView(s.state.cells, s.executions)), "runtime.cells is still the view of what is kept");
  });

  test("a snapshot restored mid-way plus the tail folds to what the whole log folds to", () => {
    const whole = reduce(log.events);
    // Points before, at and after the first drops (the first happens when a collection passes 2 x HISTORY_KEEP).
    for (const fraction of [0.3, 0.77, 0.78, 0.9]) {
      const cut = Math.floor(log.events.length * fraction);
      const first = new Reducer();
      first.apply(log.events.slice(0, cut));
      const text = encodeSnapshot(first.projection());
      const restored = restoreSnapshot(text, cut, { validate: "full" });
      restored.apply(log.events.slice(cut));
      assert.deepEqual(restored.projection(), whole, `snapshot at event ${cut} + tail`);
    }
  });

  test("the snapshot of a long run stays small", () => {
    const bytes = Buffer.byteLength(encodeSnapshot(reduce(log.events)));
    const perKept = bytes / (2 * HISTORY_KEEP);
    assert.ok(bytes < 2 * 1024 * 1024, `snapshot ${bytes} bytes (${perKept.toFixed(0)} per kept round)`);
  });
});

describe("dropHistory keeps what is still wanted", () => {
  function parts(): HistoryParts {
    const cells = new Map<number, Cell>();
    const executions = new Map();
    for (let id = 1; id <= 10; id++) {
      cells.set(id, cmd(id));
      executions.set(id, execution(id, "finished", id === 2 ? "error" : "success"));
    }
    // Note 11 (in context) cancels cell 3 and is not handled yet.
    const cancel = note(11, "stop 3", { role: "cancel", target_cell_id: 3 });
    cells.set(11, cancel);
    const state = { ...reduce([]).sessions.get("x")?.state, cells: [cancel] } as unknown as HistoryParts["state"];
    // Every execution told the model how it ended; all were read but cell 2's and cell 6's.
    const observations = new Map<string, Observation>();
    const consumed = new Set<string>();
    for (let id = 1; id <= 10; id++) {
      const oid = `execution:${id}`;
      observations.set(oid, { id: oid, source: "execution", kind: "finished", at: "2026-01-01T00:00:00.000Z", payload: { cell_id: id } });
      if (id !== 2 && id !== 6) consumed.add(oid);
    }
    return { state, cells, executions, observations, consumed, turns: new Map(), open_turn: null, controls: new Map(), validators_run: new Map() };
  }

  test("an execution whose observation is unread (an error pauses the queue), and the target of a pending control note, stay", () => {
    const p = parts();
    dropHistory(p, 2);
    assert.ok(p.executions.has(2), "the unconsumed error pauses the queue: kept");
    assert.ok(p.executions.has(6), "a success the model has not read yet: kept");
    assert.ok(p.executions.has(3), "the target of an unhandled cancel note: kept");
    assert.ok(!p.executions.has(1) && !p.executions.has(4), "older finished executions went");
    assert.ok(p.executions.has(9) && p.executions.has(10), "the most recent two (keep = 2) stayed");
    assert.ok(p.cells.has(11), "the control note stays until handled");
  });

  test("nothing is scanned or dropped below twice the limit", () => {
    const p = parts();
    assert.equal(dropHistory(p, 6), 0);
    assert.equal(p.executions.size, 10);
  });
});

describe("an ended run keeps only its most recent history", () => {
  const log = longRun();
  const before = log.events.length;
  log.add("run_ended", identity.terminal(S), { result: "success", reason: "done" });
  const running = reduce(log.events.slice(0, before)).sessions.get(S)!;
  const ended = reduce(log.events).sessions.get(S)!;

  test("at run_ended each kind is cut to ENDED_HISTORY_KEEP finished entries; what must stay stays", () => {
    assert.ok(running.executions.size > 2 * ENDED_HISTORY_KEEP);
    assert.ok(ended.executions.size <= ENDED_HISTORY_KEEP + 2, `executions: ${ended.executions.size}`);
    assert.ok(ended.turns.size <= ENDED_HISTORY_KEEP + 1, `turns: ${ended.turns.size}`); // and the open turn
    assert.ok(ended.cells.size <= ENDED_HISTORY_KEEP + 3, `cells: ${ended.cells.size}`);
    assert.ok(ended.executions.has(ROUNDS + 1), "the latest execution is kept");
    assert.equal(ended.executions.get(UNKNOWN_CELL)?.result, "UnknownExecution", "an unresolved UnknownExecution stays");
    for (let n = 100; n <= ROUNDS; n += 100) assert.ok(ended.observations.has(`msg-${n}`), `outside observation msg-${n} stays`);
    assert.deepEqual(ended.state, running.state, "the State is untouched");
    assert.equal(ended.terminal?.result, "success");
    assert.equal(ended.turn_count, running.turn_count);
    for (const t of ended.turns.values()) for (const id of t.accepted?.new_cell_ids ?? []) assert.ok(ended.cells.has(id), `kept turn ${t.turn} names cell ${id}, which is kept too`);
  });

  test("a snapshot taken before or after the end plus the tail folds to what the whole log folds to; the ended run's snapshot is small", () => {
    const whole = reduce(log.events);
    for (const cut of [before - 50, before, log.events.length]) {
      const first = new Reducer();
      first.apply(log.events.slice(0, cut));
      const restored = restoreSnapshot(encodeSnapshot(first.projection()), cut, { validate: "full" });
      restored.apply(log.events.slice(cut));
      assert.deepEqual(restored.projection(), whole, `snapshot at event ${cut} + tail`);
    }
    const endedBytes = Buffer.byteLength(encodeSnapshot(whole));
    const runningBytes = Buffer.byteLength(encodeSnapshot(reduce(log.events.slice(0, before))));
    assert.ok(endedBytes * 10 < runningBytes, `an ended run's snapshot ${endedBytes} bytes against ${runningBytes} while it ran`);
  });

  test("a run of up to twice ENDED_HISTORY_KEEP cells keeps everything when it ends", () => {
    const short = new LogBuilder(S);
    short.add("session_created", identity.session(S), { goal: "short", cwd: "/w", validators: [], budgets: {} });
    let revision = 0;
    for (let n = 1; n <= 2 * ENDED_HISTORY_KEEP; n++) {
      const turn = turnId(S, n);
      short.add("turn_prepared", identity.turn(turn), { turn, n, revision, delivered: [] });
      const ops = [{ op: "test", path: "/revision", value: revision }, { op: "add", path: "/cells/-", value: cmd(n) }];
      revision += 1;
      short.add("model_attempt", identity.attempt(turn, 1), { turn, attempt: 1 });
      short.add("model_response", identity.response(turn, 1), { turn, attempt: 1, patch: ops as never, usage: { input_tokens: 1, output_tokens: 1 } });
      short.add("patch_accepted", identity.patch(turn), { turn, attempt: 1, patch: ops as never, revision, new_cell_ids: [n], removed_ids: [], consumed: [] });
    }
    const open = reduce(short.events).sessions.get(S)!;
    short.add("run_ended", identity.terminal(S), { result: "failure", reason: "budget" });
    const closed = reduce(short.events).sessions.get(S)!;
    assert.equal(closed.turns.size, open.turns.size);
    assert.equal(closed.cells.size, open.cells.size);
    assert.equal(closed.terminal?.result, "failure");
  });
});
