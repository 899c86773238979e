/**
 * What an operator's request does to a run: pause, unpause, cancel, approve or deny a cell. Judged
 * against the run's projection, it becomes one atomic batch of events (or a refusal, or nothing),
 * which the owner commits wherever the request came from (the storage mailbox, `Harness.steer`).
 *
 * Every request has an id (the mailbox message id). A pause or unpause commits one event under that
 * id, so a redelivered request is a duplicate the storage refuses; a cancel has one identity per run,
 * an approval decision one per cell: repeating either changes nothing.
 *
 * Pure: no I/O, no clock (the time is an argument).
 */
import { z } from "zod";
import type { NewEvent } from "./events.js";
import { event, identity, observationId } from "./events.js";
import type { FinishedBody } from "./outcomes.js";
import type { SessionProjection } from "./projection.js";
import type { Observation } from "./schema.js";
import { CellId } from "./schema.js";

const Reason = z.string().max(2000).default("");

/** A request, as it travels in the mailbox (the payload of a `cairn.steer` message). */
export const SteerRequest = z.discriminatedUnion("action", [
  z.strictObject({ action: z.literal("pause"), reason: Reason, now: z.boolean().default(false) }),
  z.strictObject({ action: z.literal("unpause"), reason: Reason }),
  z.strictObject({ action: z.literal("cancel"), reason: Reason }),
  z.strictObject({ action: z.literal("approve"), cell_id: CellId, reason: Reason }),
  z.strictObject({ action: z.literal("deny"), cell_id: CellId, reason: z.string().min(1).max(2000) }),
]);
export type SteerRequest = z.infer<typeof SteerRequest>;
export type SteerAction = SteerRequest["action"];

/** What a request does: commit these events, nothing (it is already so), or refused (with why). */
export type SteerVerdict =
  | { readonly kind: "apply"; readonly events: readonly NewEvent[]; readonly message: string }
  | { readonly kind: "noop"; readonly message: string }
  | { readonly kind: "refused"; readonly code: "ended" | "invalid" | "conflict"; readonly message: string };

/** The observation that tells the model a person denied cell `cellId` (it pauses the queue until read). */
export function deniedObservation(cellId: number, reason: string, at: string): Observation {
  return {
    id: observationId.execution(cellId),
    source: "execution",
    kind: "execution_denied",
    at,
    payload: { cell_id: cellId, result: "cancelled", denied: true, reason, detail: `a person denied approval of cell ${cellId}; it never ran` },
  };
}

/** The result of a queued cell that never ran: denied by a person, or cancelled with its run. */
export function neverRan(cellId: number, detail: string): FinishedBody {
  return { cell_id: cellId, result: "cancelled", exit_code: null, signal: null, duration_ms: null, output_bytes: 0, dropped_bytes: 0, detail, unknown: null };
}

/** Judges request `r` (id `request`) against run `s`. */
export function steerEvents(s: SessionProjection, request: string, r: SteerRequest, at: string): SteerVerdict {
  const id = s.id;
  if (s.terminal !== null) {
    if (r.action === "cancel" && s.terminal.result === "cancelled") return { kind: "noop", message: `run ${id} was already cancelled` };
    return { kind: "refused", code: "ended", message: `run ${id} has ended (${s.terminal.result}); it cannot be ${verb(r.action)}` };
  }
  if (s.forming !== null) return { kind: "refused", code: "invalid", message: `run ${id} is a fork still being copied from run ${s.fork_of?.session}; try again in a moment` };
  switch (r.action) {
    case "cancel": {
      if (s.cancel_requested !== null) return { kind: "noop", message: `run ${id} is already being cancelled` };
      return { kind: "apply", events: [event("run_cancel_requested", id, identity.cancel(id), at, { request, reason: r.reason })], message: `run ${id} is cancelled` };
    }
    case "pause":
    case "unpause": {
      if (s.cancel_requested !== null) return { kind: "refused", code: "ended", message: `run ${id} is being cancelled; it cannot be ${verb(r.action)}` };
      // One event per request, even when the run is already so: a redelivered request is then a
      // duplicate, never applied again after a later one.
      const e =
        r.action === "pause"
          ? event("run_paused", id, identity.steer(id, request), at, { request, reason: r.reason, now: r.now })
          : event("run_unpaused", id, identity.steer(id, request), at, { request, reason: r.reason });
      const was = s.paused !== null;
      const message = r.action === "pause" ? (was ? `run ${id} was already paused` : `run ${id} is paused`) : was ? `run ${id} is unpaused` : `run ${id} was not paused`;
      return { kind: "apply", events: [e], message };
    }
    case "approve":
    case "deny": {
      const ex = s.executions.get(r.cell_id);
      if (ex === undefined) return { kind: "refused", code: "invalid", message: `cell ${r.cell_id} of run ${id} has no execution` };
      const decision = r.action === "approve" ? "approved" : "denied";
      if (ex.approval === null) return { kind: "refused", code: "invalid", message: `cell ${r.cell_id} of run ${id} does not wait for approval (it is ${ex.phase}${ex.result !== null ? `: ${ex.result}` : ""})` };
      if (ex.approval.state !== "waiting") {
        if (ex.approval.state === decision) return { kind: "noop", message: `cell ${r.cell_id} of run ${id} was already ${decision}` };
        return { kind: "refused", code: "conflict", message: `cell ${r.cell_id} of run ${id} was already ${ex.approval.state}; that decision stands` };
      }
      if (ex.phase !== "queued") return { kind: "refused", code: "invalid", message: `cell ${r.cell_id} of run ${id} no longer waits for approval (it is ${ex.phase}${ex.result !== null ? `: ${ex.result}` : ""})` };
      const decided = event("approval_decided", id, identity.approvalDecided(id, r.cell_id), at, { cell_id: r.cell_id, request, decision, reason: r.reason });
      if (decision === "approved") return { kind: "apply", events: [decided], message: `cell ${r.cell_id} of run ${id} is approved` };
      const obs = deniedObservation(r.cell_id, r.reason, at);
      return {
        kind: "apply",
        events: [
          decided,
          event("execution_finished", id, identity.finished(id, r.cell_id), at, neverRan(r.cell_id, `a person denied approval; it never ran: ${r.reason}`)),
          event("inbox_received", id, identity.inbox(id, obs.id), at, { observation: obs }),
        ],
        message: `cell ${r.cell_id} of run ${id} is denied; the model is told why`,
      };
    }
  }
}

/**
 * What ends a run an operator cancelled, before its `run_ended` (cancelledReason): every queued
 * execution (it never ran) is cancelled. Cells that were started are recorded before this (stopped
 * here, or found by recovery).
 */
export function cancelledQueued(s: SessionProjection, at: string): NewEvent[] {
  const out: NewEvent[] = [];
  for (const ex of s.executions.values()) {
    if (ex.phase !== "queued") continue;
    out.push(event("execution_finished", s.id, identity.finished(s.id, ex.cell_id), at, neverRan(ex.cell_id, "cancelled with its run by an operator before it started")));
  }
  return out;
}

/** The reason a cancelled run's `run_ended` gives. */
export function cancelledReason(s: SessionProjection): string {
  const why = s.cancel_requested?.reason ?? "";
  return `cancelled by an operator${why !== "" ? `: ${why}` : ""}`;
}

function verb(action: SteerAction): string {
  switch (action) {
    case "pause":
      return "paused";
    case "unpause":
      return "unpaused";
    case "cancel":
      return "cancelled";
    case "approve":
      return "approved";
    case "deny":
      return "denied";
  }
}
