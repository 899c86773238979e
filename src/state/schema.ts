/**
 * The State schema, `rio.state/1`: the model's whole context.
 *
 * State is `{schema, id, revision, goal, cells, runtime}`. `cells` are immutable versions the model
 * manages through `step`; `runtime` belongs to the harness and is a projection of the event log.
 * Every object here is strict: an unknown field is refused, never silently dropped.
 *
 * Pure: no I/O, no clock. Imports nothing of ours.
 */
import { z } from "zod";
import { isJsonValue, MAX_JSON_DEPTH } from "./canonical.js";

/** A cell id: a positive integer, allocated consecutively from `runtime.next_cell_id`. */
export const CellId = z.number().int().positive();

const cellBase = {
  id: CellId,
  /** The id of the cell version this one replaced, or null for a new cell. */
  previous_id: CellId.nullable(),
};

/** Roles a note can carry; each asks the harness to act (see ARCHITECTURE.md section 7). */
export const NoteRole = z.enum(["cancel", "resolution", "conclusion"]);
export type NoteRole = z.infer<typeof NoteRole>;

export const ConclusionResult = z.enum(["success", "failure"]);
export type ConclusionResult = z.infer<typeof ConclusionResult>;

/** How a run ended: the model's conclusion (success, failure), or an operator's cancel. */
export const RunResult = z.enum(["success", "failure", "cancelled"]);
export type RunResult = z.infer<typeof RunResult>;

export const NoteCell = z.strictObject({
  ...cellBase,
  kind: z.literal("note"),
  text: z.string().max(65_536),
  role: NoteRole.optional(),
  /** For `cancel` (the cell to cancel) and `resolution` (the cell whose UnknownExecution is resolved). */
  target_cell_id: CellId.optional(),
  /** For `resolution`: references to recorded evidence, `event:<seq>` or `cell:<id>`. */
  evidence_refs: z.array(z.string().min(1).max(200)).max(64).optional(),
  /** For `conclusion`. */
  result: ConclusionResult.optional(),
});
export type NoteCell = z.infer<typeof NoteCell>;

export const ScriptCell = z.strictObject({
  ...cellBase,
  kind: z.literal("script"),
  /** Python source with a PEP 723 `# /// script` block; run in a fresh process. */
  source: z.string().min(1).max(262_144),
});
export type ScriptCell = z.infer<typeof ScriptCell>;

export const CmdCell = z.strictObject({
  ...cellBase,
  kind: z.literal("cmd"),
  /** Run directly, never through a shell. */
  argv: z.array(z.string().max(65_536)).min(1).max(4096),
});
export type CmdCell = z.infer<typeof CmdCell>;

export const Cell = z.discriminatedUnion("kind", [NoteCell, ScriptCell, CmdCell]);
export type Cell = z.infer<typeof Cell>;
export type ExecutableCell = ScriptCell | CmdCell;

export function isExecutable(cell: Cell): cell is ExecutableCell {
  return cell.kind === "script" || cell.kind === "cmd";
}

/**
 * Any plain JSON value (null, boolean, finite number, string, array, plain object), nested at most
 * MAX_JSON_DEPTH levels. Checked by `isJsonValue` rather than a recursive zod union: the union tried
 * each alternative at every node and copied every object, which made it most of the cost of
 * validating an event on write (about 1.6 µs of 2.2 per small observation event). The value is kept as
 * given, own `__proto__` keys included, exactly as the fold and the structure decode keep it.
 */
export const JsonValue: z.ZodType<unknown> = z.custom<unknown>((v) => isJsonValue(v), {
  message: `must be plain JSON (null, a boolean, a finite number, a string, an array or a plain object), nested at most ${MAX_JSON_DEPTH} levels`,
});

/** Phases of an executable cell version (ARCHITECTURE.md section 6). */
export const ExecutionPhase = z.enum(["queued", "started", "finished"]);
export type ExecutionPhase = z.infer<typeof ExecutionPhase>;

export const ExecutionResult = z.enum(["success", "error", "cancelled", "UnknownExecution"]);
export type ExecutionResult = z.infer<typeof ExecutionResult>;

/** The record of uncertainty after a crash or a cancellation after launch. Never re-run. */
export const UnknownExecution = z.strictObject({
  type: z.literal("UnknownExecution"),
  cell_id: CellId,
  reason: z.string().min(1),
  worker_stopped: z.boolean(),
  evidence_refs: z.array(z.string()),
  /**
   * Effects the cell began (`cairn effect begin`) and never ended: the only ones to reconcile with
   * the outside system. Present when the cell began any effect.
   */
  uncertain_effects: z.array(z.string()).optional(),
  /** Effects the cell began or ended that the ledger holds as done: nothing to reconcile there. */
  done_effects: z.array(z.string()).optional(),
});
export type UnknownExecution = z.infer<typeof UnknownExecution>;

/**
 * An effect a cell began or ended (`cairn effect`): `begun` while the cell runs, `uncertain` once it
 * finished without ending it (it may have happened: check outside before doing it again), `done`
 * with the recorded result.
 */
export const CellEffectView = z.strictObject({
  name: z.string(),
  status: z.enum(["begun", "uncertain", "done"]),
  result: JsonValue.optional(),
});
export type CellEffectView = z.infer<typeof CellEffectView>;

/** What the model sees of one execution, under `runtime.cells["<id>"]`. */
export const RuntimeCell = z.strictObject({
  phase: ExecutionPhase,
  result: ExecutionResult.optional(),
  exit_code: z.number().int().nullable().optional(),
  /** The tail of the captured output (stdout and stderr interleaved), bounded. */
  output: z.string().optional(),
  /** True when output was dropped: the limit was reached. Never silent. */
  truncated: z.boolean().optional(),
  unknown: UnknownExecution.optional(),
  /** For an UnknownExecution: the id of the resolution note that resolved it. */
  resolved_by: CellId.optional(),
  /** The effects this cell began or ended, as the ledger holds them now. */
  effects: z.array(CellEffectView).optional(),
  /** How many more effects it touched than are listed. */
  effects_omitted: z.number().int().positive().optional(),
});
export type RuntimeCell = z.infer<typeof RuntimeCell>;

/** Where an observation came from. Harness sources have reserved id prefixes. */
export const ObservationSource = z.enum(["execution", "timer", "control", "idle", "external"]);
export type ObservationSource = z.infer<typeof ObservationSource>;

/** Id prefixes only the harness may use; an outside sender cannot forge them. */
export const RESERVED_OBSERVATION_PREFIXES = ["execution:", "timer:", "control:", "idle:"] as const;


export const Observation = z.strictObject({
  id: z.string().min(1).max(200),
  source: ObservationSource,
  kind: z.string().min(1).max(100),
  at: z.string(),
  payload: JsonValue,
});
export type Observation = z.infer<typeof Observation>;

export const Usage = z.strictObject({
  rounds: z.number().int().nonnegative(),
  attempts: z.number().int().nonnegative(),
  input_tokens: z.number().int().nonnegative(),
  output_tokens: z.number().int().nonnegative(),
  /** Attempts whose usage the provider did not report (a lost or partial response). */
  unknown_usage_attempts: z.number().int().nonnegative(),
});
export type Usage = z.infer<typeof Usage>;

export const Runtime = z.strictObject({
  next_cell_id: CellId,
  /** Executions keyed by cell id (as a string: JSON object keys). */
  cells: z.record(z.string().regex(/^[1-9][0-9]*$/), RuntimeCell),
  /** The observations delivered to the model this round (a fixed snapshot). */
  inbox: z.array(Observation),
  usage: Usage,
});
export type Runtime = z.infer<typeof Runtime>;

export const STATE_SCHEMA = "rio.state/1" as const;

export const State = z.strictObject({
  schema: z.literal(STATE_SCHEMA),
  id: z.string().min(1),
  revision: z.number().int().nonnegative(),
  goal: z.string().min(1),
  cells: z.array(Cell),
  runtime: Runtime,
});
export type State = z.infer<typeof State>;

export function emptyUsage(): Usage {
  return { rounds: 0, attempts: 0, input_tokens: 0, output_tokens: 0, unknown_usage_attempts: 0 };
}

/** The State a session starts from: revision 0, no cells. */
export function initialState(id: string, goal: string): State {
  return {
    schema: STATE_SCHEMA,
    id,
    revision: 0,
    goal,
    cells: [],
    runtime: { next_cell_id: 1, cells: {}, inbox: [], usage: emptyUsage() },
  };
}
