/**
 * The event vocabulary: everything durable is one of these, in one append-only log per database.
 *
 * An event is `{seq, identity, kind, session, at, body}`. `identity` is unique in the database and is
 * built by the functions in `identity` below, which is what makes every harness action idempotent
 * across retries and restarts: the storage refuses a second event with the same identity.
 *
 * Pure: no I/O, no clock (`at` is supplied by the caller).
 */
import { z } from "zod";
import { ApprovalRules } from "./approval.js";
import { EffectName } from "./effects.js";
import { Cell, CellId, ExecutionResult, JsonValue, Observation, RunResult, UnknownExecution } from "./schema.js";

const TurnId = z.string().min(1).max(200);
const TokenUsage = z.strictObject({
  input_tokens: z.number().int().nonnegative(),
  output_tokens: z.number().int().nonnegative(),
});
export type TokenUsage = z.infer<typeof TokenUsage>;

export const Budgets = z.strictObject({
  max_rounds: z.number().int().positive().optional(),
  max_tokens: z.number().int().positive().optional(),
  max_wall_seconds: z.number().positive().optional(),
});
export type Budgets = z.infer<typeof Budgets>;

/** Where a forked run comes from: the run, the round it was forked after, and that round's accepting event. */
export const ForkOrigin = z.strictObject({
  session: z.string().min(1).max(200),
  round: z.number().int().nonnegative(),
  /** The seq of the `patch_accepted` of that round (of `session_created` for round 0). */
  cut_seq: z.number().int().positive(),
  /** The State revision after that round. */
  revision: z.number().int().nonnegative(),
});
export type ForkOrigin = z.infer<typeof ForkOrigin>;

/** An operator's request id (the mailbox message id of a pause, cancel or approval). */
const RequestId = z.string().min(1).max(200);
const Reason = z.string().max(2000);

/** Bodies, one schema per kind. */
export const EventBodies = {
  /** A new session (one run toward one goal). */
  session_created: z.strictObject({
    goal: z.string().min(1),
    cwd: z.string().min(1),
    /** Each validator is an argv, run in `cwd` before a `success` conclusion is accepted. */
    validators: z.array(z.array(z.string()).min(1)),
    budgets: Budgets,
    /** The run asked for the host's network in its cells (`--cell-network host`); absent: none. */
    cell_network: z.literal("host").optional(),
    /** Cells matching any of these rules wait for a person's approval before they run (approval.ts). */
    approval: ApprovalRules.optional(),
    /**
     * Set when this run is a fork of another (`cairn fork`): its State is the origin's after round
     * `round` (the log up to `cut_seq`). Until `fork_completed` the run is being copied and does nothing.
     */
    fork: ForkOrigin.optional(),
    /**
     * 128 random bits (hex) drawn when the run is created: the effect keys of the run and of its
     * forks derive from it (src/harness/effects.ts). Absent in logs older than the effect ledger.
     */
    effect_seed: z.string().regex(/^[0-9a-f]{32}$/).optional(),
  }),
  /** An observation entered the session's inbox (from an execution, a timer, a control note or outside). */
  inbox_received: z.strictObject({ observation: Observation }),
  /** A model round begins: the State revision it sees and the observations delivered to it. */
  turn_prepared: z.strictObject({
    turn: TurnId,
    n: z.number().int().positive(),
    revision: z.number().int().nonnegative(),
    delivered: z.array(z.string()),
  }),
  /** A model call is about to be made. Recorded before the call, so a lost attempt is still counted. */
  model_attempt: z.strictObject({ turn: TurnId, attempt: z.number().int().positive() }),
  /** A model call failed or returned something unusable (no tool call, two, truncated arguments). */
  model_attempt_failed: z.strictObject({
    turn: TurnId,
    attempt: z.number().int().positive(),
    error: z.string(),
    retryable: z.boolean(),
    usage: TokenUsage.nullable(),
    /**
     * The failure's class (ModelError kind: transport, http, auth, config, no_tool_call, ...) when
     * known. Transport and HTTP failures do not count toward a round's admissible-patch limit.
     */
    failure: z.string().max(40).optional(),
    /** The delay before the next attempt, in ms, when one was scheduled (backoff or Retry-After). */
    retry_in_ms: z.number().int().nonnegative().optional(),
  }),
  /**
   * The run is parked: the model cannot be called until an operator fixes something (a refused key,
   * a wrong model name or URL, a provider that kept failing past the retry budget). Not an end:
   * `cairn resume` after the fix continues the round where it was.
   */
  run_blocked: z.strictObject({
    turn: TurnId,
    attempt: z.number().int().positive(),
    cause: z.enum(["auth", "config", "retry_budget"]),
    reason: z.string().max(4000),
  }),
  /** An outside observation the owner refused when it drained the mailbox; the poster sees why. */
  post_refused: z.strictObject({
    id: z.string().max(200),
    kind: z.string().max(100),
    code: z.enum(["ended", "conflict", "forged", "invalid"]),
    reason: z.string().max(2000),
  }),
  /** A complete response, committed before it is admitted. */
  model_response: z.strictObject({
    turn: TurnId,
    attempt: z.number().int().positive(),
    patch: JsonValue,
    usage: TokenUsage.nullable(),
  }),
  /** A patch was admitted: the State moved to `revision`. Folded with the same function admission uses. */
  patch_accepted: z.strictObject({
    turn: TurnId,
    attempt: z.number().int().positive(),
    patch: JsonValue,
    revision: z.number().int().positive(),
    new_cell_ids: z.array(CellId),
    removed_ids: z.array(CellId),
    /** Observation ids consumed by this patch (those delivered to the turn). */
    consumed: z.array(z.string()),
  }),
  patch_rejected: z.strictObject({
    turn: TurnId,
    attempt: z.number().int().positive(),
    code: z.string(),
    reason: z.string(),
  }),
  execution_queued: z.strictObject({ cell_id: CellId, kind: z.enum(["script", "cmd"]) }),
  /** Launch authorized. Committed BEFORE the child may run its code. */
  execution_started: z.strictObject({
    cell_id: CellId,
    host: z.string(),
    boot_id: z.string(),
    pid: z.number().int().positive(),
    pgid: z.number().int().positive(),
    /** The process start time in clock ticks since boot (/proc/PID/stat field 22), as a string. */
    start_time: z.string(),
    /** The boundary it runs in: bubblewrap or none, and its network. Absent in logs older than the sandbox. */
    sandbox: z.enum(["bwrap", "none"]).optional(),
    network: z.enum(["off", "host"]).optional(),
  }),
  execution_output: z.strictObject({
    cell_id: CellId,
    n: z.number().int().nonnegative(),
    stream: z.enum(["stdout", "stderr"]),
    data: z.string(),
  }),
  execution_finished: z.strictObject({
    cell_id: CellId,
    result: ExecutionResult,
    exit_code: z.number().int().nullable(),
    signal: z.string().nullable(),
    duration_ms: z.number().nonnegative().nullable(),
    output_bytes: z.number().int().nonnegative(),
    /** Bytes of output that were dropped because the output limit was reached. */
    dropped_bytes: z.number().int().nonnegative(),
    /** Why it ended that way, in words (a timeout, a missing `uv`, a cancellation). */
    detail: z.string().nullable(),
    unknown: UnknownExecution.nullable(),
  }),
  timer_registered: z.strictObject({
    timer_id: z.string().min(1).max(200),
    cell_id: CellId.nullable(),
    due_at: z.string(),
    note: z.string().max(2000).nullable(),
  }),
  timer_fired: z.strictObject({
    timer_id: z.string().min(1).max(200),
    due_at: z.string(),
    late_ms: z.number().nonnegative(),
  }),
  /**
   * A cell is about to perform effect `name` (`cairn effect begin`): committed before the cell is
   * answered `proceed`. `attempt` counts the begins of the name in the run (a retry of an uncertain
   * effect is attempt 2, ...).
   */
  effect_begun: z.strictObject({
    name: EffectName,
    cell_id: CellId,
    attempt: z.number().int().positive(),
  }),
  /** A cell recorded what effect `name` came to (`cairn effect end`): final; a later begin answers `done`. */
  effect_ended: z.strictObject({
    name: EffectName,
    cell_id: CellId,
    result: JsonValue,
  }),
  /** A role note (cancel, resolution, conclusion) was acted on. */
  control_handled: z.strictObject({
    note_id: CellId,
    role: z.enum(["cancel", "resolution", "conclusion"]),
    outcome: z.enum(["cancelled", "stopped", "already_finished", "resolved", "refused", "concluded"]),
    detail: z.string(),
  }),
  validator_result: z.strictObject({
    note_id: CellId,
    index: z.number().int().nonnegative(),
    argv: z.array(z.string()),
    exit_code: z.number().int().nullable(),
    passed: z.boolean(),
    output: z.string(),
  }),
  /**
   * Ownership changed hands for this session: the first commit an owner (a new epoch) makes for the
   * session carries this event, so the log says who acted from here on (host, process) and since when.
   */
  owner_claimed: z.strictObject({
    epoch: z.number().int().nonnegative(),
    host: z.string(),
    boot_id: z.string(),
    pid: z.number().int().positive(),
  }),
  /** The run is over. A finished run never revives. `cancelled`: an operator cancelled it. */
  run_ended: z.strictObject({
    result: RunResult,
    reason: z.string(),
  }),
  /**
   * An operator paused the run: no model call, no launch, no approval asked until it is unpaused. The
   * running cell finishes, or with `now` is stopped (recorded as UnknownExecution, as a cancel note does).
   */
  run_paused: z.strictObject({ request: RequestId, reason: Reason, now: z.boolean() }),
  run_unpaused: z.strictObject({ request: RequestId, reason: Reason }),
  /**
   * An operator cancelled the run: its running cell is stopped and recorded as cancelled, queued cells
   * are cancelled, no validator runs, and the run ends as `cancelled` (the driver does it next).
   */
  run_cancel_requested: z.strictObject({ request: RequestId, reason: Reason }),
  /** Cell `cell_id` was next to launch and matches an approval rule: it waits for a person's decision. */
  approval_requested: z.strictObject({ cell_id: CellId, rule: z.string().max(5000) }),
  /** A person approved the cell (it may be launched) or denied it (it never runs; the model is told). */
  approval_decided: z.strictObject({ cell_id: CellId, request: RequestId, decision: z.enum(["approved", "denied"]), reason: Reason }),
  /** The fork's copy of its origin is complete: from here it is a run like any other. */
  fork_completed: z.strictObject({ copied: z.number().int().nonnegative() }),
} as const;

export type EventKind = keyof typeof EventBodies;
export const EVENT_KINDS = Object.keys(EventBodies) as EventKind[];
export type EventBody<K extends EventKind> = z.infer<(typeof EventBodies)[K]>;

/** An event as the harness builds it, before the storage assigns `seq`. */
export type NewEvent<K extends EventKind = EventKind> = {
  [P in K]: { identity: string; kind: P; session: string; at: string; body: EventBody<P> };
}[K];

/** An event as read back from the log. */
export type LogEvent<K extends EventKind = EventKind> = NewEvent<K> & { seq: number };

const envelope = {
  identity: z.string().min(1).max(512),
  session: z.string().min(1).max(200),
  at: z.string().min(1),
};

/** The envelope's schema (exported for the test that checks parseNewEvent's hand check against it). */
export const Envelope = z.strictObject({ ...envelope, kind: z.enum(EVENT_KINDS as [EventKind, ...EventKind[]]), body: z.unknown() });

/**
 * Validates one event (without seq). Throws a ZodError naming the bad field. The log is read from
 * disk and from the network, so it is validated, not trusted.
 */
export function parseNewEvent(raw: unknown): NewEvent {
  // The envelope is checked by hand when it is plainly valid (the common case: the harness wrote
  // it): the same rules as Envelope, without a zod parse and a copy. Anything else goes through
  // Envelope, which accepts or refuses it with the ZodError that names the field.
  const env = plainEnvelope(raw) ?? Envelope.parse(raw);
  const body = EventBodies[env.kind].parse(env.body);
  return { identity: env.identity, kind: env.kind, session: env.session, at: env.at, body } as NewEvent;
}

const KINDS: ReadonlySet<string> = new Set(EVENT_KINDS);
const ENVELOPE_KEY_SET: ReadonlySet<string> = new Set(["identity", "kind", "session", "at", "body"]);

/**
 * The envelope's fields, when `raw` is a plain object whose own enumerable keys are exactly the
 * envelope's five and each value is as Envelope requires; else null. Each field is read once: what
 * is returned is what was checked (a getter that answers differently later changes nothing).
 */
function plainEnvelope(raw: unknown): { identity: string; kind: EventKind; session: string; at: string; body: unknown } | null {
  if (typeof raw !== "object" || raw === null || Object.getPrototypeOf(raw) !== Object.prototype) return null;
  const keys = Object.keys(raw);
  if (keys.length !== 5 || !keys.every((k) => ENVELOPE_KEY_SET.has(k))) return null;
  const { identity, kind, session, at, body } = raw as Record<string, unknown>;
  if (typeof identity !== "string" || identity.length < 1 || identity.length > 512) return null;
  if (typeof session !== "string" || session.length < 1 || session.length > 200) return null;
  if (typeof at !== "string" || at.length < 1) return null;
  if (typeof kind !== "string" || !KINDS.has(kind)) return null;
  return { identity, kind: kind as EventKind, session, at, body };
}

/** Validates one stored record as an event. */
export function parseLogEvent(raw: { seq: number; identity: string; kind: string; session: string; at: string; body: unknown }): LogEvent {
  const { seq, ...rest } = raw;
  return { ...parseNewEvent(rest), seq };
}

/** Builds an event with a typed body. */
export function event<K extends EventKind>(kind: K, session: string, identity: string, at: string, body: EventBody<K>): NewEvent<K> {
  return { identity, kind, session, at, body } as NewEvent<K>;
}

/** Identity conventions. Every identity is scoped by session so one database can hold many. */
export const identity = {
  session: (s: string) => `session:${s}`,
  inbox: (s: string, observationId: string) => `inbox:${s}:${observationId}`,
  turn: (turn: string) => `turn:${turn}`,
  attempt: (turn: string, attempt: number) => `attempt:${turn}:${attempt}`,
  attemptFailed: (turn: string, attempt: number) => `attempt_failed:${turn}:${attempt}`,
  response: (turn: string, attempt: number) => `response:${turn}:${attempt}`,
  patch: (turn: string) => `patch:${turn}`,
  rejected: (turn: string, attempt: number) => `rejected:${turn}:${attempt}`,
  queued: (s: string, cell: number) => `queued:${s}:${cell}`,
  execution: (s: string, cell: number) => `execution:${s}:${cell}`,
  output: (s: string, cell: number, n: number) => `output:${s}:${cell}:${n}`,
  finished: (s: string, cell: number) => `finished:${s}:${cell}`,
  timer: (s: string, timerId: string) => `timer:${s}:${timerId}`,
  timerFired: (s: string, timerId: string) => `timer_fired:${s}:${timerId}`,
  control: (s: string, note: number) => `control:${s}:${note}`,
  validator: (s: string, note: number, index: number) => `validator:${s}:${note}:${index}`,
  terminal: (s: string) => `terminal:${s}`,
  owner: (s: string, epoch: number) => `owner:${s}:${epoch}`,
  blocked: (turn: string, attempt: number) => `blocked:${turn}:${attempt}`,
  postRefused: (s: string, mseq: number) => `post_refused:${s}:${mseq}`,
  /** A pause or unpause request (one event per request, so a redelivered request is a duplicate). */
  steer: (s: string, request: string) => `steer:${s}:${request}`,
  /** The one cancel of a run. */
  cancel: (s: string) => `cancel:${s}`,
  approvalRequested: (s: string, cell: number) => `approval:${s}:${cell}`,
  approvalDecided: (s: string, cell: number) => `approval_decided:${s}:${cell}`,
  /** An event of a fork's copy of its origin: `origin` is a seq in the origin's log (or a name of a synthesized one). */
  forkCopy: (s: string, origin: number | string) => `fork:${s}:${origin}`,
  forkCompleted: (s: string) => `fork_completed:${s}`,
  effectBegun: (s: string, name: string, attempt: number) => `effect:${s}:${name}:${attempt}`,
  effectEnded: (s: string, name: string) => `effect_end:${s}:${name}`,
} as const;

/** The turn id of round `n` of session `s`. */
export function turnId(session: string, n: number): string {
  return `${session}:t${n}`;
}

/** Observation ids the harness gives its own observations (reserved prefixes). */
export const observationId = {
  execution: (cell: number) => `execution:${cell}`,
  timer: (timerId: string) => `timer:${timerId}`,
  control: (note: number) => `control:${note}`,
  idle: (n: number) => `idle:${n}`,
  /** The observation that tells a forked run's model where it comes from. */
  fork: () => "control:fork",
} as const;

export { Cell };
