/**
 * The reducer: folds the event log into the projection (State, executions and their phases, inbox,
 * timers, usage, terminal result).
 *
 * Pure and deterministic: the same events give the same projection. Rebuilding runs no code, calls
 * no model and touches no file. `Reducer` keeps its own working copy and mutates only that; every
 * State it hands out is a fresh object that later events never change.
 */
import { applyAccepted } from "./apply.js";
import { type EffectRecord, foldBegun, foldEnded, withCellEffect } from "./effects.js";
import { dropHistory, ENDED_HISTORY_KEEP } from "./history.js";
import { setCell, setExecution } from "./live-index.js";
import type { LogEvent } from "./events.js";
import type { ExecutionRecord, Projection, SessionProjection, TurnRecord } from "./projection.js";
import { OUTPUT_TAIL_CHARS, queuedExecution, runtimeCellOf, updatedRuntimeCellsView, utf8Length } from "./projection.js";
import type { Cell, Observation, State } from "./schema.js";
import { initialState } from "./schema.js";

type Mutable<T> = { -readonly [K in keyof T]: T[K] };

interface SessionWork extends Mutable<Omit<SessionProjection, "cells" | "executions" | "observations" | "consumed" | "turns" | "timers" | "controls" | "validators_run" | "pending" | "delivered" | "refused_posts" | "effects">> {
  effects: Map<string, EffectRecord>;
  refused_posts: SessionProjection["refused_posts"][number][];
  cells: Map<number, Cell>;
  executions: Map<number, ExecutionRecord>;
  observations: Map<string, Observation>;
  pending: string[];
  delivered: string[];
  consumed: Set<string>;
  turns: Map<string, TurnRecord>;
  timers: Map<string, SessionProjection["timers"] extends ReadonlyMap<string, infer T> ? T : never>;
  controls: Map<number, SessionProjection["controls"] extends ReadonlyMap<number, infer T> ? T : never>;
  validators_run: Map<number, SessionProjection["validators_run"] extends ReadonlyMap<number, infer T> ? T : never>;
}

/** Thrown when the log is not a log this reducer can fold (an event for an unknown session, a gap). */
export class LogCorrupt extends Error {
  readonly code = "internal" as const;
  constructor(message: string) {
    super(message);
    this.name = "LogCorrupt";
  }
}


/** Failure classes that say nothing about the model's answer: they do not count toward the admissible-patch limit. */
const TRANSPORT_FAILURES: ReadonlySet<string> = new Set(["transport", "http", "auth", "config"]);

/**
 * How many of the most recent identities the reducer remembers to refuse a repeat (a cheap check
 * for a replayed batch; the storage enforces uniqueness over the whole log). Bounded, so a
 * long-lived owner's memory does not grow with every event it ever folded (about 100 bytes each).
 */
export const RECENT_IDENTITIES = 16_384;

/** Folds events incrementally. `apply` events in seq order; `projection()` reads the result. */
export class Reducer {
  private head = 0;
  private readonly sessions = new Map<string, SessionWork>();
  private readonly order: string[] = [];
  /** The last RECENT_IDENTITIES identities folded by this instance, and their order (a ring). */
  private readonly recent = new Set<string>();
  private readonly ring: (string | undefined)[] = [];
  private ringAt = 0;
  /** Every `owner_claimed` identity folded by this instance (one per session and owner epoch). */
  private readonly claims = new Set<string>();

  /** Folds `events` (in seq order, each after the current head). */
  apply(events: readonly LogEvent[]): void {
    for (const e of events) this.applyOne(e);
  }

  /** The current projection. Maps are live views: copy before holding across `apply` calls. */
  projection(): Projection {
    return { head: this.head, sessions: this.sessions as ReadonlyMap<string, SessionProjection>, order: this.order };
  }

  /**
   * A reducer that continues from a snapshot's projection (see snapshot.ts, which validates it):
   * folding the events after `projection.head` gives what folding the whole log gives. The caller
   * hands over the collections; they must not be used elsewhere afterwards.
   */
  static restore(projection: Projection): Reducer {
    const r = new Reducer();
    r.head = projection.head;
    for (const id of projection.order) {
      const s = projection.sessions.get(id);
      if (s === undefined) throw new LogCorrupt(`snapshot lists session ${id} in its order but does not hold it`);
      r.sessions.set(id, s as SessionWork);
      r.order.push(id);
    }
    if (r.sessions.size !== projection.sessions.size) throw new LogCorrupt("snapshot holds sessions its order does not list");
    return r;
  }

  /**
   * True when an event with `identity` was folded by THIS instance (since its snapshot, when restored
   * from one): exact for `owner_claimed` identities, which is what the owner asks (its epoch began
   * after the snapshot it opened from, so every claim it made was folded here); other identities are
   * remembered only among the most recent RECENT_IDENTITIES. The storage, not this, enforces
   * uniqueness over the whole log.
   */
  folded(identity: string): boolean {
    return this.claims.has(identity) || this.recent.has(identity);
  }

  session(id: string): SessionProjection | undefined {
    return this.sessions.get(id);
  }

  get headSeq(): number {
    return this.head;
  }

  private applyOne(e: LogEvent): void {
    if (e.seq <= this.head) throw new LogCorrupt(`event seq ${e.seq} is not after head ${this.head}`);
    if (this.recent.has(e.identity) || this.claims.has(e.identity)) throw new LogCorrupt(`identity ${e.identity} appears twice in the log (seq ${e.seq})`);
    this.head = e.seq;
    if (e.kind === "owner_claimed") this.claims.add(e.identity);
    const evicted = this.ring[this.ringAt];
    if (evicted !== undefined) this.recent.delete(evicted);
    this.ring[this.ringAt] = e.identity;
    this.recent.add(e.identity);
    this.ringAt = (this.ringAt + 1) % RECENT_IDENTITIES;

    if (e.kind === "session_created") {
      if (this.sessions.has(e.session)) throw new LogCorrupt(`session ${e.session} created twice`);
      this.sessions.set(e.session, newSession(e.session, e.at, e.body, e.seq));
      this.order.push(e.session);
      return;
    }
    const s = this.sessions.get(e.session);
    if (s === undefined) throw new LogCorrupt(`event ${e.identity} (seq ${e.seq}) names unknown session ${e.session}`);
    s.last_seq = e.seq;
    // A fork being copied counts what was copied (the copier resumes after it on a redelivery).
    if (s.forming !== null && e.kind !== "owner_claimed" && e.kind !== "fork_completed") s.forming += 1;

    switch (e.kind) {
      case "inbox_received": {
        const o = e.body.observation;
        s.observations.set(o.id, o);
        s.pending.push(o.id);
        if (o.source === "idle") {
          s.idle_streak += 1;
          s.idle_total += 1;
        }
        return;
      }
      case "turn_prepared": {
        const b = e.body;
        const deliveredSet = new Set(b.delivered);
        s.pending = s.pending.filter((id) => !deliveredSet.has(id));
        s.delivered = [...s.delivered, ...b.delivered.filter((id) => !s.delivered.includes(id))];
        s.turns.set(b.turn, { turn: b.turn, n: b.n, revision: b.revision, delivered: b.delivered, attempts: 0, open_attempt: null, response: null, rejections: [], model_failures: 0, accepted: null });
        s.open_turn = b.turn;
        s.turn_count = Math.max(s.turn_count, b.n);
        s.state = withRuntime(s.state, {
          inbox: s.delivered.map((id) => s.observations.get(id)).filter((o): o is Observation => o !== undefined),
          usage: { ...s.state.runtime.usage, rounds: s.state.runtime.usage.rounds + 1 },
        });
        // A new round: what the run no longer needs beyond the most recent history goes (history.ts).
        dropHistory(s);
        return;
      }
      case "model_attempt": {
        const t = turnOf(s, e.body.turn, e);
        s.turns.set(t.turn, { ...t, attempts: Math.max(t.attempts, e.body.attempt), open_attempt: e.body.attempt });
        s.blocked = null;
        const u = s.state.runtime.usage;
        s.state = withRuntime(s.state, { usage: { ...u, attempts: u.attempts + 1, unknown_usage_attempts: u.unknown_usage_attempts + 1 } });
        return;
      }
      case "model_attempt_failed":
      case "model_response": {
        const t = turnOf(s, e.body.turn, e);
        const response = e.kind === "model_response" ? { attempt: e.body.attempt, patch: e.body.patch } : t.response;
        const counts = e.kind === "model_attempt_failed" && !TRANSPORT_FAILURES.has(e.body.failure ?? "");
        s.turns.set(t.turn, { ...t, open_attempt: null, response, model_failures: t.model_failures + (counts ? 1 : 0) });
        const usage = e.body.usage;
        if (usage !== null) {
          const u = s.state.runtime.usage;
          s.state = withRuntime(s.state, {
            usage: {
              ...u,
              input_tokens: u.input_tokens + usage.input_tokens,
              output_tokens: u.output_tokens + usage.output_tokens,
              unknown_usage_attempts: Math.max(0, u.unknown_usage_attempts - 1),
            },
          });
        }
        return;
      }
      case "patch_rejected": {
        const t = turnOf(s, e.body.turn, e);
        s.turns.set(t.turn, { ...t, response: null, rejections: [...t.rejections, { attempt: e.body.attempt, code: e.body.code, reason: e.body.reason, patch: t.response?.patch ?? null }] });
        return;
      }
      case "patch_accepted": {
        const b = e.body;
        const t = turnOf(s, b.turn, e);
        let applied: ReturnType<typeof applyAccepted>;
        try {
          applied = applyAccepted(s.state, s.executions, b.patch, b.consumed);
        } catch (err) {
          throw new LogCorrupt(`patch ${e.identity} (seq ${e.seq}) cannot be folded: ${err instanceof Error ? err.message : String(err)}`);
        }
        if (applied.state.revision !== b.revision) {
          throw new LogCorrupt(`patch ${e.identity} folds to revision ${applied.state.revision}, the log says ${b.revision}`);
        }
        for (const c of applied.newCells) setCell(s.cells, c);
        // New executions get their queued_seq from their own execution_queued events; the rest of
        // the change (a resolution's target) is merged into the working map.
        for (const [id, ex] of applied.changed) if (s.executions.has(id) || ex.phase !== "queued") setExecution(s.executions, id, ex);
        s.state = applied.state;
        for (const id of b.consumed) s.consumed.add(id);
        const consumedSet = new Set(b.consumed);
        s.delivered = s.delivered.filter((id) => !consumedSet.has(id));
        s.turns.set(t.turn, { ...t, response: null, accepted: { attempt: b.attempt, patch: b.patch, revision: b.revision, seq: e.seq, new_cell_ids: [...b.new_cell_ids], removed_ids: [...b.removed_ids], consumed: [...b.consumed] } });
        if (s.open_turn === b.turn) s.open_turn = null;
        return;
      }
      case "execution_queued": {
        setExecution(s.executions, e.body.cell_id, queuedExecution(e.body.cell_id, e.body.kind, e.seq));
        s.idle_streak = 0;
        refreshView(s, e.body.cell_id);
        return;
      }
      case "execution_started": {
        const ex = executionOf(s, e.body.cell_id, e);
        const { cell_id: _cell, ...identity } = e.body;
        setExecution(s.executions, ex.cell_id, { ...ex, phase: "started", started: { ...identity, seq: e.seq, at: e.at } });
        refreshOne(s, ex.cell_id);
        return;
      }
      case "execution_output": {
        const ex = executionOf(s, e.body.cell_id, e);
        const tail = (ex.output_tail + e.body.data).slice(-OUTPUT_TAIL_CHARS);
        setExecution(s.executions, ex.cell_id, {
          ...ex,
          output_tail: tail,
          output_chunks: ex.output_chunks + 1,
          output_bytes: ex.output_bytes + utf8Length(e.body.data),
        });
        refreshOne(s, ex.cell_id);
        return;
      }
      case "execution_finished": {
        const ex = executionOf(s, e.body.cell_id, e);
        const b = e.body;
        setExecution(s.executions, ex.cell_id, {
          ...ex,
          phase: "finished",
          result: b.result,
          exit_code: b.exit_code,
          signal: b.signal,
          detail: b.detail,
          duration_ms: b.duration_ms,
          output_bytes: Math.max(ex.output_bytes, b.output_bytes),
          dropped_bytes: b.dropped_bytes,
          unknown: b.unknown,
          finished_seq: e.seq,
        });
        refreshView(s, ex.cell_id);
        return;
      }
      case "timer_registered": {
        const b = e.body;
        s.timers.set(b.timer_id, { timer_id: b.timer_id, cell_id: b.cell_id, due_at: b.due_at, note: b.note, fired: false });
        s.idle_streak = 0;
        return;
      }
      case "timer_fired": {
        const t = s.timers.get(e.body.timer_id);
        if (t === undefined) throw new LogCorrupt(`timer ${e.body.timer_id} fired but was never registered (seq ${e.seq})`);
        s.timers.set(t.timer_id, { ...t, fired: true });
        return;
      }
      case "effect_begun": {
        const b = e.body;
        foldBegun(s.effects, b, e.seq, e.at);
        touchCellEffect(s, b.cell_id, { name: b.name, status: s.effects.get(b.name)!.ended === null ? "begun" : "done", ...doneResult(s.effects.get(b.name)!) });
        return;
      }
      case "effect_ended": {
        const b = e.body;
        for (const cell of foldEnded(s.effects, b, e.seq, e.at)) touchCellEffect(s, cell, { name: b.name, status: "done", result: b.result });
        return;
      }
      case "control_handled": {
        const b = e.body;
        s.controls.set(b.note_id, { note_id: b.note_id, role: b.role, outcome: b.outcome, detail: b.detail });
        s.idle_streak = 0;
        return;
      }
      case "validator_result": {
        const b = e.body;
        const prior = s.validators_run.get(b.note_id) ?? [];
        s.validators_run.set(b.note_id, [...prior, { index: b.index, argv: b.argv, exit_code: b.exit_code, passed: b.passed, output: b.output }]);
        return;
      }
      case "owner_claimed":
        // Who acts on the session from here on: history for `cairn log` and the timeline, no State.
        return;
      case "run_ended": {
        s.terminal = { result: e.body.result, reason: e.body.reason, at: e.at };
        s.blocked = null;
        s.paused = null;
        // The run decides nothing more: keep only the most recent history (history.ts).
        dropHistory(s, ENDED_HISTORY_KEEP);
        return;
      }
      case "run_blocked": {
        turnOf(s, e.body.turn, e);
        s.blocked = { cause: e.body.cause, reason: e.body.reason, at: e.at, turn: e.body.turn };
        return;
      }
      case "run_paused": {
        s.paused = { reason: e.body.reason, at: e.at, now: e.body.now, request: e.body.request };
        return;
      }
      case "run_unpaused": {
        s.paused = null;
        return;
      }
      case "run_cancel_requested": {
        s.cancel_requested ??= { reason: e.body.reason, at: e.at, request: e.body.request };
        return;
      }
      case "approval_requested": {
        const ex = executionOf(s, e.body.cell_id, e);
        if (ex.phase !== "queued") throw new LogCorrupt(`approval asked for cell ${ex.cell_id}, whose execution is ${ex.phase} (seq ${e.seq})`);
        setExecution(s.executions, ex.cell_id, { ...ex, approval: { state: "waiting", rule: e.body.rule, requested_at: e.at, decided_at: null, reason: null } });
        return;
      }
      case "approval_decided": {
        const ex = executionOf(s, e.body.cell_id, e);
        if (ex.approval === null || ex.approval.state !== "waiting") throw new LogCorrupt(`approval of cell ${ex.cell_id} decided, but it was not waiting for one (seq ${e.seq})`);
        setExecution(s.executions, ex.cell_id, { ...ex, approval: { ...ex.approval, state: e.body.decision, decided_at: e.at, reason: e.body.reason === "" ? null : e.body.reason } });
        return;
      }
      case "fork_completed": {
        s.forming = null;
        s.idle_streak = 0;
        return;
      }
      case "post_refused": {
        s.refused_posts.push({ id: e.body.id, kind: e.body.kind, code: e.body.code, reason: e.body.reason, at: e.at });
        if (s.refused_posts.length > 100) s.refused_posts.shift();
        return;
      }
      default: {
        const never: never = e;
        throw new LogCorrupt(`unknown event kind in ${JSON.stringify(never)}`);
      }
    }
  }
}

/** Folds a whole log. */
export function reduce(events: readonly LogEvent[]): Projection {
  const r = new Reducer();
  r.apply(events);
  return r.projection();
}

function newSession(id: string, at: string, body: LogEvent<"session_created">["body"], seq: number): SessionWork {
  return {
    id,
    goal: body.goal,
    cwd: body.cwd,
    validators: body.validators,
    budgets: body.budgets,
    ...(body.cell_network !== undefined ? { cell_network: body.cell_network } : {}),
    ...(body.approval !== undefined && body.approval.length > 0 ? { approval: body.approval } : {}),
    ...(body.fork !== undefined ? { fork_of: body.fork } : {}),
    forming: body.fork !== undefined ? 0 : null,
    created_at: at,
    state: initialState(id, body.goal),
    cells: new Map(),
    executions: new Map(),
    observations: new Map(),
    pending: [],
    delivered: [],
    consumed: new Set(),
    turns: new Map(),
    open_turn: null,
    turn_count: 0,
    timers: new Map(),
    controls: new Map(),
    validators_run: new Map(),
    idle_streak: 0,
    idle_total: 0,
    terminal: null,
    paused: null,
    cancel_requested: null,
    blocked: null,
    refused_posts: [],
    effect_seed: body.effect_seed ?? null,
    effects: new Map(),
    last_seq: seq,
  };
}

/** A done record's result, as a cell's listing carries it. */
function doneResult(r: EffectRecord): { result?: unknown } {
  return r.ended === null ? {} : { result: r.ended.result };
}

/** Lists `effect` under cell `cellId`'s execution (when the projection still holds it) and refreshes its view. */
function touchCellEffect(s: SessionWork, cellId: number, effect: Parameters<typeof withCellEffect>[1]): void {
  const ex = s.executions.get(cellId);
  if (ex === undefined) return; // left history (history.ts): the ledger keeps the truth
  setExecution(s.executions, cellId, withCellEffect(ex, effect));
  refreshView(s, cellId);
}

function withRuntime(state: State, patch: Partial<State["runtime"]>): State {
  return { ...state, runtime: { ...state.runtime, ...patch } };
}

/**
 * Refreshes one execution's entry. Only for an execution that is queued or started: such an entry is
 * always in the view, so this equals `refreshView` (integer-like keys keep numeric order) at O(1).
 */
function refreshOne(s: SessionWork, cellId: number): void {
  const ex = s.executions.get(cellId)!;
  s.state = withRuntime(s.state, { cells: { ...s.state.runtime.cells, [String(cellId)]: runtimeCellOf(ex) } });
}

/** Refreshes one execution's entry, which may enter or leave the view (a finished execution out of context). */
function refreshView(s: SessionWork, cellId: number): void {
  s.state = withRuntime(s.state, { cells: updatedRuntimeCellsView(s.state.runtime.cells, s.state.cells, [cellId], (id) => s.executions.get(id)) });
}

function turnOf(s: SessionWork, turn: string, e: LogEvent): TurnRecord {
  const t = s.turns.get(turn);
  if (t === undefined) throw new LogCorrupt(`event ${e.identity} (seq ${e.seq}) names turn ${turn}, which was never prepared`);
  return t;
}

function executionOf(s: SessionWork, cellId: number, e: LogEvent): ExecutionRecord {
  const ex = s.executions.get(cellId);
  if (ex === undefined) throw new LogCorrupt(`event ${e.identity} (seq ${e.seq}) names cell ${cellId}, which has no queued execution`);
  return ex;
}
