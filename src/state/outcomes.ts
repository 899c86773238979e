/**
 * The events a session's decisions commit, built in one place: an execution's result and its
 * observation, a control note's outcome, a fired timer, an accepted patch (with the idle rule), and
 * the admission context a patch is judged against.
 *
 * Pure: no I/O, no clock (the time is an argument).
 */
import type { AdmissionContext, Receipt } from "./admission.js";
import { cellEffectNames } from "./effects.js";
import type { EventBody, NewEvent } from "./events.js";
import { event, identity, observationId } from "./events.js";
import type { ExecutionRecord, SessionProjection, TimerRecord, TurnRecord } from "./projection.js";
import type { NoteCell, Observation, UnknownExecution } from "./schema.js";
import { isExecutable } from "./schema.js";
import type { ApprovalRule } from "./approval.js";

type AcceptedRound = AdmissionContext["accepted"] extends ReadonlyMap<string, infer V> ? V : never;

function acceptedRound(t: TurnRecord | undefined): AcceptedRound | undefined {
  const a = t?.accepted;
  if (a === null || a === undefined) return undefined;
  return { patch: a.patch, revision: a.revision, newCellIds: a.new_cell_ids, removedIds: a.removed_ids, consumed: a.consumed };
}

/**
 * The accepted rounds of a session as admission reads them, computed per lookup from the session's
 * turns: building a map of every accepted round on every round would cost the session's age.
 */
class AcceptedRounds implements ReadonlyMap<string, AcceptedRound> {
  constructor(private readonly turns: ReadonlyMap<string, TurnRecord>) {}
  get(turn: string): AcceptedRound | undefined {
    return acceptedRound(this.turns.get(turn));
  }
  has(turn: string): boolean {
    return this.get(turn) !== undefined;
  }
  get size(): number {
    let n = 0;
    for (const t of this.turns.values()) if (t.accepted !== null) n++;
    return n;
  }
  *entries(): MapIterator<[string, AcceptedRound]> {
    for (const [id, t] of this.turns) {
      const a = acceptedRound(t);
      if (a !== undefined) yield [id, a];
    }
  }
  *keys(): MapIterator<string> {
    for (const [id] of this.entries()) yield id;
  }
  *values(): MapIterator<AcceptedRound> {
    for (const [, a] of this.entries()) yield a;
  }
  [Symbol.iterator](): MapIterator<[string, AcceptedRound]> {
    return this.entries();
  }
  forEach(fn: (value: AcceptedRound, key: string, map: ReadonlyMap<string, AcceptedRound>) => void): void {
    for (const [id, a] of this.entries()) fn(a, id, this);
  }
}

/** The admission context of a session: everything `admit` judges a patch against. */
export function admissionContext(s: SessionProjection, headSeq: number): AdmissionContext {
  return { state: s.state, executions: s.executions, cellsEver: s.cells, pendingObservations: s.pending.length, headSeq, accepted: new AcceptedRounds(s.turns) };
}

export type FinishedBody = EventBody<"execution_finished">;

/** The observation that tells the model how an execution ended (with the tail of its output). */
export function executionObservation(body: FinishedBody, at: string, ex: ExecutionRecord | undefined): Observation {
  const payload: Record<string, unknown> = { cell_id: body.cell_id, result: body.result, exit_code: body.exit_code };
  if (body.detail !== null) payload.detail = body.detail;
  if (body.unknown !== null) payload.unknown = body.unknown;
  if (ex !== undefined && ex.output_tail.length > 0) payload.output_tail = ex.output_tail.slice(-2000);
  // The effects the cell declared, as the ledger holds them once it ended: begun and not ended is uncertain.
  if (ex !== undefined && ex.effects.length > 0) {
    payload.effects = ex.effects.map((e) => (e.status === "done" ? { name: e.name, status: "done", result: e.result ?? null } : { name: e.name, status: "uncertain" }));
    if (ex.effects_omitted > 0) payload.effects_omitted = ex.effects_omitted;
  }
  return { id: observationId.execution(body.cell_id), source: "execution", kind: `execution_${body.result}`, at, payload: payload as Observation["payload"] };
}

/**
 * An execution's result; with `observe`, also its observation in the inbox (a cell cancelled before
 * it started is told to the model by the control's observation instead).
 */
export function finishedEvents(s: SessionProjection, body: FinishedBody, at: string, observe = true): NewEvent[] {
  const events: NewEvent[] = [event("execution_finished", s.id, identity.finished(s.id, body.cell_id), at, body)];
  if (observe) {
    const obs = executionObservation(body, at, s.executions.get(body.cell_id));
    events.push(event("inbox_received", s.id, identity.inbox(s.id, obs.id), at, { observation: obs }));
  }
  return events;
}

/** The result of a queued execution cancelled by `noteId` before it was launched. */
export function cancelledBeforeLaunch(cellId: number, noteId: number): FinishedBody {
  return {
    cell_id: cellId,
    result: "cancelled",
    exit_code: null,
    signal: null,
    duration_ms: null,
    output_bytes: 0,
    dropped_bytes: 0,
    detail: `cancelled by note ${noteId} before launch`,
    unknown: null,
  };
}

/**
 * The effect fields of an UnknownExecution for `ex`: the effects it began and never ended (the only
 * ones to reconcile) and those done; none when the cell declared no effect.
 */
function unknownEffects(ex: ExecutionRecord | undefined): Pick<UnknownExecution, "uncertain_effects" | "done_effects"> {
  if (ex === undefined || ex.effects.length === 0) return {};
  const { uncertain, done } = cellEffectNames(ex);
  return { uncertain_effects: uncertain, done_effects: done };
}

/**
 * The UnknownExecution of a `started` execution whose worker was lost before it recorded a result.
 * In a run an operator cancelled (`cancelling`), the result is `cancelled` instead: the run ends,
 * and the detail says the same.
 */
export function lostWorker(ex: ExecutionRecord, stopped: { readonly worker_stopped: boolean; readonly detail: string }, cancelling = false): FinishedBody {
  if (cancelling) {
    return {
      cell_id: ex.cell_id,
      result: "cancelled",
      exit_code: null,
      signal: null,
      duration_ms: null,
      output_bytes: ex.output_bytes,
      dropped_bytes: 0,
      detail: `the run was cancelled; the worker that started this cell stopped before recording its result, and what it did is unknown; ${stopped.detail}`,
      unknown: null,
    };
  }
  return {
    cell_id: ex.cell_id,
    result: "UnknownExecution",
    exit_code: null,
    signal: null,
    duration_ms: null,
    output_bytes: ex.output_bytes,
    dropped_bytes: 0,
    detail: `the worker that started this cell stopped before recording its result; ${stopped.detail}`,
    unknown: {
      type: "UnknownExecution",
      cell_id: ex.cell_id,
      reason: "worker_lost_before_result_commit",
      worker_stopped: stopped.worker_stopped,
      evidence_refs: ex.started === null ? [] : [`event:${ex.started.seq}`],
      ...unknownEffects(ex),
    },
  };
}

/** What a launched process reported when it ended. */
export interface ProcessOutcome {
  readonly result: FinishedBody["result"];
  readonly exit_code: number | null;
  readonly signal: string | null;
  readonly duration_ms: number | null;
  readonly output_bytes: number;
  readonly dropped_bytes: number;
  readonly detail: string | null;
}

/** Who stopped a launched cell: a cancel note, an operator's pause with `now`, an operator's cancel of the run. */
export type StoppedBy = "note" | "pause" | "cancel_run";

/**
 * The result of a launched (or unlaunchable) execution. A cell whose process group a cancel note or
 * a pause with `now` stopped is UnknownExecution (`cancelled_after_launch`, `stopped_by_pause`): what
 * it did before the stop is unknown, and the model must look. One stopped by an operator's cancel of
 * the whole run is `cancelled`: the run ends, and no model will look. `stoppedBy` true means "note".
 */
export function processFinished(s: SessionProjection, cellId: number, outcome: ProcessOutcome, stoppedBy: boolean | StoppedBy | null): FinishedBody {
  const ex = s.executions.get(cellId);
  const started = ex?.started;
  const by: StoppedBy | null = stoppedBy === true ? "note" : stoppedBy === false ? null : stoppedBy;
  if (by === "cancel_run") {
    const why = `stopped by an operator's cancel of the run; what it did before the stop is unknown${outcome.detail !== null ? ` (${outcome.detail})` : ""}`;
    return { cell_id: cellId, result: "cancelled", exit_code: outcome.exit_code, signal: outcome.signal, duration_ms: outcome.duration_ms, output_bytes: outcome.output_bytes, dropped_bytes: outcome.dropped_bytes, detail: why, unknown: null };
  }
  return {
    cell_id: cellId,
    result: by !== null ? "UnknownExecution" : outcome.result,
    exit_code: outcome.exit_code,
    signal: outcome.signal,
    duration_ms: outcome.duration_ms,
    output_bytes: outcome.output_bytes,
    dropped_bytes: outcome.dropped_bytes,
    detail: by === "pause" ? `stopped by an operator's pause with --now${outcome.detail !== null ? ` (${outcome.detail})` : ""}` : outcome.detail,
    unknown:
      by !== null
        ? { type: "UnknownExecution", cell_id: cellId, reason: by === "pause" ? "stopped_by_pause" : "cancelled_after_launch", worker_stopped: true, evidence_refs: started ? [`event:${started.seq}`] : [], ...unknownEffects(ex) }
        : null,
  };
}

export type ControlOutcome = "cancelled" | "stopped" | "already_finished" | "resolved" | "refused" | "concluded";

/** A control note's outcome; with `observe`, also an observation telling the model. `before` events come first in the batch. */
export function controlEvents(s: SessionProjection, note: NoteCell, outcome: ControlOutcome, detail: string, at: string, observe: boolean, before: readonly NewEvent[] = []): NewEvent[] {
  const events: NewEvent[] = [...before, event("control_handled", s.id, identity.control(s.id, note.id), at, { note_id: note.id, role: note.role!, outcome, detail })];
  if (observe) {
    const obs: Observation = { id: observationId.control(note.id), source: "control", kind: `${note.role}_${outcome}`, at, payload: { note_id: note.id, outcome, detail } };
    events.push(event("inbox_received", s.id, identity.inbox(s.id, obs.id), at, { observation: obs }));
  }
  return events;
}

/** The events that record a fired timer and deliver its observation. */
export function timerFiredEvents(s: SessionProjection, t: TimerRecord, now: number, at: string): NewEvent[] {
  const late = Math.max(0, now - Date.parse(t.due_at));
  const obs: Observation = {
    id: observationId.timer(t.timer_id),
    source: "timer",
    kind: "timer_fired",
    at,
    payload: { timer_id: t.timer_id, due_at: t.due_at, late_ms: late, cell_id: t.cell_id, note: t.note },
  };
  return [
    event("timer_fired", s.id, identity.timerFired(s.id, t.timer_id), at, { timer_id: t.timer_id, due_at: t.due_at, late_ms: late }),
    event("inbox_received", s.id, identity.inbox(s.id, obs.id), at, { observation: obs }),
  ];
}

/**
 * The events of an accepted patch: the patch, one `execution_queued` per new executable cell, and
 * the idle rule: a patch that leaves nothing to wait for and decides nothing gets an `invalid_idle`
 * observation, and `maxIdle` of them in a row end the run as a failure.
 */
export function acceptedEvents(s: SessionProjection, turn: string, attempt: number, patch: unknown, r: Receipt, maxIdle: number, at: string): NewEvent[] {
  const events: NewEvent[] = [
    event("patch_accepted", s.id, identity.patch(turn), at, {
      turn,
      attempt,
      patch: toJson(patch),
      revision: r.revision,
      new_cell_ids: r.newCells.map((c) => c.id),
      removed_ids: [...r.removedIds],
      consumed: [...r.consumed],
    }),
  ];
  for (const c of r.newCells) {
    if (isExecutable(c)) events.push(event("execution_queued", s.id, identity.queued(s.id, c.id), at, { cell_id: c.id, kind: c.kind }));
  }
  if (isIdle(s, r)) {
    const n = s.idle_total + 1;
    const obs: Observation = {
      id: observationId.idle(n),
      source: "idle",
      kind: "invalid_idle",
      at,
      payload: {
        message: "Your last patch left no work, no timer and nothing to wait for. Add a cell to run, or conclude with a conclusion note (success or failure).",
        idle_streak: s.idle_streak + 1,
        limit: maxIdle,
      },
    };
    events.push(event("inbox_received", s.id, identity.inbox(s.id, obs.id), at, { observation: obs }));
    if (s.idle_streak + 1 >= maxIdle) {
      events.push(event("run_ended", s.id, identity.terminal(s.id), at, { result: "failure", reason: `the model made ${maxIdle} idle decisions in a row` }));
    }
  }
  return events;
}

/** An accepted patch is idle when it adds no control note or work, and nothing runs, waits or is unread. */
export function isIdle(s: SessionProjection, r: Receipt): boolean {
  const controls = r.newCells.some((c) => c.kind === "note" && c.role !== undefined);
  const work = r.newCells.some(isExecutable) || [...s.executions.values()].some((e) => e.phase !== "finished");
  const timers = [...s.timers.values()].some((t) => !t.fired);
  return !controls && !work && !timers && s.pending.length === 0;
}

/** A model's patch as stored: plain JSON (undefined and functions dropped), so it reads back equal. */
export function toJson(value: unknown): unknown {
  return value === undefined ? null : JSON.parse(JSON.stringify(value));
}

/** The event that begins a run toward `goal`; the goal, cwd, validators and budgets are fixed for its life. */
export function sessionCreated(
  id: string,
  o: {
    readonly goal: string;
    readonly cwd: string;
    readonly validators?: readonly (readonly string[])[];
    readonly budgets?: EventBody<"session_created">["budgets"];
    readonly cellNetwork?: "off" | "host";
    readonly approval?: readonly ApprovalRule[];
    /** 32 hex digits of randomness the run's effect keys derive from (the harness draws it). */
    readonly effectSeed?: string;
  },
  at: string,
): NewEvent {
  return event("session_created", id, identity.session(id), at, {
    goal: o.goal,
    cwd: o.cwd,
    validators: (o.validators ?? []).map((v) => [...v]),
    budgets: o.budgets ?? {},
    ...(o.cellNetwork === "host" ? { cell_network: "host" as const } : {}),
    ...(o.approval !== undefined && o.approval.length > 0 ? { approval: o.approval.map((r) => structuredClone(r)) } : {}),
    ...(o.effectSeed !== undefined ? { effect_seed: o.effectSeed } : {}),
  });
}

/**
 * The first commit an owner (epoch) makes for a session also carries `owner_claimed`, right after
 * `session_created` or before the session's first event, so the log records every change of hands
 * without an extra commit. `folded` says whether an identity was folded by the owner's reducer: enough,
 * since this epoch began at open, after any snapshot that reducer was restored from, so every claim
 * this owner committed was folded by it. Returns `events` itself when nothing is added.
 */
export function withOwnerClaims(events: readonly NewEvent[], folded: (identity: string) => boolean, owner: EventBody<"owner_claimed">): readonly NewEvent[] {
  const claimed = new Set<string>();
  const out: NewEvent[] = [];
  let added = false;
  for (const e of events) {
    const id = identity.owner(e.session, owner.epoch);
    const claim = (): void => {
      claimed.add(e.session);
      added = true;
      out.push(event("owner_claimed", e.session, id, e.at, { ...owner }));
    };
    const pending = !claimed.has(e.session) && !folded(id);
    if (pending && e.kind !== "session_created") claim();
    out.push(e);
    if (pending && e.kind === "session_created") claim();
  }
  return added ? out : events;
}
