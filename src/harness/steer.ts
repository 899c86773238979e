/**
 * An operator's request applied by the owner: `Harness.steer` (a caller in the owning process) and
 * the storage mailbox (`cairn pause`, `cancel`, `approve`, `deny`, the HTTP API) both come here. The
 * verdict is pure (src/state/steer.ts); this commits it.
 */
import type { SteerRequest, SteerVerdict } from "../state/steer.js";
import { steerEvents } from "../state/steer.js";
import { StorageRejected } from "../storage/errors.js";
import { ConfigError } from "../errors.js";
import type { HarnessCore } from "./core.js";

/** The mailbox `kind` of an operator's request (no outside observation may use a `cairn.` kind). */
export const STEER_KIND = "cairn.steer";

/**
 * Judges and commits request `r` (id `request`) for `session`. A duplicate identity (the same
 * request delivered again, or a cancel or decision already committed) is the same request: its
 * verdict is "nothing to do". Throws ConfigError for an unknown session, and the storage's errors.
 */
export async function applySteer(core: HarnessCore, session: string, request: string, r: SteerRequest): Promise<SteerVerdict> {
  const s = core.session(session);
  if (s === undefined) throw new ConfigError(`session "${session}" does not exist in database "${core.name}".`);
  const verdict = steerEvents(s, request, r, core.nowIso());
  if (verdict.kind !== "apply") return verdict;
  try {
    await core.commit(verdict.events);
  } catch (err) {
    if (err instanceof StorageRejected && err.reason === "duplicate_identity") return { kind: "noop", message: `request ${request} was already applied` };
    throw err;
  }
  core.logger.info({ session, request, action: r.action }, verdict.message);
  core.metrics?.operatorRequest(r.action);
  await core.faults?.("steer:committed", { session });
  return verdict;
}
