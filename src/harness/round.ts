/**
 * The model round: prepare the turn (delivering unread observations), call the model, record its
 * response, and admit the patch; retried within the attempt budget (nextAttempt in
 * src/state/next-step.ts decides which attempt comes next). A response committed before a crash is
 * admitted without calling the model again.
 */
import { admit, patchBoundsProblem } from "../state/admission.js";
import { event, identity, turnId, type NewEvent } from "../state/events.js";
import { nextAttempt } from "../state/next-step.js";
import type { NextStep } from "../state/next-step.js";
import { ENDED_HISTORY_KEEP, HISTORY_KEEP } from "../state/history.js";
import { acceptedEvents, admissionContext, toJson } from "../state/outcomes.js";
import type { Admission } from "../state/admission.js";
import { ConfigError, hasCode } from "../errors.js";
import type { HarnessCore } from "./core.js";
import type { SessionContext } from "./session.js";
import { modelFailurePlan, RunBlocked } from "./model-retry.js";

type Usage = { input_tokens: number; output_tokens: number };

/**
 * Runs one round until a patch is accepted or the run ends. Commits per round: `carry` (events the
 * driver holds, such as the previous cell's result and its observation), `turn_prepared` and the
 * first `model_attempt` together; then the response with its verdict (and the queued executions)
 * together. `carry` always goes in the first commit, before anything else happens.
 */
export async function runRound(ctx: SessionContext, step: Extract<NextStep, { kind: "round" }>, carry: readonly NewEvent[] = []): Promise<void> {
  const { core, id } = ctx;
  const turn = step.turn;
  let pending: NewEvent[] = [...carry];
  if (step.prepare) {
    pending.push(event("turn_prepared", id, identity.turn(turn), core.nowIso(), { turn, n: step.n, revision: ctx.session().state.revision, delivered: [...step.delivered] }));
  }
  const started = core.world.clock.now();
  core.tracing.round(core.name, id, turn, step.n);
  for (;;) {
    if (core.stopping()) return;
    const s = ctx.session();
    if (s.paused !== null || s.cancel_requested !== null) {
      // An operator paused or cancelled the run: no further model call. The round stays open (a
      // pause) and continues where it was once unpaused; what this round holds is committed first.
      if (pending.length > 0) await core.commit(pending);
      return;
    }
    const t = s.turns.get(turn);
    // A turn being prepared in this very commit: its first attempt, nothing refused yet.
    const next: ReturnType<typeof nextAttempt> =
      t === undefined && step.prepare ? { kind: "call", attempt: 1, rejection: null } : t === undefined ? neverPrepared(id, turn) : nextAttempt(s, t, core.limits);
    if (next.kind !== "call" && pending.length > 0) {
      await core.commit(pending);
      pending = [];
      continue;
    }
    if (next.kind === "done") return;
    if (next.kind === "give_up") {
      await ctx.endRun("failure", next.reason);
      return;
    }
    let patch: unknown;
    if (next.kind === "admit") {
      patch = next.patch;
    } else {
      const before = pending;
      pending = [];
      const got = await callModel(ctx, turn, next.attempt, next.rejection, before);
      if (got === "stop") return;
      if (got === "again") continue;
      if (await admitPatch(ctx, turn, next.attempt, got.patch, got.response)) {
        core.metrics?.modelRound((core.world.clock.now() - started) / 1000);
        return;
      }
      continue;
    }
    if (await admitPatch(ctx, turn, next.attempt, patch, null)) {
      core.metrics?.modelRound((core.world.clock.now() - started) / 1000);
      return;
    }
  }
}

function neverPrepared(id: string, turn: string): never {
  throw new Error(`round ${turn} of session ${id} was never prepared`);
}

/**
 * One model call: `model_attempt` first (with `before`, committed together), then the failure
 * (`model_attempt_failed`, then a back-off) or the response, returned UNcommitted: admitPatch
 * commits it together with its verdict. "again": try the next attempt; "stop": the round is over.
 */
async function callModel(
  ctx: SessionContext,
  turn: string,
  attempt: number,
  rejection: { code: string; reason: string; patch: unknown } | null,
  before: readonly NewEvent[],
): Promise<{ patch: unknown; response: NewEvent } | "again" | "stop"> {
  const { core, id } = ctx;
  await core.commit([...before, event("model_attempt", id, identity.attempt(turn, attempt), core.nowIso(), { turn, attempt })]);
  let reply: { patch: unknown; usage: Usage | null };
  const span = core.tracing.modelCall(core.name, id, core.model.name, attempt);
  try {
    reply = await core.model.step({
      state: ctx.session().state,
      turn,
      attempt,
      ...(rejection !== null ? { rejection } : {}),
      signal: ctx.signal,
    });
    if (reply === null || typeof reply !== "object") throw new TypeError(`the model returned ${String(reply)} instead of {patch, usage}`);
  } catch (err) {
    span.fail(err);
    const after = ctx.session();
    if (core.stopping() || after.terminal !== null || after.cancel_requested !== null) return "stop";
    return modelFailed(ctx, turn, attempt, err);
  }
  span.end(reply.usage ?? null);
  streaks.delete(ctx);
  core.metrics?.modelAttempt("ok");
  if (reply.usage) core.metrics?.tokens(reply.usage.input_tokens, reply.usage.output_tokens);
  // Recording is recursive (validation, serialization): a reply too deep or too large for it is
  // refused first, in bounded work, like any inadmissible patch.
  const outOfBounds = patchBoundsProblem(reply.patch);
  if (outOfBounds !== null) {
    const at = core.nowIso();
    await core.commit([
      event("model_response", id, identity.response(turn, attempt), at, { turn, attempt, patch: null, usage: reply.usage ?? null }),
      event("patch_rejected", id, identity.rejected(turn, attempt), at, { turn, attempt, code: "invalid_patch", reason: outOfBounds }),
    ]);
    core.metrics?.patchRejected("invalid_patch");
    return "again";
  }
  return { patch: reply.patch, response: event("model_response", id, identity.response(turn, attempt), core.nowIso(), { turn, attempt, patch: toJson(reply.patch), usage: reply.usage ?? null }) };
}

/** Commits a response alone (when it does not fit one commit with its verdict). "again" when it is too large to record. */
async function commitResponse(ctx: SessionContext, turn: string, attempt: number, response: NewEvent, patch: unknown): Promise<"again" | "ok"> {
  const { core, id } = ctx;
  try {
    await core.commit([response]);
  } catch (err) {
    if (!isTooLarge(err)) throw err;
    // Too large to record durably: refuse it like an inadmissible patch, and say why.
    const bytes = JSON.stringify(patch ?? null).length;
    await core.commit([
      event("patch_rejected", id, identity.rejected(turn, attempt), core.nowIso(), {
        turn,
        attempt,
        code: "too_large",
        reason: `the patch is too large to record (${bytes} bytes of JSON): keep each step well under 512 KiB, e.g. split a large script or write big files from several cells`,
      }),
    ]);
    return "again";
  }
  await core.faults?.("model:response-committed", { session: id, turn });
  return "ok";
}

const isTooLarge = (err: unknown): boolean => hasCode(err, "rejected") && (err as { reason?: string }).reason === "too_large";

/** Consecutive failed calls of a session's driver: when they began (ms) and how many. */
const streaks = new WeakMap<SessionContext, { since: number; count: number }>();

/**
 * Records a failed model call and decides what follows (model-retry.ts): retry after a backoff (full
 * jitter, Retry-After honoured, bounded by the retry budget), park the run as blocked (a refused key,
 * a wrong model or URL, the budget spent: commits `run_blocked`, then throws RunBlocked), or end the
 * run (a failure no retry can fix).
 */
async function modelFailed(ctx: SessionContext, turn: string, attempt: number, err: unknown): Promise<"again" | "stop"> {
  const { core, id } = ctx;
  const now = core.world.clock.now();
  const streak = streaks.get(ctx) ?? { since: now, count: 0 };
  streak.count += 1;
  streaks.set(ctx, streak);
  const s = ctx.session();
  const wallLeftMs = s.budgets.max_wall_seconds === undefined ? null : Date.parse(s.created_at) + s.budgets.max_wall_seconds * 1000 - now;
  const plan = modelFailurePlan(err, { attemptInStreak: streak.count, failingForMs: now - streak.since, limits: core.limits, wallLeftMs, random: Math.random });
  core.metrics?.modelAttempt("error");
  const at = core.nowIso();
  const failed = event("model_attempt_failed", id, identity.attemptFailed(turn, attempt), at, {
    turn,
    attempt,
    error: plan.message,
    retryable: plan.action === "retry",
    usage: plan.usage,
    failure: plan.failure,
    ...(plan.action === "retry" ? { retry_in_ms: plan.delayMs } : {}),
  });
  core.logger.warn({ session: id, turn, attempt, failure: plan.failure, action: plan.action, err: plan.message }, "model attempt failed");
  if (plan.action === "block") {
    await core.commit([failed, event("run_blocked", id, identity.blocked(turn, attempt), at, { turn, attempt, cause: plan.cause, reason: plan.reason })]);
    core.metrics?.runBlocked(plan.cause);
    streaks.delete(ctx);
    throw new RunBlocked(plan.cause, plan.reason, err);
  }
  await core.commit([failed]);
  if (plan.action === "end") {
    await ctx.endRun("failure", `the model call failed and cannot be retried: ${plan.message}`);
    return "stop";
  }
  core.metrics?.modelRetry();
  const sleep = core.world.clock.sleep;
  if (sleep !== undefined) await sleep(plan.delayMs);
  else await core.sleep(plan.delayMs);
  return "again";
}

/**
 * Admits a response (admission is pure) and commits the verdict; a `response` not committed yet goes
 * in the same commit (as safe as committing it first: a response is durable exactly when its verdict
 * is, and a saved response is never requested again). Returns true when accepted (or the round is over).
 */
async function admitPatch(ctx: SessionContext, turn: string, attempt: number, patch: unknown, response: NewEvent | null): Promise<boolean> {
  const { core, id } = ctx;
  const s = ctx.session();
  const result = admit(admissionContext(s, core.headSeq()), patch, turn);
  const at = core.nowIso();
  const verdict = !result.ok
    ? [event("patch_rejected", id, identity.rejected(turn, attempt), at, { turn, attempt, code: result.code, reason: result.reason })]
    : result.receipt.replay
      ? []
      : acceptedEvents(s, turn, attempt, patch, result.receipt, core.limits.maxIdle, at);
  // The gate of the cell this verdict queues starts while the verdict's commit is in flight.
  if (result.ok && !result.receipt.replay) ctx.prepareEarly(result.receipt.newCells);
  if (response !== null) {
    try {
      await core.commit([response, ...verdict]);
      await core.faults?.("model:response-committed", { session: id, turn });
      return logVerdict(ctx, turn, attempt, result, true) && (await afterAccepted(ctx, turn, result));
    } catch (err) {
      if (!isTooLarge(err)) throw err;
      // Together too large for one commit: the response alone, then its verdict (judged again).
      if ((await commitResponse(ctx, turn, attempt, response, patch)) === "again") return false;
      return admitPatch(ctx, turn, attempt, patch, null);
    }
  }
  if (verdict.length > 0) await core.commit(verdict);
  return logVerdict(ctx, turn, attempt, result, false) && (await afterAccepted(ctx, turn, result));
}

/** Logs and counts the verdict; true when accepted. */
function logVerdict(ctx: SessionContext, turn: string, attempt: number, result: Admission, withResponse: boolean): boolean {
  const { core, id } = ctx;
  if (!result.ok) {
    core.metrics?.patchRejected(result.code);
    core.logger.info({ session: id, turn, attempt, code: result.code, reason: result.reason }, "patch rejected");
    return false;
  }
  const r = result.receipt;
  if (!r.replay) core.logger.info({ session: id, turn, revision: r.revision, new_cells: r.newCells.map((c) => c.id), withResponse }, "patch accepted");
  return true;
}

async function afterAccepted(ctx: SessionContext, turn: string, result: Admission): Promise<boolean> {
  if (result.ok && !result.receipt.replay) await ctx.core.faults?.("patch:committed", { session: ctx.id, turn });
  return true;
}

/**
 * Judges a re-submitted patch for round `turn`, already accepted: the same patch is a replay (the
 * original receipt), another is `round_conflict`. Commits nothing. Throws a ConfigError for an
 * unknown session or a round not accepted yet (the round loop admits open rounds).
 */
export function resubmit(core: HarnessCore, session: string, turn: string, patch: unknown): Admission {
  const s = core.session(session);
  if (s === undefined) throw new ConfigError(`session "${session}" does not exist in database "${core.name}".`);
  if (s.turns.get(turn)?.accepted == null) {
    // A round id this session issued (turnId's format, read back through turnId itself).
    const n = Number(turn.slice(turn.lastIndexOf(":t") + 2));
    if (!s.turns.has(turn) && Number.isInteger(n) && n >= 1 && n < s.turn_count && turnId(session, n) === turn) {
      const kept = s.terminal !== null ? `the run has ended and keeps the most recent ${ENDED_HISTORY_KEEP}` : `the most recent ${HISTORY_KEEP}`;
      throw new ConfigError(`round ${turn} of session ${session} is older than the rounds the run keeps at hand (${kept}); it cannot be re-submitted, and its patch and verdict are in the log (cairn log).`);
    }
    throw new ConfigError(`round ${turn} of session ${session} has not been accepted; the round loop admits open rounds, and only accepted rounds can be re-submitted.`);
  }
  return admit(admissionContext(s, core.headSeq()), patch, turn);
}
