/**
 * What a session does next: the scheduling rules of one run, decided from its projection, the limits
 * and the time, with no effects. The harness's driver performs the step this returns, commits, and
 * asks again (decide, then perform).
 *
 * The order of the rules is the order of `nextStep`:
 *   1. an ended run does nothing; nor does a fork whose copy of its origin is not complete;
 *   2. an operator's cancel ends the run as cancelled, once no cell runs here (`interrupts` stops it);
 *   3. budgets: tokens, wall time, and rounds (only when a new round is wanted) end the run;
 *   4. a paused run only lets a due timer fire: no control note, launch, approval request or model call;
 *   5. an accepted role note not yet handled (cancel, resolution, conclusion) is handled, in cell order;
 *   6. the oldest queued execution is dispatched, unless a cell runs (here or for an earlier worker)
 *      or the queue is paused: an `error`, an UnknownExecution or a denied cell whose observation no
 *      accepted patch has consumed yet. When an approval rule (the run's or the worker's) matches
 *      it, its approval is asked first, and it is dispatched only once approved;
 *   7. the model is called when there is something to decide: no round yet, unread observations, or
 *      a round left open (prepared before a crash);
 *   8. a timer that is due fires (its armed callback also fires it while the loop is busy, e.g. in a
 *      model call, so its observation reaches the next round);
 *   9. otherwise wait: for the running cell, an approval, an unpause, the next timer, the wall-time
 *      budget or the outside world.
 *
 * What cannot wait for the loop (it may be in a model call) is decided by `interrupts`: a cancel
 * stops the running cell and the model call, a pause with `now` stops the running cell.
 *
 * Pure: no I/O, no clock (the time is an argument).
 */
import type { ExecutionRecord, SessionProjection, TimerRecord, TurnRecord } from "./projection.js";
import { isUnresolvedUnknown, pausesQueue } from "./projection.js";
import { describeRule, gateOf, type ApprovalRule } from "./approval.js";
import { observationId, turnId } from "./events.js";
import type { ExecutableCell, NoteCell } from "./schema.js";
import { isExecutable } from "./schema.js";
import { cellIndex, executionIndex } from "./live-index.js";

/** The limits the decisions depend on (a subset of the harness limits). */
export interface StepLimits {
  /** Attempts per model round before the run fails. */
  readonly maxAttemptsPerTurn: number;
  /** Observations delivered to one round at most. */
  readonly deliverPerRound: number;
}

export interface StepInput {
  readonly session: SessionProjection;
  readonly limits: StepLimits;
  /** Milliseconds since the epoch. */
  readonly now: number;
  /** This process has a cell running or being launched (the log may not show it started yet). */
  readonly busy: boolean;
  /** The worker's approval rules, for every run it drives (besides the run's own). */
  readonly approval?: readonly ApprovalRule[];
}

/** Something the session waits for. */
export type WaitFor =
  | { readonly kind: "execution"; readonly cell_id: number }
  | { readonly kind: "timer"; readonly timer_id: string; readonly due: number }
  | { readonly kind: "wall_budget"; readonly due: number }
  | { readonly kind: "approval"; readonly cell_id: number }
  | { readonly kind: "unpause" }
  | { readonly kind: "fork_copy" }
  | { readonly kind: "outside" };

export type ControlAction = "resolve" | "cancel" | "conclude";

/** The one next step of a session. */
export type NextStep =
  /** The run has ended: nothing more to do. */
  | { readonly kind: "ended" }
  /** End the run as a failure (a budget is exhausted). */
  | { readonly kind: "end_run"; readonly result: "failure"; readonly reason: string }
  /** An operator cancelled the run: cancel what is queued or was left started, and end it as cancelled. */
  | { readonly kind: "cancel_run"; readonly reason: string }
  /** This queued execution is next and a rule asks for approval: record that it waits for one. */
  | { readonly kind: "request_approval"; readonly cell: ExecutableCell; readonly execution: ExecutionRecord; readonly rule: string }
  /** Record that this timer fired and deliver its observation. */
  | { readonly kind: "fire_timer"; readonly timer: TimerRecord }
  /** Act on this accepted role note. */
  | { readonly kind: "control"; readonly note: NoteCell; readonly action: ControlAction }
  /** Launch this queued execution. */
  | { readonly kind: "dispatch"; readonly cell: ExecutableCell; readonly execution: ExecutionRecord }
  /**
   * Run a model round for `turn`: when `prepare`, commit `turn_prepared` delivering `delivered`
   * first; otherwise the round is already open (prepared before a crash) and continues.
   */
  | { readonly kind: "round"; readonly turn: string; readonly prepare: boolean; readonly n: number; readonly delivered: readonly string[] }
  /** Nothing to do until something happens; `until` is the earliest known time to look again. */
  | { readonly kind: "wait"; readonly until: number | null; readonly for: readonly WaitFor[] };

/** Decides the next step of a session. See the module comment for the order of the rules. */
export function nextStep(input: StepInput): NextStep {
  const { session: s, now } = input;
  if (s.terminal !== null) return { kind: "ended" };
  if (s.forming !== null) return { kind: "wait", until: null, for: [{ kind: "fork_copy" }] };
  if (s.cancel_requested !== null) {
    if (!input.busy) return { kind: "cancel_run", reason: s.cancel_requested.reason };
    return wait(s);
  }
  const ended = budgetExhausted(s, now);
  if (ended !== null) return { kind: "end_run", result: "failure", reason: ended };
  if (s.paused !== null) {
    const due = dueTimers(s, now)[0];
    return due !== undefined ? { kind: "fire_timer", timer: due } : wait(s);
  }
  const control = nextControl(s);
  if (control !== null) return { kind: "control", ...control };
  if (!input.busy) {
    const next = nextDispatch(s);
    if (next !== null) {
      const approval = next.execution.approval;
      if (approval === null) {
        const rule = gateOf(next.cell, s.approval, input.approval);
        if (rule !== null) return { kind: "request_approval", ...next, rule: describeRule(rule) };
        return { kind: "dispatch", ...next };
      }
      if (approval.state === "approved") return { kind: "dispatch", ...next };
      // Waiting for a person: nothing else launches before it (queue order); the model may still act.
    }
  }
  if (wantsRound(s)) {
    if (s.open_turn !== null) return { kind: "round", turn: s.open_turn, prepare: false, n: s.turns.get(s.open_turn)?.n ?? s.turn_count, delivered: [] };
    const n = s.turn_count + 1;
    return { kind: "round", turn: turnId(s.id, n), prepare: true, n, delivered: s.pending.slice(0, input.limits.deliverPerRound) };
  }
  const due = dueTimers(s, now)[0];
  if (due !== undefined) return { kind: "fire_timer", timer: due };
  return wait(s);
}

/** A new or open model round is wanted: none yet, unread observations, or one left open. */
export function wantsRound(s: SessionProjection): boolean {
  if (s.terminal !== null || s.paused !== null || s.forming !== null || s.cancel_requested !== null) return false;
  if (s.open_turn !== null) return true;
  if (s.turn_count === 0) return true;
  return s.pending.length > 0;
}

/** The instant (ms) the wall-time budget runs out, or null without one. */
export function wallDeadline(s: SessionProjection): number | null {
  const max = s.budgets.max_wall_seconds;
  return max === undefined ? null : Date.parse(s.created_at) + max * 1000;
}

/**
 * Why the run must end now for a budget, or null. A round still open (prepared before a crash) may
 * finish; only a new one is over the round budget.
 */
export function budgetExhausted(s: SessionProjection, now: number): string | null {
  const b = s.budgets;
  const u = s.state.runtime.usage;
  if (b.max_rounds !== undefined && s.turn_count >= b.max_rounds && s.open_turn === null && wantsRound(s)) {
    return `the round budget of ${b.max_rounds} is exhausted`;
  }
  if (b.max_tokens !== undefined && u.input_tokens + u.output_tokens >= b.max_tokens) {
    return `the token budget of ${b.max_tokens} is exhausted (${u.input_tokens + u.output_tokens} used)`;
  }
  if (b.max_wall_seconds !== undefined && (now - Date.parse(s.created_at)) / 1000 >= b.max_wall_seconds) {
    return `the wall-time budget of ${b.max_wall_seconds} s is exhausted`;
  }
  return null;
}

/** Registered timers not fired whose time has come, earliest first. */
export function dueTimers(s: SessionProjection, now: number): TimerRecord[] {
  return [...s.timers.values()].filter((t) => !t.fired && Date.parse(t.due_at) <= now).sort((a, b) => Date.parse(a.due_at) - Date.parse(b.due_at));
}

/** The first accepted role note (in cell order) that no `control_handled` event answers yet. */
export function nextControl(s: SessionProjection): { note: NoteCell; action: ControlAction } | null {
  const index = cellIndex(s.cells);
  if (index !== null) {
    // Most runs have no role note waiting: say so without looking at the run's whole history.
    let waiting = false;
    for (const id of index.roleNotes) {
      if (!s.controls.has(id)) {
        waiting = true;
        break;
      }
    }
    if (!waiting) return null;
  }
  for (const cell of s.cells.values()) {
    if (cell.kind !== "note" || cell.role === undefined || s.controls.has(cell.id)) continue;
    return { note: cell, action: cell.role === "resolution" ? "resolve" : cell.role === "cancel" ? "cancel" : "conclude" };
  }
  return null;
}

/**
 * What must stop now, without waiting for the driver's loop (it may be in a model call): with an
 * operator's cancel, the cell running in this process (`running`) and the model call; with a pause
 * `now`, the running cell. Pure, like nextStep; the driver asks on every wake-up.
 */
export function interrupts(s: SessionProjection, running: number | null): { readonly stopCell: { readonly cell_id: number; readonly as: "pause" | "cancel" } | null; readonly abortModel: boolean } {
  if (s.terminal !== null) return { stopCell: null, abortModel: false };
  if (s.cancel_requested !== null) return { stopCell: running === null ? null : { cell_id: running, as: "cancel" }, abortModel: true };
  if (s.paused?.now === true && running !== null) return { stopCell: { cell_id: running, as: "pause" }, abortModel: false };
  return { stopCell: null, abortModel: false };
}

/** The queued execution waiting for a person's approval, if any (at most one: approval is asked of the next to launch). */
export function awaitingApproval(s: SessionProjection): ExecutionRecord[] {
  const out: ExecutionRecord[] = [];
  for (const ex of unfinished(s)) if (ex.phase === "queued" && ex.approval?.state === "waiting") out.push(ex);
  return out;
}

/** The finished `error`, UnknownExecution or denied cell whose observation no accepted patch consumed yet: the queue waits for the model to see it. */
export function pausedBy(s: SessionProjection): ExecutionRecord | null {
  const index = executionIndex(s.executions);
  if (index !== null) {
    let paused = false;
    for (const id of index.troubled) {
      if (!s.consumed.has(observationId.execution(id))) {
        paused = true;
        break;
      }
    }
    if (!paused) return null;
  }
  for (const ex of s.executions.values()) {
    if (!pausesQueue(ex)) continue;
    if (!s.consumed.has(observationId.execution(ex.cell_id))) return ex;
  }
  return null;
}

/**
 * The execution to launch next, or null: the oldest queued one (by the seq of its `execution_queued`
 * event), one at a time, never while one is started (ours or an earlier worker's, which recovery
 * handles) and never while the queue is paused. Throws when the log names a queued execution without
 * an executable cell (a corrupt projection).
 */
export function nextDispatch(s: SessionProjection): { cell: ExecutableCell; execution: ExecutionRecord } | null {
  let next: ExecutionRecord | null = null;
  for (const ex of unfinished(s)) {
    if (ex.phase === "started") return null;
    if (ex.phase === "queued" && (next === null || ex.queued_seq < next.queued_seq)) next = ex;
  }
  if (next === null || pausedBy(s) !== null) return null;
  const cell = s.cells.get(next.cell_id);
  if (cell === undefined || !isExecutable(cell)) throw new Error(`queued execution ${next.cell_id} has no executable cell`);
  return { cell, execution: next };
}

/**
 * The session's executions that are queued or started, in map order (every execution when the map
 * has no index: speculate.ts's overlay). Callers still check each one's phase.
 */
export function unfinished(s: SessionProjection): Iterable<ExecutionRecord> {
  const index = executionIndex(s.executions);
  if (index === null) return s.executions.values();
  const out: ExecutionRecord[] = [];
  for (const id of index.unfinished) {
    const ex = s.executions.get(id);
    if (ex !== undefined) out.push(ex);
  }
  return out;
}

/** The mechanical conditions a success conclusion needs, as sentences (empty: none blocks it). */
export function successBlockers(s: SessionProjection): string[] {
  const out: string[] = [];
  const pending = [...s.executions.values()].filter((e) => e.phase !== "finished").map((e) => e.cell_id);
  if (pending.length > 0) out.push(`cells ${pending.join(", ")} have not finished`);
  const unknown = [...s.executions.values()].filter(isUnresolvedUnknown).map((e) => e.cell_id);
  if (unknown.length > 0) out.push(`the UnknownExecution of cells ${unknown.join(", ")} is unresolved`);
  if (s.pending.length > 0) out.push(`${s.pending.length} observation(s) are unread`);
  return out;
}

/** What a session with nothing to do now waits for, and the earliest time to look again. */
function wait(s: SessionProjection): NextStep {
  const waits: WaitFor[] = [];
  for (const ex of unfinished(s)) {
    if (ex.phase === "started") waits.push({ kind: "execution", cell_id: ex.cell_id });
    else if (ex.phase === "queued") waits.push(ex.approval?.state === "waiting" ? { kind: "approval", cell_id: ex.cell_id } : { kind: "execution", cell_id: ex.cell_id });
  }
  if (s.paused !== null) waits.push({ kind: "unpause" });
  for (const t of s.timers.values()) if (!t.fired) waits.push({ kind: "timer", timer_id: t.timer_id, due: Date.parse(t.due_at) });
  const wall = wallDeadline(s);
  if (wall !== null) waits.push({ kind: "wall_budget", due: wall });
  if (waits.length === 0) waits.push({ kind: "outside" });
  let until: number | null = null;
  for (const w of waits) if ((w.kind === "timer" || w.kind === "wall_budget") && (until === null || w.due < until)) until = w.due;
  return { kind: "wait", until, for: waits };
}

/** What the round loop does next for an open turn. */
export type AttemptStep =
  /** The turn was accepted (or the run ended): the round is over. */
  | { readonly kind: "done" }
  /** A complete response was committed (before a crash, or just now): admit it without calling the model. */
  | { readonly kind: "admit"; readonly attempt: number; readonly patch: unknown }
  /** Call the model for this attempt, telling it why the last patch was refused, if one was. */
  | { readonly kind: "call"; readonly attempt: number; readonly rejection: { readonly code: string; readonly reason: string; readonly patch: unknown } | null }
  /** The attempts are spent: end the run. */
  | { readonly kind: "give_up"; readonly reason: string };

/** Decides the next attempt of round `t`. */
export function nextAttempt(s: SessionProjection, t: TurnRecord, limits: StepLimits): AttemptStep {
  if (s.terminal !== null || t.accepted !== null) return { kind: "done" };
  if (t.response !== null) return { kind: "admit", attempt: t.response.attempt, patch: t.response.patch };
  const attempt = t.attempts + 1;
  // Refused patches and unusable answers count toward the limit; transport failures do not (the
  // retry budget bounds those, and a spent budget parks the run instead of ending it).
  if (t.rejections.length + t.model_failures >= limits.maxAttemptsPerTurn) {
    return { kind: "give_up", reason: `the model gave no admissible patch in ${limits.maxAttemptsPerTurn} attempts for round ${t.turn}` };
  }
  const last = t.rejections[t.rejections.length - 1];
  return { kind: "call", attempt, rejection: last === undefined ? null : { code: last.code, reason: last.reason, patch: last.patch ?? null } };
}
