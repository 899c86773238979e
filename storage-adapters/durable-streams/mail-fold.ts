/**
 * The mailbox fold: a database's mailbox is the mail stream read in order, by the same rules as the
 * memory adapter's (the reference), decided from the records alone so that every reader agrees. Pure.
 *
 *  - a post whose id is among the unacknowledged messages is a no-op when its content is the same,
 *    and void ("conflict") when it differs;
 *  - a post that finds MAILBOX_LIMIT unacknowledged messages is void ("full");
 *  - any other post is added with the next mseq;
 *  - an ack removes the messages with mseq <= upTo that exist at that point (an upTo beyond the last
 *    mseq does not reach messages posted later, as in the memory adapter).
 *
 * A post is written without the producer headers (posters never take ownership), so a retried post
 * can land twice: the second copy is a no-op by the first rule.
 */
import { MAILBOX_LIMIT, type MailboxMessage, type PostedMessage } from "../../src/storage/contract.js";
import { sameMessage } from "../../src/storage/semantics.js";
import type { MailRecord } from "./records.js";

export interface MailState {
  lastMseq: number;
  /** Unacknowledged messages by id, in mseq order (a Map keeps insertion order). */
  readonly unacked: Map<string, { readonly mseq: number; readonly message: MailboxMessage }>;
}

/** What became of one post record. */
export type PostVerdict = { readonly id: string; readonly message: MailboxMessage } & ({ readonly kind: "added"; readonly mseq: number } | { readonly kind: "same" | "conflict" | "full" });

export function emptyMail(): MailState {
  return { lastMseq: 0, unacked: new Map() };
}

/** Applies one record; returns the verdict of a post (null for an ack). */
export function applyMail(state: MailState, r: MailRecord): PostVerdict | null {
  if (r.t === "ack") {
    const level = Math.min(r.upTo, state.lastMseq);
    for (const [id, entry] of state.unacked) {
      if (entry.mseq > level) break;
      state.unacked.delete(id);
    }
    return null;
  }
  const existing = state.unacked.get(r.m.id);
  if (existing !== undefined) return { id: r.m.id, message: r.m, kind: sameMessage(existing.message, r.m) ? "same" : "conflict" };
  if (state.unacked.size >= MAILBOX_LIMIT) return { id: r.m.id, message: r.m, kind: "full" };
  state.lastMseq += 1;
  state.unacked.set(r.m.id, { mseq: state.lastMseq, message: r.m });
  return { id: r.m.id, message: r.m, kind: "added", mseq: state.lastMseq };
}

/** The unacknowledged messages, as fresh copies (a caller may mutate them). */
export function pendingMessages(state: MailState): PostedMessage[] {
  return [...state.unacked.values()].map((e) => ({ ...(structuredClone(e.message) as MailboxMessage), mseq: e.mseq }));
}
