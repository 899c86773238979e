/**
 * The storage semantics every adapter shares, as pure functions: database names, read ranges, batch
 * validation, identities (duplicates inside a batch and in the log), mailbox messages (validation,
 * "same content", conflict, the MAILBOX_LIMIT bound) and the lost acknowledgement. Every adapter (in
 * this repository or outside it) imports these, so all of them refuse exactly the same inputs with
 * exactly the same errors; the conformance suite (./conformance/) checks that they do.
 *
 * Pure: no I/O, no clock.
 */
import { z } from "zod";
import { canonicalEqual, isJsonValue, MAX_JSON_DEPTH } from "../state/canonical.js";
import { parseNewEvent, type NewEvent } from "../state/events.js";
import { ConfigError } from "../errors.js";
import { StorageFailure, StorageRejected } from "./errors.js";
import { MAILBOX_LIMIT, type MailboxMessage } from "./contract.js";

/** Database names every adapter accepts: a file name on any filesystem, and an etcd key segment. */
export const DATABASE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/** True when `name` is a valid database name (see DATABASE_NAME). */
export function isValidDatabaseName(name: string): boolean {
  return DATABASE_NAME.test(name);
}

/** Throws a ConfigError naming the rule when `name` is not a valid database name. */
export function checkDatabaseName(name: string): void {
  if (typeof name !== "string" || !isValidDatabaseName(name)) {
    throw new ConfigError(`invalid database name ${JSON.stringify(name)}: use 1 to 128 characters matching ${DATABASE_NAME.source}.`);
  }
}

/**
 * The StorageFailure of a commit whose `commit:after-durable` fault threw: the batch is durable but
 * the caller never learned it. The adapter poisons the handle before throwing this.
 */
export function lostAcknowledgement(name: string, cause: unknown): StorageFailure {
  return new StorageFailure(
    `commit to database "${name}" may or may not be durable (the acknowledgement was lost); this handle is unusable: reopen and read the log.`,
    { cause },
  );
}

/**
 * Validates a batch before anything is written and returns the parsed events (zod's output, not the
 * caller's objects; adapters serialize them to JSON before the commit resolves and keep no reference).
 * Throws StorageRejected `invalid` for an empty batch or a malformed event (zod refuses what JSON
 * cannot hold: NaN, Infinity, dates, undefined in arrays), and `duplicate_identity` (listing each
 * repeated identity once) when an identity appears twice in it.
 */
export function prepareBatch(events: readonly NewEvent[]): NewEvent[] {
  if (!Array.isArray(events) || events.length === 0) {
    throw new StorageRejected("invalid", "refused an empty batch: commit at least one event.");
  }
  const copies: NewEvent[] = [];
  for (const [i, raw] of events.entries()) {
    try {
      copies.push(parseNewEvent(raw));
    } catch (cause) {
      throw new StorageRejected("invalid", `refused the batch: event ${i} is not a valid event (${describe(cause)}).`, { cause });
    }
  }
  const repeated = duplicatesInBatch(copies.map((e) => e.identity));
  if (repeated.length > 0) {
    throw duplicateIdentity(repeated, "twice in the batch");
  }
  return copies;
}

/** Identities that occur more than once in `identities`, each listed once, in first-seen order. */
export function duplicatesInBatch(identities: readonly string[]): string[] {
  const seen = new Set<string>();
  const repeated = new Set<string>();
  for (const id of identities) {
    if (seen.has(id)) repeated.add(id);
    seen.add(id);
  }
  return [...repeated];
}

/**
 * The StorageRejected `duplicate_identity` every adapter throws, listing the identities; `where` is
 * "in the log" or "twice in the batch".
 */
export function duplicateIdentity(identities: readonly string[], where: "in the log" | "twice in the batch"): StorageRejected {
  const shown = identities.slice(0, 5).join(", ") + (identities.length > 5 ? `, ... (${identities.length} in all)` : "");
  return new StorageRejected(
    "duplicate_identity",
    `refused the whole batch: identity ${where}: ${shown}. Nothing was written; read the log to see the existing events.`,
    { identities },
  );
}

/** Rejects a negative or fractional `afterSeq`/`limit` (shared by every adapter's read). */
export function checkRange(afterSeq: number, limit: number | undefined): void {
  if (!Number.isSafeInteger(afterSeq) || afterSeq < 0) {
    throw new StorageRejected("invalid", `read: afterSeq must be a non-negative integer, got ${String(afterSeq)}.`);
  }
  if (limit !== undefined && (!Number.isSafeInteger(limit) || limit < 0)) {
    throw new StorageRejected("invalid", `read: limit must be a non-negative integer, got ${String(limit)}.`);
  }
}

/** Rejects an `ack(upTo)` bound that is not an integer (shared by every adapter's ack). */
export function checkAckBound(upTo: number): void {
  if (!Number.isSafeInteger(upTo)) throw new StorageRejected("invalid", `ack: upTo must be an integer, got ${String(upTo)}.`);
}

const Message = z.strictObject({
  id: z.string().min(1).max(200),
  session: z.string().min(1).max(200),
  kind: z.string().min(1).max(100),
  payload: z.unknown(),
  at: z.string().min(1),
});

/**
 * Validates a mailbox message and returns a JSON copy of it. Throws StorageRejected `invalid` for a
 * malformed message or a payload that is not JSON.
 */
export function prepareMessage(message: MailboxMessage): MailboxMessage {
  let copy: unknown;
  try {
    if (message === null || typeof message !== "object" || message.payload === undefined) {
      throw new Error("the message and its payload are required");
    }
    copy = JSON.parse(JSON.stringify(message)) as unknown;
    const parsed = Message.parse(copy) as MailboxMessage;
    if (!isJsonValue(parsed.payload)) throw new Error(`the payload is nested deeper than ${MAX_JSON_DEPTH} levels`);
    return parsed;
  } catch (cause) {
    throw new StorageRejected("invalid", `refused the mailbox message: ${describe(cause)}.`, { cause });
  }
}

/** True when two messages with the same id carry the same content (payload compared as canonical JSON). */
export function sameMessage(a: MailboxMessage, b: MailboxMessage): boolean {
  return a.id === b.id && a.session === b.session && a.kind === b.kind && a.at === b.at && canonicalEqual(a.payload, b.payload);
}

/** The StorageRejected `conflict` for a message id already posted with other content. */
export function messageConflict(name: string, id: string): StorageRejected {
  return new StorageRejected(
    "conflict",
    `refused the mailbox message "${id}" for database "${name}": a different message was already posted with this id. Use a new id.`,
  );
}

/** The StorageRejected `backlog_full` for a mailbox holding MAILBOX_LIMIT unacknowledged messages. */
export function mailboxFull(name: string): StorageRejected {
  return new StorageRejected(
    "backlog_full",
    `the mailbox of database "${name}" holds ${MAILBOX_LIMIT} unacknowledged messages; retry after its owner drains it.`,
  );
}

function describe(cause: unknown): string {
  if (cause instanceof z.ZodError) {
    return cause.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ");
  }
  return cause instanceof Error ? cause.message : String(cause);
}
