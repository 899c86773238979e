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
import { nextAttempt, nextStep, successBlockers } from "../../src/state/next-step.js";
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
};

const execArb: fc.Arbitrary<ExecSpec> = fc.record({
  kind: fc.constantFrom("cmd" as const, "script" as const),
  phase: fc.constantFrom("queued" as const, "started" as const, "finished" as const, "finished" as const),
  result: fc.constantFrom("success" as const, "error" as const, "cancelled" as const, "UnknownExecution" as const),
  seen: fc.boolean(),
  resolved: fc.boolean(),
});
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
      cells.set(id, e.kind === "cmd" ? { id, previous_id: null, kind: "cmd", argv: ["true"] } : { id, previous_id: null, kind: "script", source: "print(1)" });
      const rec = execution(id, e.phase, e.phase === "finished" ? e.result : null, { kind: e.kind, queued_seq: 10 + spec.seqShuffle[i]! * 8 + i });
      const resolved = e.phase === "finished" && e.result === "UnknownExecution" && e.resolved ? { resolved_by: 999 } : {};
      executions.set(id, { ...rec, ...resolved });
      if (e.phase === "finished" && e.seen) consumed.add(observationId.execution(id));
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
    blocked: null,
    refused_posts: [],
    effect_seed: null,
    effects: new Map(),
    last_seq: 100,
  };
  return { s, now };
}

/** `spec` with what comes before dispatch in the rules taken away: not ended, no budget, no timer due, every role note handled. */
function quiet(spec: Spec): Spec {
  return {
    ...spec,
    terminal: false,
    budgets: {},
    timers: spec.timers.map((t) => ({ ...t, dueOffsetS: Math.abs(t.dueOffsetS) + 1 })),
    cells: spec.cells.map((c) => (c.t === "note" ? { t: "note", n: { ...c.n, handled: true } } : c)),
  };
}

const limitsOf = (spec: Spec): StepLimits => ({ maxAttemptsPerTurn: 3, deliverPerRound: spec.deliverPerRound });
const decide = (spec: Spec): { step: NextStep; s: SessionProjection; now: number } => {
  const { s, now } = projectionOf(spec);
  return { step: nextStep({ session: s, limits: limitsOf(spec), now, busy: spec.busy }), s, now };
};

// ---- oracles, written from the rules, not from the implementation --------------------------------

function budgetOver(s: SessionProjection, now: number): boolean {
  const b = s.budgets;
  const used = s.state.runtime.usage.input_tokens + s.state.runtime.usage.output_tokens;
  const roundWanted = s.open_turn === null && (s.turn_count === 0 || s.pending.length > 0);
  return (
    (b.max_rounds !== undefined && s.turn_count >= b.max_rounds && roundWanted) ||
    (b.max_tokens !== undefined && used >= b.max_tokens) ||
    (b.max_wall_seconds !== undefined && now - CREATED >= b.max_wall_seconds * 1000)
  );
}
const dueTimerIds = (s: SessionProjection, now: number) => [...s.timers.values()].filter((t) => !t.fired && Date.parse(t.due_at) <= now);
const unhandledNotes = (s: SessionProjection) => [...s.cells.values()].filter((c) => c.kind === "note" && c.role !== undefined && !s.controls.has(c.id));
const isPaused = (s: SessionProjection) =>
  [...s.executions.values()].some((e) => e.phase === "finished" && (e.result === "error" || e.result === "UnknownExecution") && !s.consumed.has(observationId.execution(e.cell_id)));
const anyStarted = (s: SessionProjection) => [...s.executions.values()].some((e) => e.phase === "started");
const queuedBySeq = (s: SessionProjection) => [...s.executions.values()].filter((e) => e.phase === "queued").sort((a, b) => a.queued_seq - b.queued_seq);
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
    fc.property(specArb, (spec) => {
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
    fc.property(specArb, (spec) => {
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
    fc.property(fc.oneof(specArb, specArb.map(quiet)).map((spec) => ({ ...spec, terminal: false, budgets: {} })), (spec) => {
      const { step, s, now } = decide(spec);
      const due = dueTimerIds(s, now);
      const before = unhandledNotes(s).length > 0 || (!spec.busy && !anyStarted(s) && !isPaused(s) && queuedBySeq(s).length > 0) || roundWanted(s);
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
    fc.property(specArb.map((spec) => ({ ...spec, terminal: false, budgets: {} })), (spec) => {
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

test("dispatch: the oldest queued execution, one at a time, never while paused by an unseen error or UnknownExecution", () => {
  fc.assert(
    fc.property(specArb.map(quiet), (spec) => {
      const { step, s } = decide(spec);
      const queue = queuedBySeq(s);
      const may = !spec.busy && !anyStarted(s) && !isPaused(s) && queue.length > 0;
      assert.equal(step.kind === "dispatch", may, `may dispatch: ${may}, step ${step.kind}`);
      if (step.kind === "dispatch") {
        assert.equal(step.execution.cell_id, queue[0]!.cell_id, "the lowest queued_seq goes first");
        assert.equal(step.cell.id, step.execution.cell_id);
      }
    }),
    runs,
  );
});

test("rounds: the model is called only with something to decide, delivering at most deliverPerRound unread observations in order", () => {
  fc.assert(
    fc.property(fc.oneof(specArb, specArb.map(quiet)), (spec) => {
      const { step, s, now } = decide(spec);
      if (step.kind !== "round") {
        if (step.kind === "wait") assert.ok(!roundWanted(s), "waiting while a round is wanted");
        return;
      }
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
    fc.property(fc.oneof(specArb, specArb.map(quiet)), (spec) => {
      const { step, s, now } = decide(spec);
      if (step.kind !== "wait") return;
      assert.ok(s.terminal === null && !budgetOver(s, now));
      assert.equal(dueTimerIds(s, now).length, 0);
      assert.equal(unhandledNotes(s).length, 0);
      assert.ok(spec.busy || anyStarted(s) || isPaused(s) || queuedBySeq(s).length === 0, "waiting while a cell could be dispatched");
      const dues = [...s.timers.values()].filter((t) => !t.fired).map((t) => Date.parse(t.due_at));
      if (s.budgets.max_wall_seconds !== undefined) dues.push(CREATED + s.budgets.max_wall_seconds * 1000);
      assert.equal(step.until, dues.length === 0 ? null : Math.min(...dues));
      for (const ex of s.executions.values()) {
        if (ex.phase !== "finished") assert.ok(step.for.some((w) => w.kind === "execution" && w.cell_id === ex.cell_id));
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
        cells: plan.map((p) => ({ t: "exec" as const, e: { kind: p.kind, phase: "queued" as const, result: "success" as const, seen: false, resolved: false } })),
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
  return { cells: [], seqShuffle: [0, 0, 0, 0, 0, 0, 0, 0], timers: [], pending: 0, turnCount: 0, openTurn: false, terminal: false, budgets: {}, usage: 0, elapsedS: 0, busy: false, deliverPerRound: 8 };
}
