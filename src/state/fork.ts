/**
 * A fork of a run: a new run in the same database whose State is its origin's after round N.
 *
 * The fork's log is its own `session_created` (naming the origin, `fork`), then a copy of the
 * origin's events up to round N's accepting batch, then what became of the executions still in
 * flight at that cut, then an observation telling the fork's model where it comes from, then
 * `fork_completed`. Until that last event the fork does nothing (next-step.ts waits for it).
 *
 * In-flight executions (queued or started at the cut, not finished) are never run by the fork: each
 * appears as what it was in the origin's log when the fork is made. If the origin recorded its result
 * by then, the fork copies what the origin recorded of it after the cut (its start, output, effects,
 * approval and result) and the observation of its result; if not, the fork copies what was recorded
 * and finishes it as an UnknownExecution (`forked_while_in_flight`), whose observation the model reads.
 *
 * Every planned event has an identity derived from the origin's seq (`fork:NEW:SEQ`) or, for what is
 * made here, from the cell (`fork:NEW:unknown:CELL`): a copier that died mid-copy is resumed by
 * planning again and committing what the fork's log does not hold yet (`remainingUnits`).
 *
 * Pure: no I/O, no clock (`at` is an argument).
 */
import { event, identity, observationId, type ForkOrigin, type LogEvent, type NewEvent } from "./events.js";
import { executionObservation, type FinishedBody } from "./outcomes.js";
import { Reducer } from "./reducer.js";
import type { Observation } from "./schema.js";

/** What a fork request asks: fork run `origin` after round `round` as the new run `fork`. */
export interface ForkSpec {
  readonly origin: string;
  readonly fork: string;
  readonly round: number;
  /** Why (recorded in the fork's observation; may be empty). */
  readonly reason: string;
  /** The time of the events made here. */
  readonly at: string;
}

/** Events committed in one batch; `cell` names the in-flight execution they are about, if one. */
export interface ForkUnit {
  readonly events: readonly NewEvent[];
  readonly cell: number | null;
}

/** The fork's events, in commit order, as units (an execution's result goes with its observation). */
export interface ForkPlan {
  readonly kind: "plan";
  readonly origin: ForkOrigin;
  /** The fork's `session_created`. */
  readonly created: NewEvent;
  readonly units: readonly ForkUnit[];
  /** The in-flight executions at the cut, and how each appears in the fork. */
  readonly inFlight: readonly { readonly cell_id: number; readonly result: string }[];
}

export type ForkVerdict = ForkPlan | { readonly kind: "refused"; readonly message: string };

/** Steering, ownership and the origin's own fork bookkeeping are not the fork's history. */
const NOT_COPIED: ReadonlySet<LogEvent["kind"]> = new Set(["session_created", "owner_claimed", "post_refused", "run_paused", "run_unpaused", "run_cancel_requested", "fork_completed", "run_ended"]);
/** Events about one execution (body.cell_id), copied after the cut for an in-flight cell. */
const CELL_KINDS: ReadonlySet<LogEvent["kind"]> = new Set(["execution_started", "execution_output", "execution_finished", "effect_begun", "effect_ended", "approval_requested", "approval_decided"]);
const TURN_KINDS: ReadonlySet<LogEvent["kind"]> = new Set(["turn_prepared", "model_attempt", "model_attempt_failed", "model_response", "patch_accepted", "patch_rejected", "run_blocked"]);

/**
 * Plans fork `spec` from `events`: every event of the origin session, in seq order, as the log holds
 * them now. Refused (with a sentence) when round `spec.round` has no State to fork from.
 */
export function planFork(events: readonly LogEvent[], spec: ForkSpec): ForkVerdict {
  const { origin, fork } = spec;
  const createdEvent = events.find((e): e is LogEvent<"session_created"> => e.kind === "session_created");
  if (createdEvent === undefined || createdEvent.session !== origin) return { kind: "refused", message: `run "${origin}" does not exist` };
  const roundOf = new Map<string, number>();
  for (const e of events) if (e.kind === "turn_prepared") roundOf.set(e.body.turn, e.body.n);
  const accepted = events.filter((e): e is LogEvent<"patch_accepted"> => e.kind === "patch_accepted");
  const rounds = accepted.reduce((m, e) => Math.max(m, roundOf.get(e.body.turn) ?? 0), 0);
  let cut: LogEvent = createdEvent;
  let revision = 0;
  if (spec.round > 0) {
    const at = accepted.find((e) => roundOf.get(e.body.turn) === spec.round);
    if (at === undefined) {
      if (spec.round > rounds) return { kind: "refused", message: `run ${origin} has ${rounds} accepted round${rounds === 1 ? "" : "s"}; --at-round must be between 0 and ${rounds}` };
      return { kind: "refused", message: `round ${spec.round} of run ${origin} has no accepted patch, so there is no State after it to fork from` };
    }
    cut = at;
    revision = at.body.revision;
  }
  const cutSeq = cut.seq;
  let end = events.indexOf(cut);
  if (cut.kind === "patch_accepted") {
    // The rest of the round's atomic batch: its cells' executions, and an idle observation.
    const cells = new Set(cut.body.new_cell_ids);
    while (end + 1 < events.length) {
      const e = events[end + 1]!;
      const queued = e.kind === "execution_queued" && cells.has(e.body.cell_id);
      const idle = e.kind === "inbox_received" && e.body.observation.source === "idle" && e.at === cut.at;
      if (!queued && !idle) break;
      end += 1;
    }
  }
  const forkOrigin: ForkOrigin = { session: origin, round: spec.round, cut_seq: cutSeq, revision };
  const b = createdEvent.body;
  const created = event("session_created", fork, identity.session(fork), spec.at, {
    goal: b.goal,
    cwd: b.cwd,
    validators: b.validators.map((v) => [...v]),
    budgets: { ...b.budgets },
    ...(b.cell_network !== undefined ? { cell_network: b.cell_network } : {}),
    ...(b.approval !== undefined ? { approval: structuredClone(b.approval) } : {}),
    fork: forkOrigin,
    // The fork keeps its origin's effect seed: an effect done by the origin has the same key here.
    ...(b.effect_seed !== undefined ? { effect_seed: b.effect_seed } : {}),
  });

  const rename = (e: LogEvent, id: string = identity.forkCopy(fork, e.seq)): NewEvent => renamed(e, fork, id, roundOf);
  let prefix = events.slice(0, end + 1).filter((e) => !NOT_COPIED.has(e.kind));
  let r = new Reducer();
  let seq = 0;
  const fold = (es: readonly NewEvent[]): void => r.apply(es.map((e) => ({ ...e, seq: ++seq }) as LogEvent));
  const foldPrefix = (): ForkUnit[] => {
    r = new Reducer();
    seq = 0;
    fold([created]);
    const out = prefix.map((e) => ({ events: [rename(e)], cell: null }));
    for (const u of out) fold(u.events);
    return out;
  };
  let units = foldPrefix();
  if (r.session(fork)!.pending.includes(observationId.fork())) {
    // The origin is itself a fork forked at round 0, its own fork observation still unread: this
    // fork's observation replaces it.
    prefix = prefix.filter((e) => !(e.kind === "inbox_received" && e.body.observation.id === observationId.fork()));
    units = foldPrefix();
  }

  const after = events.slice(end + 1);
  const inFlight: { cell_id: number; result: string }[] = [];
  const open = [...r.session(fork)!.executions.values()].filter((ex) => ex.phase !== "finished").sort((x, y) => x.cell_id - y.cell_id);
  for (const ex of open) {
    const cell = ex.cell_id;
    const mine = after.filter((e) => CELL_KINDS.has(e.kind) && (e.body as { cell_id: number }).cell_id === cell);
    const finishedAt = mine.findIndex((e) => e.kind === "execution_finished");
    const before = (finishedAt < 0 ? mine : mine.slice(0, finishedAt)).map((e) => rename(e));
    for (const e of before) {
      units.push({ events: [e], cell });
      fold([e]);
    }
    let finish: NewEvent;
    let obs: Observation;
    if (finishedAt >= 0) {
      const f = mine[finishedAt]! as LogEvent<"execution_finished">;
      finish = rename(f);
      fold([finish]);
      const recorded = after.find((e): e is LogEvent<"inbox_received"> => e.kind === "inbox_received" && e.seq > f.seq && e.body.observation.id === observationId.execution(cell));
      obs = recorded?.body.observation ?? executionObservation(f.body, f.at, r.session(fork)!.executions.get(cell));
      inFlight.push({ cell_id: cell, result: f.body.result });
    } else {
      const now = r.session(fork)!.executions.get(cell)!;
      const body = forkedUnknown(now, spec);
      finish = event("execution_finished", fork, identity.forkCopy(fork, `unknown:${cell}`), spec.at, body);
      fold([finish]);
      obs = executionObservation(body, spec.at, r.session(fork)!.executions.get(cell));
      inFlight.push({ cell_id: cell, result: "UnknownExecution" });
    }
    const observe = event("inbox_received", fork, identity.forkCopy(fork, `observe:${cell}`), obs.at, { observation: obs });
    fold([observe]);
    units.push({ events: [finish, observe], cell });
  }
  const copied = units.reduce((n, u) => n + u.events.length, 0);
  const told = forkObservation(spec, forkOrigin, inFlight);
  units.push({ events: [event("inbox_received", fork, identity.inbox(fork, told.id), spec.at, { observation: told }), event("fork_completed", fork, identity.forkCompleted(fork), spec.at, { copied })], cell: null });
  return { kind: "plan", origin: forkOrigin, created, units, inFlight };
}

/**
 * The units of `plan` a copier still has to commit, given the identities the fork's log holds now
 * (`done`): a unit already committed (units are atomic) is skipped, and so is everything about an
 * in-flight execution the fork already finished (`finished`): a re-plan may describe it otherwise,
 * the origin having recorded more of it in between, and the fork keeps what it recorded first.
 */
export function remainingUnits(plan: ForkPlan, done: ReadonlySet<string>, finished: ReadonlySet<number>): ForkUnit[] {
  const rest = plan.units.filter((u) => !u.events.some((e) => done.has(e.identity)) && !(u.cell !== null && finished.has(u.cell)));
  // `fork_completed` counts the copies the fork's log holds in the end: those committed before, and these.
  const prefix = identity.forkCopy(plan.created.session, "");
  let copied = [...done].filter((id) => id.startsWith(prefix)).length;
  for (const u of rest) copied += u.events.filter((e) => e.identity.startsWith(prefix)).length;
  return rest.map((u) => ({ ...u, events: u.events.map((e) => (e.kind === "fork_completed" ? { ...e, body: { copied } } : e)) }));
}

/** The result of an execution in flight at the cut whose result the origin had not recorded. */
function forkedUnknown(ex: { cell_id: number; phase: string; output_bytes: number; started: { seq: number } | null }, spec: ForkSpec): FinishedBody {
  const where = ex.started === null ? `queued and not started in run ${spec.origin}` : `started in run ${spec.origin} (event ${ex.started.seq}) without a recorded result`;
  return {
    cell_id: ex.cell_id,
    result: "UnknownExecution",
    exit_code: null,
    signal: null,
    duration_ms: null,
    output_bytes: ex.output_bytes,
    dropped_bytes: 0,
    detail: `this run is a fork of run ${spec.origin} after round ${spec.round}; the cell was ${where} when the fork was made, and the fork does not run it: what it did is unknown`,
    unknown: {
      type: "UnknownExecution",
      cell_id: ex.cell_id,
      reason: "forked_while_in_flight",
      worker_stopped: false,
      evidence_refs: ex.started === null ? [] : [`event:${ex.started.seq}`],
    },
  };
}

/** The observation that tells a fork's model where it comes from. */
function forkObservation(spec: ForkSpec, origin: ForkOrigin, inFlight: readonly { cell_id: number; result: string }[]): Observation {
  const cells = inFlight.length === 0 ? "" : ` Cells in flight then are not run again here: ${inFlight.map((c) => `cell ${c.cell_id} (${c.result})`).join(", ")}.`;
  return {
    id: observationId.fork(),
    source: "control",
    kind: "forked",
    at: spec.at,
    payload: {
      origin: spec.origin,
      round: spec.round,
      revision: origin.revision,
      reason: spec.reason,
      in_flight: inFlight.map((c) => ({ cell_id: c.cell_id, result: c.result })),
      message: `This run is a fork of run ${spec.origin} after round ${spec.round}: its State is that run's State at revision ${origin.revision}, and it goes on from there on its own.${cells}${spec.reason !== "" ? ` Why: ${spec.reason}` : ""}`,
    },
  };
}

/** `e` as an event of `fork` under `id`, its round ids renamed to the fork's. */
function renamed(e: LogEvent, fork: string, id: string, roundOf: ReadonlyMap<string, number>): NewEvent {
  let body = e.body as Record<string, unknown>;
  if (TURN_KINDS.has(e.kind)) {
    const turn = body.turn as string;
    const n = roundOf.get(turn);
    if (n !== undefined) body = { ...body, turn: `${fork}:t${n}` };
  }
  return { identity: id, kind: e.kind, session: fork, at: e.at, body } as NewEvent;
}
