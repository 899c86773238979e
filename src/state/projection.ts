/**
 * The projection: what the reducer folds the log into. Types, and the pure view of executions that
 * State shows the model under `runtime.cells`.
 *
 * Pure: no I/O, no clock.
 */
import type { ApprovalRule } from "./approval.js";
import type { CellEffect, EffectRecord } from "./effects.js";
import type { Budgets, ForkOrigin } from "./events.js";
import type { Cell, ExecutionPhase, ExecutionResult, Observation, RunResult, RuntimeCell, State, UnknownExecution } from "./schema.js";

/** How much of an execution's output State shows the model (the tail). The full output is in the log. */
export const OUTPUT_TAIL_CHARS = 4000;

/** UTF-8 length of a string, without encoding it (lone surrogates count 3, as TextEncoder's U+FFFD). */
export function utf8Length(text: string): number {
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < text.length) {
      const d = text.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        n += 4;
        i++;
      } else n += 3;
    } else n += 3;
  }
  return n;
}

/** The process identity recorded when a launch was authorized. */
export interface ProcessIdentity {
  readonly host: string;
  readonly boot_id: string;
  readonly pid: number;
  readonly pgid: number;
  readonly start_time: string;
}

/** Everything known about one execution (one executable cell version). */
export interface ExecutionRecord {
  readonly cell_id: number;
  readonly kind: "script" | "cmd";
  readonly phase: ExecutionPhase;
  /** The seq of the `execution_queued` event: dispatch follows this order. */
  readonly queued_seq: number;
  readonly started: (ProcessIdentity & { readonly seq: number; readonly at: string; readonly sandbox?: "bwrap" | "none"; readonly network?: "off" | "host" }) | null;
  readonly result: ExecutionResult | null;
  readonly exit_code: number | null;
  readonly signal: string | null;
  readonly detail: string | null;
  readonly duration_ms: number | null;
  readonly output_tail: string;
  readonly output_chunks: number;
  readonly output_bytes: number;
  readonly dropped_bytes: number;
  readonly unknown: UnknownExecution | null;
  /** The resolution note that resolved this UnknownExecution, if any. */
  readonly resolved_by: number | null;
  readonly finished_seq: number | null;
  /** Effects this cell began or ended (effects.ts), at most MAX_CELL_EFFECTS, in the order it touched them. */
  readonly effects: readonly CellEffect[];
  /** Effects it touched past MAX_CELL_EFFECTS (counted, not listed). */
  readonly effects_omitted: number;
  /** Its approval gate, when a rule asked for one: waiting, or how a person decided. */
  readonly approval: ApprovalRecord | null;
}

/** A cell's approval: asked when it was next to launch (`rule` says why), then decided by a person. */
export interface ApprovalRecord {
  readonly state: "waiting" | "approved" | "denied";
  readonly rule: string;
  readonly requested_at: string;
  readonly decided_at: string | null;
  readonly reason: string | null;
}

export interface TurnRecord {
  readonly turn: string;
  readonly n: number;
  readonly revision: number;
  readonly delivered: readonly string[];
  readonly attempts: number;
  /** Attempts whose call began but whose outcome (response or failure) was never recorded. */
  readonly open_attempt: number | null;
  /** The complete response committed for this turn and not yet admitted or rejected, if any. */
  readonly response: { readonly attempt: number; readonly patch: unknown } | null;
  readonly rejections: readonly { readonly attempt: number; readonly code: string; readonly reason: string; readonly patch: unknown }[];
  /** Failed attempts that count toward the admissible-patch limit (the model answered unusably, not a transport failure). */
  readonly model_failures: number;
  /** Set once a patch was accepted for this turn. */
  readonly accepted: {
    readonly attempt: number;
    readonly patch: unknown;
    readonly revision: number;
    readonly seq: number;
    /** What the accepted patch did, as its `patch_accepted` event says (echoed in a replayed receipt). */
    readonly new_cell_ids: readonly number[];
    readonly removed_ids: readonly number[];
    readonly consumed: readonly string[];
  } | null;
}

export interface TimerRecord {
  readonly timer_id: string;
  readonly cell_id: number | null;
  readonly due_at: string;
  readonly note: string | null;
  readonly fired: boolean;
}

export interface ValidatorRecord {
  readonly index: number;
  readonly argv: readonly string[];
  readonly exit_code: number | null;
  readonly passed: boolean;
  readonly output: string;
}

export interface ControlRecord {
  readonly note_id: number;
  readonly role: "cancel" | "resolution" | "conclusion";
  readonly outcome: string;
  readonly detail: string;
}

/**
 * A session's projection. Snapshots encode every field (src/state/snapshot.ts, a strict schema): a
 * field added here must be added there, which the snapshot conformance property enforces.
 */
export interface SessionProjection {
  readonly id: string;
  readonly goal: string;
  readonly cwd: string;
  readonly validators: readonly (readonly string[])[];
  readonly budgets: Budgets;
  /** "host" when the run asked for the host's network in its cells. */
  readonly cell_network?: "host";
  /** The run's approval rules (absent: none; a worker may add its own). */
  readonly approval?: readonly ApprovalRule[];
  /** Set for a fork: the run and round it was forked from. */
  readonly fork_of?: ForkOrigin;
  /** While a fork's copy of its origin is being committed: the events copied so far; null otherwise. */
  readonly forming: number | null;
  readonly created_at: string;
  /** The model's State. `runtime.inbox` holds the observations delivered to the open turn. */
  readonly state: State;
  /**
   * Every cell version accepted, by id (immutable; removed cells stay here), less history: once a
   * session has run thousands of cells, the oldest cells that left the context and are no longer
   * needed go (src/state/history.ts keeps the most recent HISTORY_KEEP).
   */
  readonly cells: ReadonlyMap<number, Cell>;
  /** Executions by cell id: every one still pending or uncertain, and the most recent finished ones (history.ts). */
  readonly executions: ReadonlyMap<number, ExecutionRecord>;
  /**
   * Observations received, by id (duplicate detection): every outside one, every one not yet
   * consumed, and the most recent consumed harness observations (history.ts).
   */
  readonly observations: ReadonlyMap<string, Observation>;
  /** Received, not yet delivered to a turn: the unread inbox, in arrival order. */
  readonly pending: readonly string[];
  /** Delivered to a turn, not yet consumed by an accepted patch. */
  readonly delivered: readonly string[];
  /** Observation ids consumed by accepted patches (those of dropped harness history go with it). */
  readonly consumed: ReadonlySet<string>;
  /** Turns by id: the open one and the most recent accepted ones (history.ts). */
  readonly turns: ReadonlyMap<string, TurnRecord>;
  /** The turn prepared and not yet accepted, if any. */
  readonly open_turn: string | null;
  readonly turn_count: number;
  readonly timers: ReadonlyMap<string, TimerRecord>;
  readonly controls: ReadonlyMap<number, ControlRecord>;
  readonly validators_run: ReadonlyMap<number, readonly ValidatorRecord[]>;
  /** Consecutive accepted patches that left nothing to wait for. */
  readonly idle_streak: number;
  readonly idle_total: number;
  readonly terminal: { readonly result: RunResult; readonly reason: string; readonly at: string } | null;
  /** Set while an operator has the run paused (cleared by unpause). */
  readonly paused: { readonly reason: string; readonly at: string; readonly now: boolean; readonly request: string } | null;
  /** Set once an operator cancelled the run; the driver then ends it as cancelled. */
  readonly cancel_requested: { readonly reason: string; readonly at: string; readonly request: string } | null;
  /** Set while the run is parked waiting for an operator (cleared by the next model attempt or the end). */
  readonly blocked: { readonly cause: "auth" | "config" | "retry_budget"; readonly reason: string; readonly at: string; readonly turn: string } | null;
  /**
   * The run's effect keys derive from this (src/harness/effects.ts): the `effect_seed` of its
   * `session_created`, or null for a run created before the ledger existed.
   */
  readonly effect_seed: string | null;
  /** The effect ledger by name (effects.ts): never cut by history. */
  readonly effects: ReadonlyMap<string, EffectRecord>;
  /** Outside observations refused at drain time, oldest first (the last 100). */
  readonly refused_posts: readonly { readonly id: string; readonly kind: string; readonly code: string; readonly reason: string; readonly at: string }[];
  readonly last_seq: number;
}

export interface Projection {
  readonly head: number;
  readonly sessions: ReadonlyMap<string, SessionProjection>;
  /** Session ids in creation order. */
  readonly order: readonly string[];
}

/** The phases of every execution, keyed by cell id. */
export function phasesOf(executions: ReadonlyMap<number, ExecutionRecord>): Map<number, ExecutionPhase> {
  const out = new Map<number, ExecutionPhase>();
  for (const [id, ex] of executions) out.set(id, ex.phase);
  return out;
}

/**
 * A finished execution the model must see before the queue moves on: an `error`, an
 * UnknownExecution, or a cell a person denied (whether it is still unseen is the caller's question).
 */
export function pausesQueue(ex: ExecutionRecord): boolean {
  return ex.phase === "finished" && (ex.result === "error" || ex.result === "UnknownExecution" || ex.approval?.state === "denied");
}

/** An UnknownExecution that no resolution note has resolved yet. */
export function isUnresolvedUnknown(ex: ExecutionRecord): boolean {
  return ex.result === "UnknownExecution" && ex.resolved_by === null;
}

/** The model's view of one execution. */
export function runtimeCellOf(ex: ExecutionRecord): RuntimeCell {
  const out: RuntimeCell = { phase: ex.phase };
  if (ex.result !== null) out.result = ex.result;
  if (ex.phase === "finished") out.exit_code = ex.exit_code;
  if (ex.output_tail.length > 0) out.output = ex.output_tail;
  // Compare bytes with bytes: output_bytes counts UTF-8 bytes, the tail is UTF-16 units (at most 3
  // UTF-8 bytes each), so only a tail that might hold every byte needs counting, without encoding it.
  const tailUnits = ex.output_tail.length;
  if (ex.dropped_bytes > 0 || ex.output_bytes > 3 * tailUnits || (ex.output_bytes > tailUnits && utf8Length(ex.output_tail) < ex.output_bytes)) out.truncated = true;
  if (ex.unknown !== null) out.unknown = ex.unknown;
  if (ex.resolved_by !== null) out.resolved_by = ex.resolved_by;
  if (ex.effects.length > 0) {
    out.effects = ex.effects.map((e) =>
      e.status === "done" ? { name: e.name, status: "done", result: e.result ?? null } : { name: e.name, status: ex.phase === "finished" ? "uncertain" : "begun" },
    );
  }
  if (ex.effects_omitted > 0) out.effects_omitted = ex.effects_omitted;
  return out;
}

/**
 * `runtime.cells`: executions of the cells in context, plus any execution still pending (queued or
 * started) or still uncertain (an unresolved UnknownExecution), even when its cell was removed:
 * removing a cell never hides work or uncertainty from the model.
 */
export function runtimeCellsView(cells: readonly Cell[], executions: ReadonlyMap<number, ExecutionRecord>): Record<string, RuntimeCell> {
  const inContext = new Set(cells.map((c) => c.id));
  const ids = [...executions.keys()].filter((id) => inRuntimeView(executions.get(id)!, inContext.has(id)));
  ids.sort((a, b) => a - b);
  const out: Record<string, RuntimeCell> = {};
  for (const id of ids) out[String(id)] = runtimeCellOf(executions.get(id)!);
  return out;
}

/** Whether an execution belongs in `runtime.cells`: see {@link runtimeCellsView}. */
export function inRuntimeView(ex: ExecutionRecord, inContext: boolean): boolean {
  return inContext || ex.phase !== "finished" || isUnresolvedUnknown(ex);
}

/**
 * `runtimeCellsView` after a change, from the view before it, in time proportional to the view and
 * the change rather than to every execution the session ever ran. `view` must equal
 * `runtimeCellsView(cellsBefore, executionsBefore)`; `touched` names every cell id whose execution
 * changed or that left the context (removed or replaced); `executionOf` answers with the executions
 * after the change. Returns `runtimeCellsView(cells, executionsAfter)` (integer-like keys keep numeric
 * order, so the object is the same in content and in order).
 */
export function updatedRuntimeCellsView(
  view: Readonly<Record<string, RuntimeCell>>,
  cells: readonly Cell[],
  touched: Iterable<number>,
  executionOf: (id: number) => ExecutionRecord | undefined,
): Record<string, RuntimeCell> {
  const out: Record<string, RuntimeCell> = { ...view };
  let inContext: Set<number> | null = null;
  for (const id of touched) {
    const ex = executionOf(id);
    inContext ??= new Set(cells.map((c) => c.id));
    if (ex !== undefined && inRuntimeView(ex, inContext.has(id))) out[String(id)] = runtimeCellOf(ex);
    else delete out[String(id)];
  }
  return out;
}

/** A fresh queued execution record, as admission and the reducer both create it. */
export function queuedExecution(cellId: number, kind: "script" | "cmd", queuedSeq: number): ExecutionRecord {
  return {
    cell_id: cellId,
    kind,
    phase: "queued",
    queued_seq: queuedSeq,
    started: null,
    result: null,
    exit_code: null,
    signal: null,
    detail: null,
    duration_ms: null,
    output_tail: "",
    output_chunks: 0,
    output_bytes: 0,
    dropped_bytes: 0,
    unknown: null,
    resolved_by: null,
    finished_seq: null,
    approval: null,
    effects: [],
    effects_omitted: 0,
  };
}
