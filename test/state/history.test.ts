/**
 * The projection keeps a bounded history (src/state/history.ts): a long run's projection stops
 * growing, what the run still needs is never dropped, and the fold stays deterministic (a snapshot
 * restored mid-way plus the tail equals the fold of the whole log).
 *
 * And dropping history does not change what a run does, checked by a differential run: a simulated
 * harness (the decisions of src/state/next-step.ts and the events of src/state/outcomes.ts, a seeded
 * random model, cells that finish at random, cancels, resolutions, refused conclusions, timers and
 * outside posts) drives a session past 2 x HISTORY_KEEP of every kind, and every event is folded
 * twice: by the Reducer, which drops history, and by a reference Reducer whose collections ignore
 * `delete` (so it folds the whole history). The State the model sees, every `nextStep` decision, the
 * pause, the success blockers, the admission verdict of every patch (except a patch that names a
 * cell dropped from history, which history.ts documents), and the answer to every outside re-post
 * must be the same. The incremental `runtime.cells` view and the structural snapshot decode are
 * checked along the way.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { admit } from "../../src/state/admission.js";
import type { LogEvent, NewEvent } from "../../src/state/events.js";
import { event, identity, turnId } from "../../src/state/events.js";
import { dropHistory, ENDED_HISTORY_KEEP, HISTORY_KEEP, type HistoryParts } from "../../src/state/history.js";
import { dueTimers, nextStep, pausedBy, successBlockers, unfinished, type NextStep, type StepLimits } from "../../src/state/next-step.js";
import { speculate } from "../../src/state/speculate.js";
import { acceptedEvents, admissionContext, cancelledBeforeLaunch, controlEvents, finishedEvents, lostWorker, processFinished, timerFiredEvents } from "../../src/state/outcomes.js";
import type { Projection, SessionProjection } from "../../src/state/projection.js";
import { runtimeCellsView } from "../../src/state/projection.js";
import { Reducer, reduce } from "../../src/state/reducer.js";
import type { Cell, NoteCell, Observation } from "../../src/state/schema.js";
import { encodeSnapshot, restoreSnapshot } from "../../src/state/snapshot.js";
import { checkOutsideObservation, outsideToObservation } from "../../src/harness/observations.js";
import { rng } from "../../chaos/nemesis/rng.js";
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

const T0 = Date.parse("2026-01-01T00:00:00.000Z");
/** When the long phase begins (rounds) and how many queued cells are cancelled behind its runner. */
const LONG_AT = 2 * HISTORY_KEEP + 100;
const LONG_CANCELS = 1100;
const LIMITS: StepLimits = { maxAttemptsPerTurn: 6, deliverPerRound: 32 };

/** A Map that never forgets: dropHistory's deletes do nothing, so a Reducer over it keeps all history. */
class KeepMap<K, V> extends Map<K, V> {
  override delete(_key: K): boolean {
    return false;
  }
}
class KeepSet<T> extends Set<T> {
  override delete(_value: T): boolean {
    return false;
  }
}

/** A read-only view of `map` that is not a Map: next-step.ts finds no index for it and scans. */
function viewOf<K, V>(map: ReadonlyMap<K, V>): ReadonlyMap<K, V> {
  return {
    get: (k: K) => map.get(k),
    has: (k: K) => map.has(k),
    get size() {
      return map.size;
    },
    forEach: (f: (v: V, k: K, m: ReadonlyMap<K, V>) => void) => map.forEach(f),
    keys: () => map.keys(),
    values: () => map.values(),
    entries: () => map.entries(),
    [Symbol.iterator]: () => map.entries(),
  };
}

/** `s` with its cells and executions behind views that carry no index. */
function scanOnly(s: SessionProjection): SessionProjection {
  return { ...s, cells: viewOf(s.cells), executions: viewOf(s.executions) };
}

/** A Reducer at `first` (a session_created) whose session keeps its whole history. */
function keepingReducer(first: LogEvent): Reducer {
  const r = new Reducer();
  r.apply([first]);
  const s = r.session(first.session)!;
  const kept: SessionProjection = {
    ...s,
    cells: new KeepMap(s.cells),
    executions: new KeepMap(s.executions),
    observations: new KeepMap(s.observations),
    consumed: new KeepSet(s.consumed),
    turns: new KeepMap(s.turns),
    timers: new KeepMap(s.timers),
    controls: new KeepMap(s.controls),
    validators_run: new KeepMap(s.validators_run),
  };
  return Reducer.restore({ head: r.headSeq, order: [first.session], sessions: new Map([[first.session, kept]]) });
}

interface Counts {
  rounds: number;
  accepted: number;
  rejected: number;
  documentedDifferences: number;
  executions: number;
  timersFired: number;
  posts: number;
  reposts: number;
  cancels: number;
  resolutions: number;
  conclusions: number;
  checks: number;
  /** Decisions on a projection with live indexes compared with a scan of the same projection. */
  indexChecks: number;
  /** The same through a speculative overlay. */
  overlayChecks: number;
}

/** What differs between two admission verdicts, when a dropped cell explains it (history.ts: "as for a cell that does not exist"). */
function namesDroppedCell(patch: unknown[], s: SessionProjection, ref: SessionProjection): boolean {
  for (const op of patch as { value?: { role?: string; target_cell_id?: number; evidence_refs?: string[] } }[]) {
    const v = op.value;
    if (v === undefined) continue;
    const ids: number[] = [];
    if (v.target_cell_id !== undefined) ids.push(v.target_cell_id);
    for (const r of v.evidence_refs ?? []) if (r.startsWith("cell:")) ids.push(Number(r.slice(5)));
    if (ids.some((id) => !s.cells.has(id) && ref.cells.has(id))) return true;
    if (v.role === "resolution" && v.target_cell_id !== undefined && !s.executions.has(v.target_cell_id) && ref.executions.has(v.target_cell_id)) return true;
  }
  return false;
}

class Sim {
  readonly log: LogEvent[] = [];
  readonly real = new Reducer();
  ref!: Reducer;
  now = T0;
  running: number | null = null;
  /** Cells the model keeps in context for good (old cells in context must never be dropped). */
  readonly pinned = new Set<number>();
  /**
   * The long phase: one cell runs for a long time while the model queues and cancels hundreds of
   * cells behind it; it then ends with an error out of context, older (in queue order) than a
   * thousand finished executions, with its observation not consumed yet.
   */
  long: { runner: number | null; cancelled: number; done: boolean } = { runner: null, cancelled: 0, done: false };
  readonly outside: { id: string; kind: string; payload: unknown }[] = [];
  private timerN = 0;
  readonly counts: Counts = { rounds: 0, accepted: 0, rejected: 0, documentedDifferences: 0, executions: 0, timersFired: 0, posts: 0, reposts: 0, cancels: 0, resolutions: 0, conclusions: 0, checks: 0, indexChecks: 0, overlayChecks: 0 };

  constructor(readonly rnd: () => number) {}

  get s(): SessionProjection {
    return this.real.session(S)!;
  }
  get r(): SessionProjection {
    return this.ref.session(S)!;
  }
  iso(): string {
    return new Date(this.now).toISOString();
  }
  pick<T>(xs: readonly T[]): T {
    return xs[Math.floor(this.rnd() * xs.length)]!;
  }

  start(): void {
    const first = { seq: 1, ...event("session_created", S, identity.session(S), this.iso(), { goal: "long run", cwd: "/w", validators: [["false"]], budgets: {} }) } as LogEvent;
    this.log.push(first);
    this.real.apply([first]);
    this.ref = keepingReducer(first);
  }

  commit(events: readonly NewEvent[]): void {
    const logged = events.map((e, i) => ({ ...e, seq: this.real.headSeq + 1 + i }) as LogEvent);
    this.real.apply(logged);
    this.ref.apply(logged);
    this.log.push(...logged);
    this.now += 7;
    this.check(events.map((e) => e.kind).join(","));
  }

  /** What must not differ after every commit. */
  check(what: string): void {
    this.counts.checks++;
    const s = this.s;
    const r = this.r;
    assert.deepEqual(s.state, r.state, `after ${what} (head ${this.real.headSeq}): the State the model sees differs from the one a fold without bounded history gives`);
    assert.equal(JSON.stringify(s.state.runtime.cells), JSON.stringify(runtimeCellsView(s.state.cells, s.executions)), `after ${what}: runtime.cells is not the view from scratch`);
    assert.deepEqual([s.pending, s.delivered, s.open_turn, s.turn_count, s.idle_streak, s.terminal], [r.pending, r.delivered, r.open_turn, r.turn_count, r.idle_streak, r.terminal], `after ${what}: the inbox or the round differs`);
    const busy = this.running !== null;
    assert.deepEqual(this.decide(s, busy), this.decide(r, busy), `after ${what} (head ${this.real.headSeq}): nextStep decides differently with bounded history`);
    assert.equal(pausedBy(s)?.cell_id ?? null, pausedBy(r)?.cell_id ?? null, `after ${what}: the queue's pause differs`);
    assert.deepEqual(successBlockers(s), successBlockers(r), `after ${what}: the success blockers differ`);
    // The live indexes (src/state/live-index.ts) against a scan: the same projection behind views
    // that are not Maps (so no index) must get the same decisions; the bounded projection's after
    // every commit, the reference's (whole history, slower to scan) after every 16th.
    for (const [name, p] of this.counts.checks % 16 === 0 ? ([["bounded", s], ["reference", r]] as const) : ([["bounded", s]] as const)) {
      const scanned = scanOnly(p);
      assert.deepEqual(this.decide(p, busy), this.decide(scanned, busy), `after ${what} (head ${this.real.headSeq}): the ${name} projection's indexes decide differently from a scan`);
      assert.equal(pausedBy(p)?.cell_id ?? null, pausedBy(scanned)?.cell_id ?? null, `after ${what}: the ${name} projection's indexes see another pause than a scan`);
      assert.deepEqual([...unfinished(p)].map((e) => e.cell_id), [...p.executions.values()].filter((e) => e.phase !== "finished").map((e) => e.cell_id), `after ${what}: the ${name} projection's unfinished executions differ from a scan`);
      this.counts.indexChecks++;
    }
    // The same through a speculative overlay (speculate.ts), whose index is its base's adjusted.
    const carried = this.speculated();
    if (carried !== null) {
      const o = speculate(s, carried);
      if (o !== null) {
        const scanned = scanOnly(o);
        assert.deepEqual(this.decide(o, false), this.decide(scanned, false), `after ${what}: a speculated projection's index decides differently from a scan`);
        this.counts.overlayChecks++;
      }
    }
  }

  /** The events a cell still running would carry if it finished now with an error (for the overlay check), or null. */
  speculated(): NewEvent[] | null {
    const s = this.s;
    for (const ex of s.executions.values()) {
      if (ex.phase !== "started") continue;
      return finishedEvents(s, processFinished(s, ex.cell_id, { result: "error", exit_code: 1, signal: null, duration_ms: 1, output_bytes: 0, dropped_bytes: 0, detail: null }, false), this.iso());
    }
    return null;
  }

  decide(s: SessionProjection, busy: boolean): NextStep {
    return nextStep({ session: s, limits: LIMITS, now: this.now, busy });
  }

  /** Things the outside world does between steps: posts, re-posts, timer registrations. */
  weather(): void {
    const x = this.rnd();
    if (x < 0.02) {
      const o = { id: `msg-${this.outside.length + 1}`, kind: "message", payload: { n: this.outside.length + 1 } };
      const a = checkOutsideObservation(this.s, o, 1000);
      assert.deepEqual(a, checkOutsideObservation(this.r, o, 1000));
      assert.ok(a.ok && !a.duplicate);
      this.outside.push(o);
      this.counts.posts++;
      this.commit([event("inbox_received", S, identity.inbox(S, o.id), this.iso(), { observation: outsideToObservation(o, this.iso()) })]);
    } else if (x < 0.05 && this.outside.length > 0) {
      const o = this.pick(this.outside);
      const a = checkOutsideObservation(this.s, o, 1000);
      assert.deepEqual(a, { ok: true, duplicate: true }, `a re-post of ${o.id} is a duplicate`);
      assert.deepEqual(checkOutsideObservation(this.s, { ...o, payload: "other" }, 1000).ok, false, `a re-post of ${o.id} with other content is refused`);
      this.counts.reposts++;
    } else if (x < 0.4) {
      this.timerN++;
      const id = `t-${this.timerN}`;
      const due = new Date(this.now + Math.floor(this.rnd() * 40)).toISOString();
      this.commit([event("timer_registered", S, identity.timer(S, id), this.iso(), { timer_id: id, cell_id: this.running, due_at: due, note: null })]);
    }
  }

  /** One decision of the driver, performed. */
  step(): void {
    this.weather();
    // A due timer's armed callback fires it while the driver does something else.
    const due = dueTimers(this.s, this.now)[0];
    if (due !== undefined && this.rnd() < 0.5) {
      this.counts.timersFired++;
      return this.commit(timerFiredEvents(this.s, due, this.now, this.iso()));
    }
    if (this.long.runner !== null && this.long.runner === this.running && this.long.cancelled >= LONG_CANCELS && this.s.executions.size > 2 * HISTORY_KEEP) {
      this.long.done = true;
      this.long.runner = null;
      return this.finishRunning("error");
    }
    // A running cell ends on its own time, whatever the driver is doing.
    if (this.running !== null && this.running !== this.long.runner && this.rnd() < 0.4) return this.finishRunning();
    const s = this.s;
    const step = this.decide(s, this.running !== null);
    switch (step.kind) {
      case "ended":
      case "end_run":
        assert.fail(`the run ended: ${JSON.stringify(step)}`);
        break;
      case "control":
        return this.control(step.note, step.action);
      case "dispatch":
        this.commit([event("execution_started", S, identity.execution(S, step.cell.id), this.iso(), { cell_id: step.cell.id, host: "h", boot_id: "b", pid: 100 + (step.cell.id % 1000), pgid: 100 + (step.cell.id % 1000), start_time: "1" })]);
        this.running = step.cell.id;
        this.counts.executions++;
        if (!this.long.done && this.long.runner === null && this.counts.rounds >= LONG_AT) {
          this.long.runner = step.cell.id;
          return;
        }
        if (this.rnd() < 0.7) this.finishRunning();
        return;
      case "round":
        return this.round(step);
      case "fire_timer":
        this.counts.timersFired++;
        return this.commit(timerFiredEvents(s, step.timer, this.now, this.iso()));
      case "wait": {
        if (this.running !== null && this.running !== this.long.runner) return this.finishRunning();
        const due = [...s.timers.values()].filter((t) => !t.fired).map((t) => Date.parse(t.due_at));
        if (due.length > 0) {
          this.now = Math.max(this.now, Math.min(...due));
          return;
        }
        // Nothing to wait for (the model left nothing): an outside message wakes the run.
        const o = { id: `wake-${this.outside.length + 1}`, kind: "message", payload: null };
        this.outside.push(o);
        return this.commit([event("inbox_received", S, identity.inbox(S, o.id), this.iso(), { observation: outsideToObservation(o, this.iso()) })]);
      }
    }
  }

  finishRunning(forced?: "error"): void {
    const id = this.running!;
    this.running = null;
    const s = this.s;
    const x = forced === "error" ? 0.1 : this.rnd();
    if (x < 0.2) this.commit([event("execution_output", S, identity.output(S, id, 0), this.iso(), { cell_id: id, n: 0, stream: "stdout", data: `out ${id}\n` })]);
    if (x < 0.05) return this.commit(finishedEvents(this.s, lostWorker(s.executions.get(id)!, { worker_stopped: true, detail: "gone" }), this.iso()));
    const result = x < 0.13 ? "error" : "success";
    this.commit(finishedEvents(this.s, processFinished(this.s, id, { result, exit_code: result === "success" ? 0 : 1, signal: null, duration_ms: 1, output_bytes: 0, dropped_bytes: 0, detail: null }, false), this.iso()));
  }

  control(note: NoteCell, action: "resolve" | "cancel" | "conclude"): void {
    const s = this.s;
    if (action === "resolve") return this.commit(controlEvents(s, note, "resolved", "resolved", this.iso(), false));
    if (action === "cancel") {
      const target = note.target_cell_id!;
      const ex = s.executions.get(target);
      if (ex === undefined || ex.phase === "finished") return this.commit(controlEvents(s, note, "already_finished", "done", this.iso(), true));
      if (ex.phase === "queued") {
        if (this.long.runner !== null) this.long.cancelled++;
      }
      if (ex.phase === "queued") return this.commit(controlEvents(s, note, "cancelled", "cancelled", this.iso(), true, finishedEvents(s, cancelledBeforeLaunch(target, note.id), this.iso(), false)));
      assert.equal(this.running, target, "a started execution is the running one");
      if (target === this.long.runner) return this.commit(controlEvents(s, note, "already_finished", "not now", this.iso(), true));
      this.running = null;
      this.commit(finishedEvents(s, processFinished(s, target, { result: "error", exit_code: null, signal: "SIGKILL", duration_ms: 1, output_bytes: 0, dropped_bytes: 0, detail: null }, true), this.iso()));
      return this.commit(controlEvents(this.s, note, "stopped", "stopped", this.iso(), true));
    }
    const blockers = successBlockers(s);
    if (blockers.length > 0) return this.commit(controlEvents(s, note, "refused", blockers.join("; "), this.iso(), true));
    const done = s.validators_run.get(note.id) ?? [];
    for (let i = done.length; i < s.validators.length; i++) {
      this.commit([event("validator_result", S, identity.validator(S, note.id, i), this.iso(), { note_id: note.id, index: i, argv: [...s.validators[i]!], exit_code: 1, passed: false, output: "no" })]);
    }
    this.commit(controlEvents(this.s, note, "refused", "a validator failed", this.iso(), true));
  }

  round(step: Extract<NextStep, { kind: "round" }>): void {
    assert.ok(step.prepare, "the simulated driver never leaves a round open");
    this.counts.rounds++;
    const turn = step.turn;
    this.commit([
      event("turn_prepared", S, identity.turn(turn), this.iso(), { turn, n: step.n, revision: this.s.state.revision, delivered: [...step.delivered] }),
      event("model_attempt", S, identity.attempt(turn, 1), this.iso(), { turn, attempt: 1 }),
    ]);
    for (let attempt = 1; ; attempt++) {
      if (attempt > 1) this.commit([event("model_attempt", S, identity.attempt(turn, attempt), this.iso(), { turn, attempt })]);
      const patch = attempt < 4 ? this.model() : [{ op: "test", path: "/revision", value: this.s.state.revision }, { op: "add", path: "/cells/-", value: { id: this.s.state.runtime.next_cell_id, previous_id: null, kind: "cmd", argv: ["true"] } }];
      const verdict = admit(admissionContext(this.s, this.real.headSeq), patch, turn);
      const refVerdict = admit(admissionContext(this.r, this.ref.headSeq), patch, turn);
      const same = verdict.ok === refVerdict.ok && (verdict.ok ? true : !refVerdict.ok && verdict.code === refVerdict.code);
      if (!same) {
        assert.ok(namesDroppedCell(patch, this.s, this.r), `patch ${JSON.stringify(patch)} is judged differently with bounded history: ${JSON.stringify(verdict)} vs ${JSON.stringify(refVerdict)}`);
        this.counts.documentedDifferences++;
      }
      const response = event("model_response", S, identity.response(turn, attempt), this.iso(), { turn, attempt, patch: patch as never, usage: { input_tokens: 1, output_tokens: 1 } });
      if (verdict.ok) {
        assert.deepEqual(verdict.receipt.state, (refVerdict as typeof verdict).receipt?.state ?? verdict.receipt.state, "the admitted State differs");
        this.counts.accepted++;
        this.commit([response, ...acceptedEvents(this.s, turn, attempt, patch, verdict.receipt, 1_000_000, this.iso())]);
        return;
      }
      this.counts.rejected++;
      this.commit([response, event("patch_rejected", S, identity.rejected(turn, attempt), this.iso(), { turn, attempt, code: verdict.code, reason: verdict.reason })]);
    }
  }

  /** The random model: mostly one new cmd per round, old cells leave the context, now and then a role note. */
  model(): unknown[] {
    const s = this.s;
    const st = s.state;
    const view = st.runtime.cells;
    let next = st.runtime.next_cell_id;
    const ops: unknown[] = [{ op: "test", path: "/revision", value: st.revision }];
    const cells = st.cells.map((c) => c.id);
    // Replace a finished executable cell in context by a new version.
    if (this.rnd() < 0.05) {
      const pos = cells.findIndex((id) => view[String(id)]?.phase === "finished" && !this.pinned.has(id));
      if (pos >= 0) {
        ops.push({ op: "replace", path: `/cells/${pos}`, value: { id: next, previous_id: cells[pos], kind: "cmd", argv: ["true"] } });
        cells[pos] = next++;
      }
    }
    // Removals, highest position first: keep the context small so cells leave it and become history.
    const inLong = this.long.runner !== null;
    for (let pos = cells.length - 1; pos >= 0; pos--) {
      if (this.pinned.has(cells[pos]!)) continue;
      if (inLong || cells.length > 6 || this.rnd() < 0.5) {
        ops.push({ op: "remove", path: `/cells/${pos}` });
        cells.splice(pos, 1);
      }
    }
    const x = this.rnd();
    const add = (value: Record<string, unknown>) => {
      ops.push({ op: "add", path: "/cells/-", value: { id: next, previous_id: null, ...value } });
      cells.push(next++);
    };
    if (inLong) {
      // Queue ten cells and cancel ten queued ones (they finish, cancelled, before the runner does).
      const queued = Object.entries(view).filter(([, c]) => c.phase === "queued").map(([id]) => Number(id));
      for (let i = 0; i < 10; i++) add({ kind: "cmd", argv: ["true"] });
      for (const target of queued.slice(0, 10)) add({ kind: "note", text: "not needed", role: "cancel", target_cell_id: target });
      return ops;
    }
    if (this.pinned.size < 3 && this.rnd() < 0.004) this.pinned.add(next);
    add({ kind: "cmd", argv: ["true"] });
    if (x < 0.1) add({ kind: "cmd", argv: ["echo", "two"] });
    if (x > 0.9) add({ kind: "note", text: "a thought" });
    if (this.rnd() < 0.06) {
      this.counts.cancels++;
      const live = Object.entries(view).filter(([, c]) => c.phase !== "finished").map(([id]) => Number(id));
      const target = live.length > 0 && this.rnd() < 0.7 ? this.pick(live) : 1 + Math.floor(this.rnd() * (next - 1));
      add({ kind: "note", text: "stop it", role: "cancel", target_cell_id: target });
    }
    const unknown = Object.entries(view).filter(([, c]) => c.result === "UnknownExecution" && c.resolved_by === undefined).map(([id]) => Number(id));
    if (unknown.length > 0 && this.rnd() < 0.5) {
      this.counts.resolutions++;
      const evidence = this.rnd() < 0.8 ? "event:1" : `cell:${1 + Math.floor(this.rnd() * (next - 1))}`;
      add({ kind: "note", text: "checked", role: "resolution", target_cell_id: this.pick(unknown), evidence_refs: [evidence] });
    }
    if (this.rnd() < 0.02) {
      this.counts.conclusions++;
      add({ kind: "note", text: "done?", role: "conclusion", result: "success" });
    }
    return ops;
  }
}

function runLong(seed: number, minRounds: number): Sim {
  const sim = new Sim(rng(seed));
  sim.start();
  while (sim.counts.rounds < minRounds) sim.step();
  return sim;
}

describe("bounded history does not change what a run does (differential, past 2 x HISTORY_KEEP)", () => {
  const rounds = 2 * HISTORY_KEEP + 700;
  const t0 = performance.now();
  const sim = runLong(20261204, rounds);
  const ms = performance.now() - t0;

  test("the run was long enough to drop every kind of history", () => {
    const s = sim.s;
    const r = sim.r;
    console.log(`differential run: ${JSON.stringify(sim.counts)}; ${sim.log.length} events; kept/all executions ${s.executions.size}/${r.executions.size}, cells ${s.cells.size}/${r.cells.size}, observations ${s.observations.size}/${r.observations.size}, turns ${s.turns.size}/${r.turns.size}, timers ${s.timers.size}/${r.timers.size}; ${Math.round(ms)} ms`);
    assert.ok(s.executions.size < r.executions.size, "executions were dropped");
    assert.ok(s.cells.size < r.cells.size, "cells were dropped");
    assert.ok(s.observations.size < r.observations.size, "observations were dropped");
    assert.ok(s.turns.size < r.turns.size, "turns were dropped");
    assert.equal(s.timers.size, r.timers.size, "fired timers are kept (a repeated registration answers with the timer registered)");
    assert.ok(sim.long.done, "the long phase ran");
    assert.ok(sim.pinned.size > 0 && [...sim.pinned].every((id) => s.state.cells.some((c) => c.id === id) && s.executions.has(id)), "pinned cells stayed in context with their executions");
    assert.ok(sim.counts.cancels > 50 && sim.counts.resolutions > 20 && sim.counts.conclusions > 20 && sim.counts.reposts > 20, "the run exercised controls and re-posts");
    assert.ok(sim.counts.indexChecks > sim.counts.checks && sim.counts.overlayChecks > 100, "the live indexes were checked against scans, overlays included");
  });

  test("a snapshot restored at any point (full or structure decode) plus the tail folds to the whole fold", () => {
    const whole: Projection = sim.real.projection();
    const rnd = rng(7);
    const cuts = [1, Math.floor(sim.log.length / 2), ...Array.from({ length: 3 }, () => 1 + Math.floor(rnd() * (sim.log.length - 1)))];
    for (const [i, cut] of cuts.entries()) {
      const first = new Reducer();
      first.apply(sim.log.slice(0, cut));
      const restored = restoreSnapshot(encodeSnapshot(first.projection()), cut, { validate: i % 2 === 0 ? "structure" : "full" });
      // Asked before the tail is folded, so the tail's fold keeps the restored maps' indexes in step.
      const before = restored.session(S)!;
      nextStep({ session: before, limits: LIMITS, now: T0, busy: false });
      restored.apply(sim.log.slice(cut));
      assert.deepEqual(restored.projection(), whole, `snapshot at event ${cut} + tail`);
      const after = restored.session(S)!;
      for (const busy of [false, true]) {
        assert.deepEqual(nextStep({ session: after, limits: LIMITS, now: T0, busy }), nextStep({ session: scanOnly(whole.sessions.get(S)!), limits: LIMITS, now: T0, busy }), `snapshot at event ${cut} + tail: the restored projection's indexes decide differently from a scan`);
      }
    }
    assert.deepEqual(reduce(sim.log), whole, "a fresh fold of the whole log");
  });

  // A kept turn must never name cells that were dropped: if turns and cells were cut separately, its
  // replay (Harness.submit -> resubmit -> admit) would throw "admission context is inconsistent"
  // instead of answering the original receipt.
  test("every accepted round the projection keeps can still be re-submitted as a replay (Harness.submit)", () => {
    const s = sim.s;
    const failures: string[] = [];
    let replays = 0;
    for (const t of s.turns.values()) {
      if (t.accepted === null) continue;
      try {
        const out = admit(admissionContext(s, sim.real.headSeq), t.accepted.patch, t.turn);
        if (out.ok && out.receipt.replay && out.receipt.revision === t.accepted.revision) replays++;
        else failures.push(`${t.turn}: ${JSON.stringify(out).slice(0, 160)}`);
      } catch (err) {
        failures.push(`${t.turn}: threw ${(err as Error).message.slice(0, 200)}`);
      }
    }
    assert.deepEqual(failures.slice(0, 3), [], `${failures.length} of ${failures.length + replays} kept accepted rounds do not replay`);
  });
});
