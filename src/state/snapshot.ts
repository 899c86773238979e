/**
 * Projection snapshots: the reducer's whole projection as JSON text, so that opening a database can
 * start from the latest snapshot and fold only the events after it. A snapshot never changes the
 * result: restoring it and folding the tail gives exactly what folding the whole log gives (the
 * conformance suite checks this as a property).
 *
 * Decoding validates the text against the projection's schema (a snapshot is read from disk and
 * from the network); the storage adapters additionally check its digest, so a damaged snapshot is an
 * error, never a silently different projection.
 *
 * Pure: no I/O, no clock.
 */
import { z } from "zod";
import { Budgets } from "./events.js";
import type { Projection, SessionProjection } from "./projection.js";
import { Reducer } from "./reducer.js";
import { Cell, CellId, ExecutionPhase, ExecutionResult, JsonValue, Observation, State, UnknownExecution } from "./schema.js";

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
  terminal: z.strictObject({ result: z.enum(["success", "failure"]), reason: z.string(), at: z.string() }).nullable(),
  blocked: z.strictObject({ cause: z.enum(["auth", "config", "retry_budget"]), reason: z.string(), at: z.string(), turn: z.string() }).nullable(),
  refused_posts: z.array(z.strictObject({ id: z.string(), kind: z.string(), code: z.string(), reason: z.string(), at: z.string() })),
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
      blocked: s.blocked,
      refused_posts: s.refused_posts,
      last_seq: s.last_seq,
    };
  });
  return JSON.stringify({ v: SNAPSHOT_VERSION, head: projection.head, order: projection.order, sessions });
}

/**
 * Parses and validates snapshot text and returns a Reducer positioned at its head, ready to fold the
 * events after it. `expectedHead` is the seq the storage recorded the snapshot at. Throws
 * SnapshotInvalid, saying what was wrong, for text that is not a valid snapshot at that seq.
 */
export function restoreSnapshot(text: string, expectedHead: number): Reducer {
  let parsed: z.infer<typeof Snapshot>;
  try {
    parsed = Snapshot.parse(JSON.parse(text));
  } catch (cause) {
    const why = cause instanceof z.ZodError ? cause.issues.slice(0, 3).map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ") : (cause as Error).message;
    throw new SnapshotInvalid(`the snapshot at seq ${expectedHead} is not a valid projection snapshot (${why})`, { cause });
  }
  if (parsed.head !== expectedHead) throw new SnapshotInvalid(`the snapshot recorded at seq ${expectedHead} says its head is ${parsed.head}`);
  const sessions = new Map<string, SessionProjection>();
  for (const s of parsed.sessions) {
    if (sessions.has(s.id)) throw new SnapshotInvalid(`the snapshot at seq ${expectedHead} holds session ${s.id} twice`);
    sessions.set(s.id, {
      ...s,
      cells: new Map(s.cells),
      executions: new Map(s.executions),
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
