/**
 * Observations that enter a session's inbox: the harness's own (executions, timers, controls, idle)
 * and outside ones (posted through `Harness.post` or the storage mailbox).
 */
import { z } from "zod";
import { canonicalEqual } from "../state/canonical.js";
import type { SessionProjection } from "../state/projection.js";
import type { Observation } from "../state/schema.js";
import { jsonBounds } from "../state/canonical.js";
import { JsonValue, RESERVED_OBSERVATION_PREFIXES } from "../state/schema.js";

/** What an outside sender provides. `id` is the sender's stable id: redelivery is a no-op. */
export const OutsideObservation = z.strictObject({
  id: z.string().min(1).max(200),
  kind: z.string().min(1).max(100),
  payload: JsonValue,
});
export type OutsideObservation = z.infer<typeof OutsideObservation>;

/** A posted payload is at most this large (UTF-16 units of its JSON text) and this deep. */
export const MAX_PAYLOAD_SIZE = 64 * 1024;
export const MAX_PAYLOAD_DEPTH = 32;

/**
 * Why a posted payload is out of bounds, as one sentence, or null. Non-recursive, so it runs before the
 * schema (which recurses) ever sees a hostile payload.
 */
export function payloadProblem(payload: unknown): string | null {
  const b = jsonBounds(payload, { maxDepth: MAX_PAYLOAD_DEPTH, maxSize: MAX_PAYLOAD_SIZE });
  if (b.ok) return null;
  return b.problem === "depth"
    ? `the payload is nested more than ${MAX_PAYLOAD_DEPTH} levels deep; flatten it.`
    : `the payload is larger than ${MAX_PAYLOAD_SIZE} characters of JSON; post a reference (a path or a URL) to large data instead.`;
}

export type AdmitObservation =
  | { readonly ok: true; readonly duplicate: boolean }
  | { readonly ok: false; readonly reason: "forged" | "conflict" | "inbox_full" | "ended" | "invalid"; readonly message: string };

/**
 * Decides whether an outside observation may enter `session`'s inbox. Pure.
 * A reserved prefix is refused (it cannot be forged from outside); the same id with the same kind and
 * payload is a duplicate (a no-op); the same id with other content is refused; a full inbox tells the
 * sender to retry; an ended run takes nothing.
 */
export function checkOutsideObservation(session: SessionProjection, obs: OutsideObservation, inboxLimit: number): AdmitObservation {
  const reserved = RESERVED_OBSERVATION_PREFIXES.find((p) => obs.id.startsWith(p));
  if (reserved !== undefined) {
    return { ok: false, reason: "forged", message: `observation ids starting with "${reserved}" are reserved for the harness; choose another id.` };
  }
  const existing = session.observations.get(obs.id);
  if (existing !== undefined) {
    if (existing.kind === obs.kind && canonicalEqual(existing.payload, obs.payload)) return { ok: true, duplicate: true };
    return { ok: false, reason: "conflict", message: `observation "${obs.id}" was already delivered to session ${session.id} with other content; use a new id for new content.` };
  }
  if (session.terminal !== null) {
    return { ok: false, reason: "ended", message: `session ${session.id} has ended (${session.terminal.result}); it takes no more observations.` };
  }
  if (session.pending.length >= inboxLimit) {
    return { ok: false, reason: "inbox_full", message: `the inbox of session ${session.id} is full (${inboxLimit} unread observations); retry later.` };
  }
  return { ok: true, duplicate: false };
}

export function outsideToObservation(obs: OutsideObservation, at: string): Observation {
  return { id: obs.id, source: "external", kind: obs.kind, at, payload: obs.payload };
}
