/**
 * Properties of nextStep, the session's scheduling rules, against generated projections: no
 * processes, no sleeps. Each property states a rule independently of the implementation (an
 * oracle), so a wrong dispatch order, a missed pause, a premature success or end, or a timer that is
 * never fired fails here.
 *
 * Re-run a failure with FC_SEED=<seed> node --import tsx --test test/state/next-step.test.ts
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import fc from "fast-check";
import { observationId, turnId } from "../../src/state/events.js";
import type { NextStep, StepLimits } from "../../src/state/next-step.js";
import { interrupts, nextAttempt, nextStep, successBlockers } from "../../src/state/next-step.js";
import type { ApprovalRule } from "../../src/state/approval.js";
import type { ExecutionRecord, SessionProjection, TimerRecord, TurnRecord } from "../../src/state/projection.js";
import { isUnresolvedUnknown } from "../../src/state/projection.js";
import type { Cell } from "../../src/state/schema.js";
import { initialState } from "../../src/state/schema.js";
import { execution } from "./helpers.js";

const seed = process.env.FC_SEED === undefined ? undefined : Number(process.env.FC_SEED);
const runs = { numRuns: 400, ...(seed === undefined ? {} : { seed }) };

const CREATED = Date.parse("2026-01-01T00:00:00.000Z");
const S = "s1";

type ExecSpec = {
  kind: "cmd" | "script";
  phase: "queued" | "started" | "finished";
  result: "success" | "error" | "cancelled" | "UnknownExecution";
  /** For a finished error or UnknownExecution: its observation was consumed by an accepted patch. */
  seen: boolean;
  resolved: boolean;
  /** Its approval gate: none asked, waiting, approved, or denied (a denied cell is finished, cancelled). */
  approval: "none" | "waiting" | "approved" | "denied";
  /** Its argv's first word (approval rules match on it). */
  word: "git" | "rm" | "ls";
};
type NoteSpec = { role: "none" | "cancel" | "resolution" | "conclusion"; handled: boolean; result: "success" | "failure" };
type Spec = {
  /** Cells in creation order: an execution or a note. */
  cells: ({ t: "exec"; e: ExecSpec } | { t: "note"; n: NoteSpec })[];
  /** A permutation seed: queued_seq is not the cell order (replacements queue later). */
  seqShuffle: number[];
  timers: { dueOffsetS: number; fired: boolean }[];
  pending: number;
  turnCount: number;
  openTurn: boolean;
  terminal: boolean;
  budgets: { max_rounds?: number; max_tokens?: number; max_wall_seconds?: number };
  usage: number;
  elapsedS: number;
  busy: boolean;
  deliverPerRound: number;
  /** An operator's requests: paused (and whether with --now), cancelled; a fork still being copied. */
  paused: "no" | "yes" | "now";
  cancel: boolean;
  forming: boolean;
  /** The run's approval rules and the worker's. */
  runRules: ApprovalRule[];
  workerRules: ApprovalRule[];
};

const execArb: fc.Arbitrary<ExecSpec> = fc.record({
  kind: fc.constantFrom("cmd" as const, "script" as const),
  phase: fc.constantFrom("queued" as const, "started" as const, "finished" as const, "finished" as const),
  result: fc.constantFrom("success" as const, "error" as const, "cancelled" as const, "UnknownExecution" as const),
  seen: fc.boolean(),
  resolved: fc.boolean(),
  approval: fc.constantFrom("none" as const, "none" as const, "waiting" as const, "approved" as const, "denied" as const),
  word: fc.constantFrom("git" as const, "rm" as const, "ls" as const),
});
const ruleArb: fc.Arbitrary<ApprovalRule> = fc.oneof(
  fc.constant<ApprovalRule>({ kind: "all" }),
  fc.constant<ApprovalRule>({ kind: "script" }),
  fc.constantFrom("git", "rm").map((w): ApprovalRule => ({ kind: "argv", prefix: [w] })),
  fc.constantFrom("rm *", "git push*", "*x*").map((p): ApprovalRule => ({ kind: "glob", pattern: p })),
);
const noteArb: fc.Arbitrary<NoteSpec> = fc.record({
  role: fc.constantFrom("none" as const, "none" as const, "cancel" as const, "resolution" as const, "conclusion" as const),
  handled: fc.boolean(),
  result: fc.constantFrom("success" as const, "failure" as const),
});
const specArb: fc.Arbitrary<Spec> = fc.record({
  cells: fc.array(fc.oneof(fc.record({ t: fc.constant("exec" as const), e: execArb }), fc.record({ t: fc.constant("note" as const), n: noteArb })), { maxLength: 8 }),
  seqShuffle: fc.array(fc.nat(1000), { minLength: 8, maxLength: 8 }),
  timers: fc.array(fc.record({ dueOffsetS: fc.integer({ min: -600, max: 600 }), fired: fc.boolean() }), { maxLength: 3 }),
  pending: fc.nat(5),
  turnCount: fc.nat(6),
  openTurn: fc.boolean(),
  terminal: fc.boolean(),
  budgets: fc.record({ max_rounds: fc.integer({ min: 1, max: 8 }), max_tokens: fc.integer({ min: 1, max: 5000 }), max_wall_seconds: fc.integer({ min: 1, max: 4000 }) }, { requiredKeys: [] }),
  usage: fc.nat(6000),
  elapsedS: fc.nat(5000),
  busy: fc.boolean(),
  deliverPerRound: fc.integer({ min: 1, max: 4 }),
  paused: fc.constantFrom("no" as const, "no" as const, "no" as const, "yes" as const, "now" as const),
  cancel: fc.nat(5).map((x) => x === 0),
  forming: fc.nat(8).map((x) => x === 0),
  runRules: fc.array(ruleArb, { maxLength: 2 }),
  workerRules: fc.array(ruleArb, { maxLength: 1 }),
});

/** The projection a spec describes (only the fields the scheduling rules read are meaningful). */
function projectionOf(spec: Spec): { s: SessionProjection; now: number } {
  const now = CREATED + spec.elapsedS * 1000;
  const cells = new Map<number, Cell>();
  const executions = new Map<number, ExecutionRecord>();
  const consumed = new Set<string>();
  const controls = new Map<number, { note_id: number; role: "cancel" | "resolution" | "conclusion"; outcome: string; detail: string }>();
  spec.cells.forEach((c, i) => {
    const id = i + 1;
    if (c.t === "exec") {
      const e = c.e;
      cells.set(id, e.kind === "cmd" ? { id, previous_id: null, kind: "cmd", argv: [e.word, "x"] } : { id, previous_id: null, kind: "script", source: "print(1)" });
      // A denied cell never ran: it is finished, cancelled. A waiting or approved one is queued.
      const phase = e.approval === "denied" ? "finished" : e.approval === "none" ? e.phase : "queued";
      const result = e.approval === "denied" ? "cancelled" : e.result;
      const rec = execution(id, phase, phase === "finished" ? result : null, { kind: e.kind, queued_seq: 10 + spec.seqShuffle[i]! * 8 + i });
      const resolved = phase === "finished" && result === "UnknownExecution" && e.resolved ? { resolved_by: 999 } : {};
      const approval =
        e.approval === "none" ? null : { state: e.approval, rule: "all", requested_at: new Date(CREATED).toISOString(), decided_at: e.approval === "waiting" ? null : new Date(CREATED).toISOString(), reason: null };
      executions.set(id, { ...rec, ...resolved, approval });
      if (phase === "finished" && e.seen) consumed.add(observationId.execution(id));
    } else {
      const n = c.n;
      const role = n.role === "none" ? {} : { role: n.role, ...(n.role === "conclusion" ? { result: n.result } : { target_cell_id: 1 }) };
      cells.set(id, { id, previous_id: null, kind: "note", text: `note ${id}`, ...role } as Cell);
      if (n.role !== "none" && n.handled) controls.set(id, { note_id: id, role: n.role, outcome: "x", detail: "x" });
    }
  });
  const timers = new Map<string, TimerRecord>();
  spec.timers.forEach((t, i) => {
    const id = `t${i}`;
    timers.set(id, { timer_id: id, cell_id: null, due_at: new Date(now + t.dueOffsetS * 1000).toISOString(), note: null, fired: t.fired });
  });
  const turns = new Map<string, TurnRecord>();
  const openTurn = spec.openTurn && spec.turnCount > 0 ? turnId(S, spec.turnCount) : null;
  for (let n = 1; n <= spec.turnCount; n++) {
    const turn = turnId(S, n);
    const open = turn === openTurn;
    turns.set(turn, { turn, n, revision: n, delivered: [], attempts: 0, open_attempt: null, response: null, rejections: [], model_failures: 0, accepted: open ? null : { attempt: 1, patch: [], revision: n, seq: n, new_cell_ids: [], removed_ids: [], consumed: [] } });
  }
  const base = initialState(S, "goal");
  const half = Math.floor(spec.usage / 2);
  const s: SessionProjection = {
    id: S,
    goal: "goal",
    cwd: "/tmp",
    validators: [],
    budgets: spec.budgets,
    ...(spec.runRules.length > 0 ? { approval: spec.runRules } : {}),
    forming: spec.forming ? 3 : null,
    created_at: new Date(CREATED).toISOString(),
    state: { ...base, runtime: { ...base.runtime, usage: { ...base.runtime.usage, input_tokens: half, output_tokens: spec.usage - half } } },
    cells,
    executions,
    observations: new Map(),
    pending: Array.from({ length: spec.pending }, (_, i) => `obs-${i}`),
    delivered: [],
    consumed,
    turns,
    open_turn: openTurn,
    turn_count: spec.turnCount,
    timers,
    controls,
    validators_run: new Map(),
    idle_streak: 0,
    idle_total: 0,
    terminal: spec.terminal ? { result: "failure", reason: "x", at: new Date(CREATED).toISOString() } : null,
    paused: spec.paused === "no" ? null : { reason: "r", at: new Date(CREATED).toISOString(), now: spec.paused === "now", request: "p1" },
    cancel_requested: spec.cancel ? { reason: "c", at: new Date(CREATED).toISOString(), request: "c1" } : null,
    blocked: null,
    refused_posts: [],
    effect_seed: null,
    effects: new Map(),
    last_seq: 100,
  };
  return { s, now };
}

/** `spec` with what comes before dispatch in the rules taken away: not ended, forming, cancelled or paused, no budget, no timer due, every role note handled. */
function quiet(spec: Spec): Spec {
  return {
    ...spec,
    terminal: false,
    forming: false,
    cancel: false,
    paused: "no",
    budgets: {},
    timers: spec.timers.map((t) => ({ ...t, dueOffsetS: Math.abs(t.dueOffsetS) + 1 })),
    cells: spec.cells.map((c) => (c.t === "note" ? { t: "note", n: { ...c.n, handled: true } } : c)),
  };
}

const limitsOf = (spec: Spec): StepLimits => ({ maxAttemptsPerTurn: 3, deliverPerRound: spec.deliverPerRound });
const decide = (spec: Spec): { step: NextStep; s: SessionProjection; now: number } => {
  const { s, now } = projectionOf(spec);
  return { step: nextStep({ session: s, limits: limitsOf(spec), now, busy: spec.busy, approval: spec.workerRules }), s, now };
};
/** No operator's request and no fork in progress: the rules of an ordinary run apply. */
const plain = (spec: Spec): Spec => ({ ...spec, forming: false, cancel: false, paused: "no" });

// ---- oracles, written from the rules, not from the implementation --------------------------------

function budgetOver(s: SessionProjection, now: number): boolean {
  const b = s.budgets;
  const used = s.state.runtime.usage.input_tokens + s.state.runtime.usage.output_tokens;
  // A paused, cancelled or forming run wants no round, so the round budget does not end it.
  const operator = s.paused !== null || s.cancel_requested !== null || s.forming !== null;
  const roundWanted = !operator && s.open_turn === null && (s.turn_count === 0 || s.pending.length > 0);
  return (
    (b.max_rounds !== undefined && s.turn_count >= b.max_rounds && roundWanted) ||
    (b.max_tokens !== undefined && used >= b.max_tokens) ||
    (b.max_wall_seconds !== undefined && now - CREATED >= b.max_wall_seconds * 1000)
  );
}
const dueTimerIds = (s: SessionProjection, now: number) => [...s.timers.values()].filter((t) => !t.fired && Date.parse(t.due_at) <= now);
const unhandledNotes = (s: SessionProjection) => [...s.cells.values()].filter((c) => c.kind === "note" && c.role !== undefined && !s.controls.has(c.id));
const isPaused = (s: SessionProjection) =>
  [...s.executions.values()].some(
    (e) => e.phase === "finished" && (e.result === "error" || e.result === "UnknownExecution" || e.approval?.state === "denied") && !s.consumed.has(observationId.execution(e.cell_id)),
  );
const anyStarted = (s: SessionProjection) => [...s.executions.values()].some((e) => e.phase === "started");
const queuedBySeq = (s: SessionProjection) => [...s.executions.values()].filter((e) => e.phase === "queued").sort((a, b) => a.queued_seq - b.queued_seq);
/** Whether a rule asks for approval of a cell, written from the rules' definitions (approval.ts). */
function ruleAsks(r: ApprovalRule, c: Cell): boolean {
  if (r.kind === "all") return true;
  if (r.kind === "script") return c.kind === "script";
  if (c.kind !== "cmd") return false;
  const line = c.argv.join(" ");
  if (r.kind === "argv") return c.argv[0] === r.prefix[0];
  return r.pattern === "rm *" ? line.startsWith("rm ") : r.pattern === "git push*" ? line.startsWith("git push") : line.includes("x");
}
/** What the queue's head may do now: be dispatched, have its approval asked, or nothing. */
function headOfQueue(s: SessionProjection, spec: Spec): "dispatch" | "request" | null {
  const queue = queuedBySeq(s);
  if (spec.busy || anyStarted(s) || isPaused(s) || queue.length === 0) return null;
  const head = queue[0]!;
  if (head.approval?.state === "waiting") return null;
  if (head.approval?.state === "approved") return "dispatch";
  const cell = s.cells.get(head.cell_id)!;
  return [...spec.runRules, ...spec.workerRules].some((r) => ruleAsks(r, cell)) ? "request" : "dispatch";
}
const roundWanted = (s: SessionProjection) => s.open_turn !== null || s.turn_count === 0 || s.pending.length > 0;

test("an ended run does nothing more", () => {
  fc.assert(
    fc.property(specArb, (spec) => {
      const { step, s } = decide(spec);
      assert.equal(step.kind === "ended", s.terminal !== null);
    }),
    runs,
  );
});

test("budgets: the run ends exactly when a budget is exhausted, before anything else happens", () => {
  fc.assert(
    fc.property(specArb.map(plain), (spec) => {
      const { step, s, now } = decide(spec);
      if (s.terminal !== null) return;
      assert.equal(step.kind === "end_run", budgetOver(s, now), `budget over: ${budgetOver(s, now)}, step ${step.kind}`);
      if (step.kind === "end_run") {
        assert.equal(step.result, "failure");
        assert.match(step.reason, /budget of .* is exhausted/);
      }
    }),
    runs,
  );
});

test("an open round may finish past the round budget; a new one may not start", () => {
  fc.assert(
    fc.property(specArb.map(plain), (spec) => {
      const tight = { ...spec, budgets: { max_rounds: spec.turnCount || 1 }, terminal: false, timers: [], cells: [] };
      const { step, s } = decide(tight);
      if (s.open_turn !== null) assert.deepEqual(step.kind === "round" && step.turn, s.open_turn);
      else if (s.turn_count >= 1 && roundWanted(s)) assert.equal(step.kind, "end_run");
    }),
    runs,
  );
});

test("timers: a due timer fires (the earliest first) when no control, dispatch or round comes first; none fires early", () => {
  fc.assert(
    fc.property(fc.oneof(specArb.map(plain), specArb.map(quiet)).map((spec) => ({ ...spec, terminal: false, budgets: {} })), (spec) => {
      const { step, s, now } = decide(spec);
      const due = dueTimerIds(s, now);
      const before = unhandledNotes(s).length > 0 || headOfQueue(s, spec) !== null || roundWanted(s);
      assert.equal(step.kind === "fire_timer", due.length > 0 && !before, `due ${due.length}, before ${before}, step ${step.kind}`);
      if (step.kind === "fire_timer") {
        assert.ok(!step.timer.fired && Date.parse(step.timer.due_at) <= now, "never a fired or future timer");
        assert.equal(Date.parse(step.timer.due_at), Math.min(...due.map((t) => Date.parse(t.due_at))));
      }
    }),
    runs,
  );
});

test("controls: the first unhandled role note (cell order) is handled before dispatch, rounds and timers", () => {
  fc.assert(
    fc.property(specArb.map((spec) => ({ ...plain(spec), terminal: false, budgets: {} })), (spec) => {
      const { step, s } = decide(spec);
      const notes = unhandledNotes(s);
      assert.equal(step.kind === "control", notes.length > 0);
      if (step.kind === "control") {
        assert.equal(step.note.id, notes[0]!.id);
        const role = notes[0]!.kind === "note" ? notes[0]!.role : undefined;
        assert.equal(step.action, role === "resolution" ? "resolve" : role === "cancel" ? "cancel" : "conclude");
      }
    }),
    runs,
  );
});

test("dispatch: the oldest queued execution, one at a time, never while paused by an unseen error, UnknownExecution or denial, and never before its approval when a rule asks for one", () => {
  fc.assert(
    fc.property(specArb.map(quiet), (spec) => {
      const { step, s } = decide(spec);
      const queue = queuedBySeq(s);
      const head = headOfQueue(s, spec);
      assert.equal(step.kind === "dispatch", head === "dispatch", `head: ${head}, step ${step.kind}`);
      assert.equal(step.kind === "request_approval", head === "request", `head: ${head}, step ${step.kind}`);
      if (step.kind === "dispatch" || step.kind === "request_approval") {
        assert.equal(step.execution.cell_id, queue[0]!.cell_id, "the lowest queued_seq goes first");
        assert.equal(step.cell.id, step.execution.cell_id);
      }
      if (step.kind === "dispatch") assert.notEqual(step.execution.approval?.state, "waiting", "never launched while it waits for a person");
    }),
    runs,
  );
});

test("operator: a fork being copied does nothing; a cancel ends the run once no cell is busy here; a paused run only lets due timers fire", () => {
  fc.assert(
    fc.property(specArb.map((spec) => ({ ...spec, terminal: false })), (spec) => {
      const { step, s, now } = decide(spec);
      if (spec.forming) {
        assert.deepEqual(step, { kind: "wait", until: null, for: [{ kind: "fork_copy" }] });
        return;
      }
      if (spec.cancel) {
        if (spec.busy) assert.equal(step.kind, "wait", "a cancel waits for the cell stopped here");
        else assert.deepEqual(step, { kind: "cancel_run", reason: "c" });
        return;
      }
      if (budgetOver(s, now)) return assert.equal(step.kind, "end_run");
      if (spec.paused !== "no") {
        const due = dueTimerIds(s, now);
        assert.equal(step.kind, due.length > 0 ? "fire_timer" : "wait", `a paused run: ${step.kind}`);
        if (step.kind === "wait") assert.ok(step.for.some((w) => w.kind === "unpause"), "it waits for the unpause");
      }
    }),
    runs,
  );
});

test("interrupts: a cancel stops the cell running here and the model call; a pause with --now stops the running cell; nothing else interrupts", () => {
  fc.assert(
    fc.property(specArb, fc.option(fc.integer({ min: 1, max: 9 }), { nil: null }), (spec, running) => {
      const { s } = projectionOf(spec);
      const i = interrupts(s, running);
      if (s.terminal !== null) return assert.deepEqual(i, { stopCell: null, abortModel: false });
      assert.equal(i.abortModel, spec.cancel);
      const expected = running === null ? null : spec.cancel ? { cell_id: running, as: "cancel" } : spec.paused === "now" ? { cell_id: running, as: "pause" } : null;
      assert.deepEqual(i.stopCell, expected);
    }),
    runs,
  );
});

test("rounds: the model is called only with something to decide, delivering at most deliverPerRound unread observations in order", () => {
  fc.assert(
    fc.property(fc.oneof(specArb, specArb.map(quiet)), (spec) => {
      const { step, s, now } = decide(spec);
      const operator = spec.forming || spec.cancel || spec.paused !== "no";
      if (step.kind !== "round") {
        if (step.kind === "wait" && !operator) assert.ok(!roundWanted(s), "waiting while a round is wanted");
        return;
      }
      assert.ok(!operator, "no model call while paused, cancelled or forming");
      assert.ok(s.terminal === null && !budgetOver(s, now) && roundWanted(s));
      if (s.open_turn !== null) {
        assert.equal(step.turn, s.open_turn);
        assert.equal(step.prepare, false);
      } else {
        assert.equal(step.turn, turnId(S, s.turn_count + 1));
        assert.equal(step.prepare, true);
        assert.deepEqual(step.delivered, s.pending.slice(0, spec.deliverPerRound));
      }
    }),
    runs,
  );
});

test("wait: only when nothing is due, with the earliest timer or budget deadline as the time to look again", () => {
  fc.assert(
    fc.property(fc.oneof(specArb.map(plain), specArb.map(quiet)), (spec) => {
      const { step, s, now } = decide(spec);
      if (step.kind !== "wait") return;
      assert.ok(s.terminal === null && !budgetOver(s, now));
      assert.equal(dueTimerIds(s, now).length, 0);
      assert.equal(unhandledNotes(s).length, 0);
      assert.equal(headOfQueue(s, spec), null, "waiting while a cell could be dispatched or its approval asked");
      const dues = [...s.timers.values()].filter((t) => !t.fired).map((t) => Date.parse(t.due_at));
      if (s.budgets.max_wall_seconds !== undefined) dues.push(CREATED + s.budgets.max_wall_seconds * 1000);
      assert.equal(step.until, dues.length === 0 ? null : Math.min(...dues));
      for (const ex of s.executions.values()) {
        if (ex.phase !== "finished") {
          const kind = ex.phase === "queued" && ex.approval?.state === "waiting" ? "approval" : "execution";
          assert.ok(step.for.some((w) => w.kind === kind && w.cell_id === ex.cell_id), `waits for cell ${ex.cell_id} (${kind})`);
        }
      }
    }),
    runs,
  );
});

test("success blockers: success is refused while a cell has not finished, an UnknownExecution is unresolved or an observation is unread", () => {
  fc.assert(
    fc.property(specArb, (spec) => {
      const { s } = projectionOf(spec);
      const blocked = [...s.executions.values()].some((e) => e.phase !== "finished" || isUnresolvedUnknown(e)) || s.pending.length > 0;
      assert.equal(successBlockers(s).length > 0, blocked);
    }),
    runs,
  );
});

test("a simulated run dispatches in queue order and pauses after every error until the model has seen it", () => {
  // The driver's loop in miniature: perform each step on the projection the way the harness does.
  const resultArb = fc.constantFrom("success" as const, "error" as const, "UnknownExecution" as const);
  fc.assert(
    fc.property(fc.array(fc.record({ kind: fc.constantFrom("cmd" as const, "script" as const), result: resultArb, seq: fc.nat(100) }), { minLength: 1, maxLength: 6 }), (plan) => {
      const spec: Spec = {
        cells: plan.map((p) => ({ t: "exec" as const, e: { kind: p.kind, phase: "queued" as const, result: "success" as const, seen: false, resolved: false, approval: "none" as const, word: "ls" as const } })),
        seqShuffle: [...plan.map((p) => p.seq), 0, 0, 0, 0, 0, 0, 0, 0].slice(0, 8),
        timers: [],
        pending: 0,
        turnCount: 1,
        openTurn: false,
        terminal: false,
        budgets: {},
        usage: 0,
        elapsedS: 0,
        busy: false,
        deliverPerRound: 8,
        paused: "no",
        cancel: false,
        forming: false,
        runRules: [],
        workerRules: [],
      };
      let { s } = projectionOf(spec);
      const expected = [...s.executions.values()].sort((a, b) => a.queued_seq - b.queued_seq).map((e) => e.cell_id);
      const launched: number[] = [];
      for (let i = 0; i < 100; i++) {
        const step = nextStep({ session: s, limits: { maxAttemptsPerTurn: 3, deliverPerRound: 8 }, now: CREATED, busy: false });
        if (step.kind === "wait") break;
        const executions = new Map(s.executions);
        if (step.kind === "dispatch") {
          assert.ok(!isPaused(s), "dispatched while paused");
          launched.push(step.cell.id);
          // It runs and finishes before the next decision; its observation is unread.
          const result = plan[step.cell.id - 1]!.result;
          executions.set(step.cell.id, { ...step.execution, phase: "finished", result });
          s = { ...s, executions, pending: [...s.pending, observationId.execution(step.cell.id)], turn_count: s.turn_count };
        } else if (step.kind === "round") {
          // The model reads everything delivered and decides nothing new.
          const consumed = new Set(s.consumed);
          for (const id of step.delivered) consumed.add(id);
          s = { ...s, consumed, pending: s.pending.filter((id) => !step.delivered.includes(id)), turn_count: s.turn_count + 1 };
        } else {
          assert.fail(`unexpected step ${step.kind}`);
        }
      }
      assert.deepEqual(launched, expected, "every cell ran once, in queue order");
    }),
    runs,
  );
});

test("nextAttempt: a committed response is admitted without a call; refused patches and unusable answers (not transport failures) stop at the limit; the last rejection is passed on", () => {
  const limits = { maxAttemptsPerTurn: 3, deliverPerRound: 8 };
  fc.assert(
    fc.property(fc.nat(5), fc.boolean(), fc.nat(3), fc.boolean(), fc.nat(3), (transport, hasResponse, rejections, accepted, modelFailures) => {
      const attempts = rejections + modelFailures + transport;
      const { s } = projectionOf({ ...emptySpec(), turnCount: 1, openTurn: true });
      const t: TurnRecord = {
        ...s.turns.get(turnId(S, 1))!,
        attempts,
        response: hasResponse ? { attempt: attempts, patch: ["p"] } : null,
        rejections: Array.from({ length: rejections }, (_, i) => ({ attempt: i + 1, code: `c${i}`, reason: `r${i}`, patch: null })),
        model_failures: modelFailures,
        accepted: accepted ? { attempt: 1, patch: [], revision: 1, seq: 1, new_cell_ids: [], removed_ids: [], consumed: [] } : null,
      };
      const a = nextAttempt(s, t, limits);
      if (accepted) return assert.equal(a.kind, "done");
      if (hasResponse) return assert.deepEqual(a, { kind: "admit", attempt: attempts, patch: ["p"] });
      if (rejections + modelFailures >= limits.maxAttemptsPerTurn) return assert.equal(a.kind, "give_up");
      assert.equal(a.kind, "call");
      if (a.kind !== "call") return;
      assert.equal(a.attempt, attempts + 1);
      assert.equal(a.rejection?.code ?? null, rejections === 0 ? null : `c${rejections - 1}`);
    }),
    runs,
  );
});

function emptySpec(): Spec {
  return {
    cells: [], seqShuffle: [0, 0, 0, 0, 0, 0, 0, 0], timers: [], pending: 0, turnCount: 0, openTurn: false, terminal: false, budgets: {}, usage: 0, elapsedS: 0, busy: false, deliverPerRound: 8,
    paused: "no", cancel: false, forming: false, runRules: [], workerRules: [],
  };
}
