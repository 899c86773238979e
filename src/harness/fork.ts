/**
 * A fork request applied by the owner of the database (`cairn fork`, the HTTP API): it arrives in
 * the storage mailbox, and the owner copies the origin into the new run (src/state/fork.ts plans
 * it). The request stays in the mailbox until the copy is complete, so an owner killed mid-copy
 * leaves it to the next one, which plans again and commits what the fork's log does not hold yet:
 * every copied event's identity names the origin event it copies, so nothing is copied twice.
 *
 * The copy reads the whole log once (the owner's projection keeps only recent history) and holds
 * the origin's events in memory while it plans.
 */
import { z } from "zod";
import type { LogEvent } from "../state/events.js";
import { planFork, remainingUnits, type ForkUnit } from "../state/fork.js";
import type { Database } from "../storage/contract.js";
import type { HarnessCore } from "./core.js";
import { checkUserSessionId, isAssignedId } from "./start-request.js";

/** The mailbox `kind` of a fork request; the message's `session` is the new run's id. */
export const FORK_KIND = "cairn.fork";

/** The payload of a fork request. */
export const ForkRequest = z.strictObject({
  origin: z.string().min(1).max(200),
  at_round: z.number().int().nonnegative(),
  reason: z.string().max(2000).default(""),
});
export type ForkRequest = z.infer<typeof ForkRequest>;

/** At most this many events, and about this many bytes, per commit of a copy (the replicated adapter takes 126 events and 1 MiB). */
const BATCH_EVENTS = 100;
const BATCH_BYTES = 512 * 1024;

/** What became of a fork request: the fork is complete (now or before), or it was refused (why; `origin` exists to record it on). */
export type ForkResult = { readonly kind: "forked"; readonly copied: number } | { readonly kind: "already" } | { readonly kind: "refused"; readonly code: "invalid" | "conflict"; readonly message: string };

/**
 * Performs fork request `r` creating run `fork`, or finishes one an earlier owner began. Calls
 * `begin(fork)` once the copy is complete, so the owner drives the new run. Throws the storage's
 * errors (the request stays in the mailbox; the next drain or owner resumes it).
 */
export async function performFork(core: HarnessCore, db: Pick<Database, "read">, fork: string, r: ForkRequest, begin: (session: string) => void): Promise<ForkResult> {
  const bad = isAssignedId(fork) ? null : checkUserSessionId(fork);
  if (bad !== null) return { kind: "refused", code: "invalid", message: `the fork's id is not valid: ${bad}` };
  const existing = core.session(fork);
  if (existing !== undefined) {
    if (existing.fork_of?.session !== r.origin || existing.fork_of.round !== r.at_round) {
      return { kind: "refused", code: "conflict", message: `run ${fork} already exists in database "${core.name}"; choose another id for the fork` };
    }
    if (existing.forming === null) return { kind: "already" };
  } else {
    const origin = core.session(r.origin);
    if (origin === undefined) return { kind: "refused", code: "invalid", message: `run ${r.origin} does not exist in database "${core.name}"` };
    if (origin.forming !== null) return { kind: "refused", code: "invalid", message: `run ${r.origin} is a fork still being copied; fork it once its copy is complete` };
  }
  const { originEvents, done, finished } = await readFor(db, r.origin, fork);
  const plan = planFork(originEvents, { origin: r.origin, fork, round: r.at_round, reason: r.reason, at: core.nowIso() });
  if (plan.kind === "refused") return { kind: "refused", code: "invalid", message: plan.message };
  if (existing === undefined) {
    await core.commit([plan.created]);
    core.logger.info({ session: fork, origin: r.origin, round: r.at_round }, "fork created; copying its origin");
  }
  let copied = 0;
  for (const batch of batches(remainingUnits(plan, done, finished))) {
    await core.commit(batch);
    copied += batch.length;
    await core.faults?.("fork:batch-committed", { session: fork });
  }
  core.logger.info({ session: fork, origin: r.origin, round: r.at_round, copied, in_flight: plan.inFlight }, "fork complete");
  begin(fork);
  core.metrics?.operatorRequest("fork");
  return { kind: "forked", copied };
}

/** The origin's events, and the identities and finished executions the fork's log holds already. */
async function readFor(db: Pick<Database, "read">, origin: string, fork: string): Promise<{ originEvents: LogEvent[]; done: Set<string>; finished: Set<number> }> {
  const originEvents: LogEvent[] = [];
  const done = new Set<string>();
  const finished = new Set<number>();
  let after = 0;
  for (;;) {
    const page = await db.read(after, 5000);
    if (page.length === 0) break;
    for (const e of page) {
      if (e.session === origin) originEvents.push(e);
      else if (e.session === fork) {
        done.add(e.identity);
        if (e.kind === "execution_finished") finished.add(e.body.cell_id);
      }
    }
    after = page[page.length - 1]!.seq;
  }
  return { originEvents, done, finished };
}

/** Units grouped into commits of at most BATCH_EVENTS events and about BATCH_BYTES bytes (a unit is never split). */
function batches(units: readonly ForkUnit[]): ForkUnit["events"][] {
  const out: ForkUnit["events"][] = [];
  let current: ForkUnit["events"][number][] = [];
  let bytes = 0;
  for (const u of units) {
    const size = u.events.reduce((n, e) => n + JSON.stringify(e).length, 0);
    if (current.length > 0 && (current.length + u.events.length > BATCH_EVENTS || bytes + size > BATCH_BYTES)) {
      out.push(current);
      current = [];
      bytes = 0;
    }
    current.push(...u.events);
    bytes += size;
  }
  if (current.length > 0) out.push(current);
  return out;
}
