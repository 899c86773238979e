/**
 * Projection snapshots: the reducer's whole projection as JSON text, so that opening a database can
 * start from the latest snapshot and fold only the events after it. A snapshot never changes the
 * result: restoring it and folding the tail gives exactly what folding the whole log gives (the
 * conformance suite checks this as a property).
 *
 * Decoding checks the text in one of two ways. `full` validates it against the projection's schema
 * (zod), for a snapshot whose origin is not vouched for. `structure` is for a snapshot whose digest
 * the storage adapter checked on read: that text is exactly what `encodeSnapshot` wrote from a
 * projection this code folded from validated events, so decoding checks the format version, the
 * head, and the shape of every container it turns into a Map or Set, not every field of every
 * record (on a 100,000-event session the full check is about 300 ms of a 450 ms restore). Either
 * way a damaged snapshot is an error, never a silently different projection.
 *
 * Pure: no I/O, no clock.
 */
import { z } from "zod";
import { ApprovalRules } from "./approval.js";
import { Budgets, ForkOrigin } from "./events.js";
import type { Projection, SessionProjection } from "./projection.js";
import { Reducer } from "./reducer.js";
import { Cell, CellId, ExecutionPhase, ExecutionResult, JsonValue, Observation, RunResult, State, UnknownExecution } from "./schema.js";

/** The snapshot format version this code writes and reads. */
export const SNAPSHOT_VERSION = 1;

const Seq = z.number().int().nonnegative();

const Execution = z.strictObject({
  cell_id: CellId,
  kind: z.enum(["script", "cmd"]),
  phase: ExecutionPhase,
  queued_seq: Seq,
  started: z
    .strictObject({
      host: z.string(),
      boot_id: z.string(),
      pid: z.number().int().positive(),
      pgid: z.number().int().positive(),
      start_time: z.string(),
      seq: Seq,
      at: z.string(),
      sandbox: z.enum(["bwrap", "none"]).optional(),
      network: z.enum(["off", "host"]).optional(),
    })
    .nullable(),
  result: ExecutionResult.nullable(),
  exit_code: z.number().int().nullable(),
  signal: z.string().nullable(),
  detail: z.string().nullable(),
  duration_ms: z.number().nonnegative().nullable(),
  output_tail: z.string(),
  output_chunks: z.number().int().nonnegative(),
  output_bytes: z.number().int().nonnegative(),
  dropped_bytes: z.number().int().nonnegative(),
  unknown: UnknownExecution.nullable(),
  resolved_by: CellId.nullable(),
  finished_seq: Seq.nullable(),
  // Optional: snapshots written before approval gates lack it (restored as null).
  approval: z
    .strictObject({ state: z.enum(["waiting", "approved", "denied"]), rule: z.string(), requested_at: z.string(), decided_at: z.string().nullable(), reason: z.string().nullable() })
    .nullable()
    .optional(),
  // Optional: snapshots written before the effect ledger lack them (restored as none).
  effects: z.array(z.strictObject({ name: z.string(), status: z.enum(["begun", "done"]), result: JsonValue.optional() })).optional(),
  effects_omitted: z.number().int().nonnegative().optional(),
});

const EffectEntry = z.strictObject({
  name: z.string(),
  attempts: z.array(z.strictObject({ attempt: z.number().int().positive(), cell_id: CellId, seq: Seq, at: z.string() })),
  ended: z.strictObject({ cell_id: CellId, seq: Seq, at: z.string(), result: JsonValue }).nullable(),
});

const Turn = z.strictObject({
  turn: z.string(),
  n: z.number().int().positive(),
  revision: z.number().int().nonnegative(),
  delivered: z.array(z.string()),
  attempts: z.number().int().nonnegative(),
  open_attempt: z.number().int().positive().nullable(),
  response: z.strictObject({ attempt: z.number().int().positive(), patch: JsonValue }).nullable(),
  rejections: z.array(z.strictObject({ attempt: z.number().int().positive(), code: z.string(), reason: z.string(), patch: JsonValue })),
  model_failures: z.number().int().nonnegative(),
  accepted: z
    .strictObject({
      attempt: z.number().int().positive(),
      patch: JsonValue,
      revision: z.number().int().positive(),
      seq: Seq,
      new_cell_ids: z.array(CellId),
      removed_ids: z.array(CellId),
      consumed: z.array(z.string()),
    })
    .nullable(),
});

const Timer = z.strictObject({ timer_id: z.string(), cell_id: CellId.nullable(), due_at: z.string(), note: z.string().nullable(), fired: z.boolean() });
const Control = z.strictObject({ note_id: CellId, role: z.enum(["cancel", "resolution", "conclusion"]), outcome: z.string(), detail: z.string() });
const ValidatorRun = z.strictObject({ index: z.number().int().nonnegative(), argv: z.array(z.string()), exit_code: z.number().int().nullable(), passed: z.boolean(), output: z.string() });

const entries = <K extends z.ZodType, V extends z.ZodType>(key: K, value: V) => z.array(z.tuple([key, value]));

const Session = z.strictObject({
  id: z.string().min(1),
  goal: z.string().min(1),
  cwd: z.string().min(1),
  validators: z.array(z.array(z.string()).min(1)),
  budgets: Budgets,
  cell_network: z.literal("host").optional(),
  approval: ApprovalRules.optional(),
  fork_of: ForkOrigin.optional(),
  // These three are optional: snapshots written before pause, cancel and fork lack them (restored as null).
  forming: z.number().int().nonnegative().nullable().optional(),
  created_at: z.string(),
  state: State,
  cells: entries(CellId, Cell),
  executions: entries(CellId, Execution),
  observations: entries(z.string(), Observation),
  pending: z.array(z.string()),
  delivered: z.array(z.string()),
  consumed: z.array(z.string()),
  turns: entries(z.string(), Turn),
  open_turn: z.string().nullable(),
  turn_count: z.number().int().nonnegative(),
  timers: entries(z.string(), Timer),
  controls: entries(CellId, Control),
  validators_run: entries(CellId, z.array(ValidatorRun)),
  idle_streak: z.number().int().nonnegative(),
  idle_total: z.number().int().nonnegative(),
  terminal: z.strictObject({ result: RunResult, reason: z.string(), at: z.string() }).nullable(),
  paused: z.strictObject({ reason: z.string(), at: z.string(), now: z.boolean(), request: z.string() }).nullable().optional(),
  cancel_requested: z.strictObject({ reason: z.string(), at: z.string(), request: z.string() }).nullable().optional(),
  blocked: z.strictObject({ cause: z.enum(["auth", "config", "retry_budget"]), reason: z.string(), at: z.string(), turn: z.string() }).nullable(),
  refused_posts: z.array(z.strictObject({ id: z.string(), kind: z.string(), code: z.string(), reason: z.string(), at: z.string() })),
  // Optional: snapshots written before the effect ledger lack them (restored as an empty ledger).
  effect_seed: z.string().nullable().optional(),
  effects: entries(z.string(), EffectEntry).optional(),
  last_seq: Seq,
});

const Snapshot = z.strictObject({
  v: z.literal(SNAPSHOT_VERSION),
  head: Seq,
  order: z.array(z.string()),
  sessions: z.array(Session),
});

/** Thrown when a snapshot's text is not a snapshot this code can restore. */
export class SnapshotInvalid extends Error {
  readonly code = "internal" as const;
  constructor(message: string, options: { cause?: unknown } = {}) {
    super(message, options);
    this.name = "SnapshotInvalid";
  }
}

/** The projection as snapshot text (JSON; maps as entry arrays, in their iteration order). */
export function encodeSnapshot(projection: Projection): string {
  const sessions = projection.order.map((id) => {
    const s = projection.sessions.get(id)!;
    return {
      id: s.id,
      goal: s.goal,
      cwd: s.cwd,
      validators: s.validators,
      budgets: s.budgets,
      cell_network: s.cell_network,
      approval: s.approval,
      fork_of: s.fork_of,
      forming: s.forming,
      created_at: s.created_at,
      state: s.state,
      cells: [...s.cells],
      executions: [...s.executions],
      observations: [...s.observations],
      pending: s.pending,
      delivered: s.delivered,
      consumed: [...s.consumed],
      turns: [...s.turns],
      open_turn: s.open_turn,
      turn_count: s.turn_count,
      timers: [...s.timers],
      controls: [...s.controls],
      validators_run: [...s.validators_run],
      idle_streak: s.idle_streak,
      idle_total: s.idle_total,
      terminal: s.terminal,
      paused: s.paused,
      cancel_requested: s.cancel_requested,
      blocked: s.blocked,
      refused_posts: s.refused_posts,
      effect_seed: s.effect_seed,
      effects: [...s.effects],
      last_seq: s.last_seq,
    };
  });
  return JSON.stringify({ v: SNAPSHOT_VERSION, head: projection.head, order: projection.order, sessions });
}

/** How `restoreSnapshot` checks the text: see the module comment. */
export type SnapshotValidation = "full" | "structure";

const SESSION_ENTRY_FIELDS = ["cells", "executions", "observations", "turns", "timers", "controls", "validators_run"] as const;
const SESSION_ARRAY_FIELDS = ["consumed", "pending", "delivered", "refused_posts", "validators"] as const;

/** The structure check of `structure` decoding: returns what is wrong, or null. */
function structureProblem(parsed: unknown): string | null {
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) return "(root): not an object";
  const p = parsed as Record<string, unknown>;
  if (p["v"] !== SNAPSHOT_VERSION) return `v: format version ${JSON.stringify(p["v"])}, this code reads ${SNAPSHOT_VERSION}`;
  if (!Number.isInteger(p["head"]) || (p["head"] as number) < 0) return "head: not a non-negative integer";
  if (!Array.isArray(p["order"]) || !p["order"].every((id) => typeof id === "string")) return "order: not an array of session ids";
  if (!Array.isArray(p["sessions"])) return "sessions: not an array";
  for (const [i, raw] of (p["sessions"] as unknown[]).entries()) {
    if (raw === null || typeof raw !== "object" || Array.isArray(raw)) return `sessions.${i}: not an object`;
    const s = raw as Record<string, unknown>;
    if (typeof s["id"] !== "string" || s["id"] === "") return `sessions.${i}.id: not a session id`;
    const state = s["state"] as Record<string, unknown> | null;
    if (state === null || typeof state !== "object" || !Array.isArray(state["cells"]) || typeof state["runtime"] !== "object" || state["runtime"] === null) return `sessions.${i}.state: not a State`;
    if (!Number.isInteger(s["last_seq"])) return `sessions.${i}.last_seq: not an integer`;
    for (const f of SESSION_ENTRY_FIELDS) {
      const v = s[f];
      if (!Array.isArray(v) || !v.every((e) => Array.isArray(e) && e.length === 2)) return `sessions.${i}.${f}: not an array of [key, value] entries`;
    }
    for (const f of SESSION_ARRAY_FIELDS) if (!Array.isArray(s[f])) return `sessions.${i}.${f}: not an array`;
    const effects = s["effects"];
    if (effects !== undefined && (!Array.isArray(effects) || !effects.every((e) => Array.isArray(e) && e.length === 2))) return `sessions.${i}.effects: not an array of [key, value] entries`;
  }
  return null;
}

/**
 * Parses snapshot text, checks it (`validate`, default `full`: see the module comment) and returns a
 * Reducer positioned at its head, ready to fold the events after it. `expectedHead` is the seq the
 * storage recorded the snapshot at. Throws SnapshotInvalid, saying what was wrong, for text that is
 * not a valid snapshot at that seq.
 */
export function restoreSnapshot(text: string, expectedHead: number, options: { validate?: SnapshotValidation } = {}): Reducer {
  let parsed: z.infer<typeof Snapshot>;
  try {
    const json = JSON.parse(text) as unknown;
    if (options.validate === "structure") {
      const problem = structureProblem(json);
      if (problem !== null) throw new Error(problem);
      parsed = json as z.infer<typeof Snapshot>;
    } else parsed = Snapshot.parse(json);
  } catch (cause) {
    const why = cause instanceof z.ZodError ? cause.issues.slice(0, 3).map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ") : (cause as Error).message;
    throw new SnapshotInvalid(`the snapshot at seq ${expectedHead} is not a valid projection snapshot (${why})`, { cause });
  }
  if (parsed.head !== expectedHead) throw new SnapshotInvalid(`the snapshot recorded at seq ${expectedHead} says its head is ${parsed.head}`);
  const sessions = new Map<string, SessionProjection>();
  for (const s of parsed.sessions) {
    if (sessions.has(s.id)) throw new SnapshotInvalid(`the snapshot at seq ${expectedHead} holds session ${s.id} twice`);
    // A snapshot from before pause, cancel, fork and approval gates: those fields are null.
    for (const [, ex] of s.executions) if (ex.approval === undefined) (ex as { approval: unknown }).approval = null;
    sessions.set(s.id, {
      ...s,
      forming: s.forming ?? null,
      paused: s.paused ?? null,
      cancel_requested: s.cancel_requested ?? null,
      cells: new Map(s.cells),
      executions: new Map(s.executions.map(([id, ex]) => [id, ex.effects === undefined ? { ...ex, effects: [], effects_omitted: 0 } : ex])),
      effect_seed: s.effect_seed ?? null,
      effects: new Map(s.effects ?? []),
      observations: new Map(s.observations),
      consumed: new Set(s.consumed),
      turns: new Map(s.turns),
      timers: new Map(s.timers),
      controls: new Map(s.controls),
      validators_run: new Map(s.validators_run),
    } as SessionProjection);
  }
  try {
    return Reducer.restore({ head: parsed.head, order: parsed.order, sessions });
  } catch (cause) {
    throw new SnapshotInvalid(`the snapshot at seq ${expectedHead} is inconsistent: ${(cause as Error).message}`, { cause });
  }
}
