/**
 * Runs submitted to whichever process owns a database (`cairn submit`, and `cairn run` when a live
 * worker holds the database): a start request is a mailbox message the owner turns into a run.
 *
 * Session ids: Cairn assigns `s1`, `s2`, ... and, for a submit without --session, `s-` + 8 hex digits
 * (both forms are reserved for it); an id a user
 * chooses (`--session ID`) starts with a letter, holds letters, digits, `.`, `_` and `-`, is at most 64
 * characters, and is never of the reserved form, so the two never collide.
 *
 * What a request may set: the goal, validators and budgets. The worker's model, settings and working
 * directory (its `--cwd`) apply: a submitter never chooses where or with which credentials code runs.
 */
import { randomBytes } from "node:crypto";
import { z } from "zod";
import type { Logger } from "pino";
import { Budgets } from "../state/events.js";
import { ApprovalRules, type ApprovalRule } from "../state/approval.js";
import { ConfigError } from "../errors.js";

/** The mailbox `kind` of a start request (no outside observation may use it). */
export const START_REQUEST_KIND = "cairn.start";

/** The mailbox id of the start request for `session` (one per session: a retry is the same message). */
export const startRequestId = (session: string): string => `start:${session}`;

const USER_SESSION = /^[A-Za-z][A-Za-z0-9._-]{0,63}$/;
/** Assigned by the owner (`s7`) or by `cairn submit` without --session (`s-1f2e3d4c`). */
const ASSIGNED_SESSION = /^s(\d+$|-)/;

/** An id for a submitted run whose submitter chose none (the `s-` form, reserved for Cairn). */
export const assignedSubmitId = (): string => `s-${randomBytes(4).toString("hex")}`;

/** True for an id of a form only Cairn assigns. */
export const isAssignedId = (id: string): boolean => ASSIGNED_SESSION.test(id) && /^s(\d+|-[0-9a-f]{8})$/.test(id);

/** Why `id` cannot be a session id a user chooses, or null when it can. */
export function checkUserSessionId(id: string): string | null {
  if (ASSIGNED_SESSION.test(id)) return `--session "${id}" has the form Cairn reserves for the ids it assigns (s followed by digits, or s-); choose another, e.g. job-${id.slice(1)}.`;
  if (!USER_SESSION.test(id)) return `--session "${id}" is not a valid run id: start with a letter, then letters, digits, ".", "_" or "-" (at most 64 characters).`;
  return null;
}

/** The payload of a start request. */
export const StartRequest = z.strictObject({
  goal: z.string().min(1).max(100_000),
  validators: z.array(z.array(z.string()).min(1)).max(32).default([]),
  budgets: Budgets.default({}),
  /** The run asks for the host's network in its cells. */
  cell_network: z.literal("host").optional(),
  /** Cells matching one of these rules wait for a person's approval. */
  approval: ApprovalRules.optional(),
});
export type StartRequest = z.infer<typeof StartRequest>;

/** What starting a submitted run needs from the harness. */
export interface StartHost {
  session(id: string): { goal: string; validators: readonly (readonly string[])[]; budgets: Budgets; cell_network?: "host"; approval?: readonly ApprovalRule[] } | undefined;
  start(options: { id: string; goal: string; validators: string[][]; budgets: Budgets; cellNetwork?: "host"; approval?: readonly ApprovalRule[] }): Promise<string>;
  readonly logger: Logger;
}

/** A start request drained from the mailbox: starts the run unless it exists already. */
export async function startRequested(m: { session: string; id: string; payload: unknown }, host: StartHost): Promise<void> {
  const parsed = StartRequest.safeParse(m.payload);
  const bad = isAssignedId(m.session) ? null : checkUserSessionId(m.session);
  if (!parsed.success || bad !== null || m.id !== startRequestId(m.session)) {
    host.logger.warn({ session: m.session, id: m.id }, "dropped a malformed start request from the mailbox");
    return;
  }
  const existing = host.session(m.session);
  if (existing !== undefined) {
    if (!sameRequest(parsed.data, existing)) host.logger.warn({ session: m.session }, "dropped a start request for a run that exists with another goal or settings");
    return;
  }
  const { goal, validators, budgets, cell_network, approval } = parsed.data;
  const id = await host.start({ id: m.session, goal, validators, budgets, ...(cell_network !== undefined ? { cellNetwork: cell_network } : {}), ...(approval !== undefined ? { approval } : {}) });
  host.logger.info({ session: id }, "started a submitted run");
}

/** True when a run created from `request` matches it (same goal, validators and budgets). */
export function sameRequest(a: StartRequest, b: { goal: string; validators: readonly (readonly string[])[]; budgets: Budgets; cell_network?: "host"; approval?: readonly ApprovalRule[] }): boolean {
  return (
    a.goal === b.goal &&
    JSON.stringify(a.validators) === JSON.stringify(b.validators) &&
    JSON.stringify(sortBudgets(a.budgets)) === JSON.stringify(sortBudgets(b.budgets)) &&
    (a.cell_network ?? null) === (b.cell_network ?? null) &&
    JSON.stringify(a.approval ?? []) === JSON.stringify(b.approval ?? [])
  );
}

function sortBudgets(b: Budgets): Budgets {
  return { ...(b.max_rounds !== undefined ? { max_rounds: b.max_rounds } : {}), ...(b.max_tokens !== undefined ? { max_tokens: b.max_tokens } : {}), ...(b.max_wall_seconds !== undefined ? { max_wall_seconds: b.max_wall_seconds } : {}) };
}

/**
 * The id of a new run: the user's (validated, and new in this database), or the next `sN`. Allocated
 * synchronously by the caller, so concurrent starts never pick the same id.
 */
export function chooseSessionId(wanted: string | undefined, db: string, log: { session(id: string): unknown; projection(): { order: readonly string[] } }, allocated: number): string {
  if (wanted !== undefined) {
    const bad = isAssignedId(wanted) ? null : checkUserSessionId(wanted);
    if (bad !== null) throw new ConfigError(bad);
    if (log.session(wanted) !== undefined) throw new ConfigError(`session "${wanted}" already exists in database "${db}".`);
    return wanted;
  }
  return `s${Math.max(log.projection().order.length, allocated) + 1}`;
}
