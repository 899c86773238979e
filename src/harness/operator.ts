/**
 * An operator's requests from outside the owner (`cairn pause`, `unpause`, `cancel`, `approve`,
 * `deny`, and the HTTP API of `cairn serve`, which calls the same functions): judged first against
 * what a reader sees, so a request that cannot apply is refused at once with the reason; then
 * posted to the database's mailbox, without taking ownership; then, when an owner is live, followed
 * in the log until the owner applied or refused it. With no live owner the request waits in the
 * mailbox, and the next owner applies it before its runs do anything (Harness.resume).
 *
 * Nothing is half-applied: a request is one mailbox message, and the owner commits what it does as
 * one atomic batch (src/state/steer.ts).
 */
import { createHash, randomBytes } from "node:crypto";
import { parseLogEvent, identity, type LogEvent } from "../state/events.js";
import type { Reducer } from "../state/reducer.js";
import { steerEvents, type SteerRequest } from "../state/steer.js";
import type { MailboxMessage, Storage } from "../storage/contract.js";
import { StorageRejected } from "../storage/errors.js";
import { canonicalEqual } from "../state/canonical.js";
import { loadProjection } from "../storage/snapshots.js";
import { ConfigError, hasCode } from "../errors.js";
import { assignedSubmitId, checkUserSessionId, START_REQUEST_KIND, startRequestId } from "./start-request.js";
import { FORK_KIND, type ForkRequest } from "./fork.js";
import { STEER_KIND } from "./steer.js";

/** What became of a request. */
export interface RequestOutcome {
  /**
   * `applied`: the owner committed it. `already`: nothing to do (the run is already so). `waiting`:
   * posted; no live owner now, so it waits in the mailbox for the next one. `unconfirmed`: posted to
   * a live owner that did not apply it within the wait (it stays in the mailbox). `refused`: not
   * applied, `message` says why (nothing was posted, or the owner refused it).
   */
  readonly status: "applied" | "already" | "waiting" | "unconfirmed" | "refused";
  readonly message: string;
  /** The request's id (the mailbox message id): the same id again is the same request. */
  readonly request: string;
}

export interface RequestOptions {
  /** The request's id; default a fresh one. Give one to make a retry of the same request harmless. */
  readonly id?: string;
  /** How long to follow the log for the owner's answer when an owner is live (default 30 s; 0: do not wait). */
  readonly waitMs?: number;
  /** The time, for the message (default now). */
  readonly now?: () => Date;
}

const REQUEST_ID = /^[A-Za-z0-9._:-]{1,200}$/;

/** Checks a request id given by a caller; throws ConfigError saying what is allowed. */
export function checkRequestId(id: string): void {
  if (!REQUEST_ID.test(id)) throw new ConfigError(`the request id "${id.slice(0, 80)}" is not valid: use 1 to 200 letters, digits, ".", "_", ":" or "-"`);
}

/** A reader's projection of `name` (latest snapshot and the events after it). Throws DatabaseNotFound. */
export async function readProjection(storage: Storage, name: string): Promise<Reducer> {
  const reader = await storage.reader(name);
  try {
    return await loadProjection(reader);
  } finally {
    await reader.close().catch(() => undefined);
  }
}

/** Whether a start request for `session` waits in `name`'s mailbox (submitted, not started yet). */
export async function startPending(storage: Storage, name: string, session: string): Promise<boolean> {
  const reader = await storage.reader(name);
  try {
    return ((await reader.pending?.()) ?? []).some((m) => m.kind === START_REQUEST_KIND && m.id === startRequestId(session));
  } finally {
    await reader.close().catch(() => undefined);
  }
}

/**
 * Whether a live process may own `name` now: false only when its lease says nobody does. An adapter
 * without leases, or a lease that cannot be read, is a "maybe" (true): the caller then follows the
 * log for the owner's answer and says "unconfirmed" if none comes, rather than claiming that the
 * request waits for an owner that may be working on it.
 */
export async function ownerLive(storage: Storage, name: string): Promise<boolean> {
  if (storage.leases === undefined) return true;
  try {
    return (await storage.leases.read(name))?.live === true;
  } catch {
    return true;
  }
}

/**
 * Asks the owner of database `name` to apply `request` to run `session` (pause, unpause, cancel,
 * approve, deny). Refused at once (nothing posted) when what a reader sees already refuses it, e.g.
 * an ended run or a cell that does not wait for approval; `already` when there is nothing to do.
 * Throws ConfigError for a run that neither exists nor waits to be started, and the storage's errors.
 */
export async function steerRun(storage: Storage, name: string, session: string, request: SteerRequest, options: RequestOptions = {}): Promise<RequestOutcome> {
  const id = options.id ?? `${request.action}-${randomBytes(6).toString("hex")}`;
  checkRequestId(id);
  const now = options.now ?? (() => new Date());
  const r = await readProjection(storage, name);
  const s = r.session(session);
  if (s === undefined) {
    if (!(await startPending(storage, name, session))) throw new ConfigError(`run "${session}" does not exist in database "${name}".`);
  } else {
    const verdict = steerEvents(s, id, request, now().toISOString());
    if (verdict.kind === "refused") return { status: "refused", message: verdict.message, request: id };
    if (verdict.kind === "noop") return { status: "already", message: verdict.message, request: id };
  }
  await postOnce(storage, name, { id, session, kind: STEER_KIND, payload: request, at: now().toISOString() });
  const what = `${request.action} of run ${session}${"cell_id" in request ? ` cell ${request.cell_id}` : ""}`;
  if (!(await ownerLive(storage, name))) {
    return { status: "waiting", message: `the ${what} waits in the mailbox: no live worker owns "${name}" now; the next owner applies it before its runs do anything`, request: id };
  }
  const waitMs = options.waitMs ?? 30_000;
  if (waitMs <= 0) return { status: "unconfirmed", message: `the ${what} was posted; its owner applies it`, request: id };
  const answer = await followUntil(storage, name, r, waitMs, (e) => answers(e, session, id, request));
  if (answer === null) return { status: "unconfirmed", message: `the ${what} was posted, but the owner did not apply it within ${Math.round(waitMs / 1000)} s; it stays in the mailbox`, request: id };
  return answer.kind === "post_refused"
    ? { status: "refused", message: `the owner refused the ${what}: ${(answer as LogEvent<"post_refused">).body.reason}`, request: id }
    : { status: "applied", message: `${what}: done`, request: id };
}

/** What `cairn fork` asks: fork after round `atRound`, as run `newSession` (default: an id Cairn assigns). */
export interface ForkAsk {
  readonly atRound: number;
  readonly newSession?: string;
  readonly reason?: string;
}

/** What became of a fork request, and the new run's id. */
export interface ForkOutcome extends RequestOutcome {
  readonly session: string;
}

/**
 * Asks the owner of database `name` to fork run `session` after round `ask.atRound` into a new run
 * (src/harness/fork.ts performs it; src/state/fork.ts says what the fork holds). `applied` once the
 * copy is complete; `already` when that fork exists; `refused` at once, nothing posted, when what a
 * reader sees refuses it (a round beyond the run's rounds, an id in use, an origin still being
 * copied) or when the owner refused it. Without `newSession` the id is `s-` and 8 hex digits: drawn
 * at random, or derived from `options.id` when given, so a retried request names the same run.
 * Throws ConfigError for an unknown run or a malformed id, and the storage's errors.
 */
export async function forkRun(storage: Storage, name: string, session: string, ask: ForkAsk, options: RequestOptions = {}): Promise<ForkOutcome> {
  const id = options.id ?? `fork-${randomBytes(6).toString("hex")}`;
  checkRequestId(id);
  if (!Number.isInteger(ask.atRound) || ask.atRound < 0) throw new ConfigError(`the round to fork after must be a whole number from 0, got ${ask.atRound}`);
  const reason = ask.reason ?? "";
  if (reason.length > 2000) throw new ConfigError("the reason is longer than 2000 characters");
  const fork = ask.newSession ?? (options.id !== undefined ? `s-${createHash("sha256").update(`${name}\n${id}`).digest("hex").slice(0, 8)}` : assignedSubmitId());
  if (ask.newSession !== undefined) {
    const bad = checkUserSessionId(fork);
    if (bad !== null) throw new ConfigError(bad.replace("--session", "the new run's id"));
  }
  const now = options.now ?? (() => new Date());
  const r = await readProjection(storage, name);
  const origin = r.session(session);
  if (origin === undefined) throw new ConfigError(`run "${session}" does not exist in database "${name}".`);
  const refused = (message: string): ForkOutcome => ({ status: "refused", message, request: id, session: fork });
  const existing = r.session(fork);
  if (existing !== undefined) {
    if (existing.fork_of?.session === session && existing.fork_of.round === ask.atRound && existing.forming === null) return { status: "already", message: `run ${fork} is already the fork of run ${session} after round ${ask.atRound}`, request: id, session: fork };
    if (existing.fork_of?.session !== session || existing.fork_of.round !== ask.atRound) return refused(`run ${fork} already exists in database "${name}"; choose another id for the fork`);
  } else if (await startPending(storage, name, fork)) {
    return refused(`a run ${fork} was submitted to database "${name}" and waits to start; choose another id for the fork`);
  }
  if (origin.forming !== null) return refused(`run ${session} is a fork still being copied; fork it once its copy is complete`);
  const last = lastAcceptedRound(origin);
  if (ask.atRound > last) return refused(`run ${session} has ${last} accepted round${last === 1 ? "" : "s"}; the round to fork after must be between 0 and ${last}`);
  const payload: ForkRequest = { origin: session, at_round: ask.atRound, reason };
  await postOnce(storage, name, { id, session: fork, kind: FORK_KIND, payload, at: now().toISOString() });
  const what = `fork of run ${session} after round ${ask.atRound} as run ${fork}`;
  if (!(await ownerLive(storage, name))) {
    return { status: "waiting", message: `the ${what} waits in the mailbox: no live worker owns "${name}" now; the next owner makes it before its runs do anything`, request: id, session: fork };
  }
  const waitMs = options.waitMs ?? 30_000;
  if (waitMs <= 0) return { status: "unconfirmed", message: `the ${what} was posted; its owner makes it`, request: id, session: fork };
  const answer = await followUntil(storage, name, r, waitMs, (e) => (e.kind === "post_refused" && e.body.id === id) || e.identity === identity.forkCompleted(fork));
  if (answer === null) return { status: "unconfirmed", message: `the ${what} was posted, but the owner did not complete it within ${Math.round(waitMs / 1000)} s; it stays in the mailbox until it is complete`, request: id, session: fork };
  return answer.kind === "post_refused"
    ? refused(`the owner refused the ${what}: ${(answer as LogEvent<"post_refused">).body.reason}`)
    : { status: "applied", message: `${what}: done`, request: id, session: fork };
}

/**
 * The last round of `s` with an accepted patch: a round stays open until a patch is accepted, so
 * every round before the last prepared one was (old rounds may have left the projection's history;
 * the owner checks the exact round against the log).
 */
function lastAcceptedRound(s: NonNullable<ReturnType<Reducer["session"]>>): number {
  const last = [...s.turns.values()].find((t) => t.n === s.turn_count);
  const decided = last !== undefined ? last.accepted !== null : s.open_turn === null;
  return decided ? s.turn_count : s.turn_count - 1;
}

/**
 * Posts `message`; a retry of the same request (same id, run, kind and payload, another time) that
 * still waits in the mailbox is the same message. Throws ConfigError when the id was used for
 * another request.
 */
export async function postOnce(storage: Storage, name: string, message: MailboxMessage): Promise<void> {
  try {
    await storage.post(name, message);
  } catch (err) {
    if (!(err instanceof StorageRejected && err.reason === "conflict")) throw err;
    const reader = await storage.reader(name);
    let same = false;
    try {
      same = ((await reader.pending?.()) ?? []).some((m) => m.id === message.id && m.session === message.session && m.kind === message.kind && canonicalEqual(m.payload, message.payload));
    } finally {
      await reader.close().catch(() => undefined);
    }
    if (!same) throw new ConfigError(`the request id "${message.id}" was already used for another request to database "${name}"; use a new id`);
  }
}

/** Whether event `e` is the owner's answer to request `id` (its event, or its refusal). */
function answers(e: LogEvent, session: string, id: string, request: SteerRequest): boolean {
  if (e.session !== session) return false;
  if (e.kind === "post_refused") return e.body.id === id;
  switch (request.action) {
    case "pause":
    case "unpause":
      return e.identity === identity.steer(session, id);
    case "cancel":
      return e.identity === identity.cancel(session) || e.kind === "run_ended";
    case "approve":
    case "deny":
      return e.identity === identity.approvalDecided(session, request.cell_id);
  }
}

/**
 * Follows `name`'s log from `r`'s head (folding into `r`) until `match` finds an event, or `waitMs`
 * passes (null). Polls a reader every 100 ms: a request's answer is one commit away.
 */
export async function followUntil(storage: Storage, name: string, r: Reducer, waitMs: number, match: (e: LogEvent) => boolean): Promise<LogEvent | null> {
  const deadline = Date.now() + waitMs;
  for (;;) {
    let reader;
    try {
      reader = await storage.reader(name);
    } catch (err) {
      if (!hasCode(err, "not_found")) throw err;
      reader = null;
    }
    if (reader !== null) {
      try {
        for (;;) {
          const batch = await reader.read(r.headSeq, 5000);
          if (batch.length === 0) break;
          const events = batch.map((e) => parseLogEvent(e));
          r.apply(events);
          const hit = events.find(match);
          if (hit !== undefined) return hit;
        }
      } finally {
        await reader.close().catch(() => undefined);
      }
    }
    if (Date.now() >= deadline) return null;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
