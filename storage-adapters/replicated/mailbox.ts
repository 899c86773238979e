/**
 * Posting to a database's mailbox without taking ownership: never touches the epoch. One read, then
 * one transaction guarded by the mailbox counter's mod revision and the id's absence, retried when a
 * concurrent poster won the race. The owner drains and acks (database.ts).
 */
import { MAILBOX_LIMIT, type MailboxMessage } from "../../src/storage/contract.js";
import { DatabaseNotFound } from "../../src/storage/errors.js";
import { isValidDatabaseName, mailboxFull, messageConflict, prepareMessage, sameMessage } from "../../src/storage/semantics.js";
import type { Context } from "./context.js";
import { keysOf } from "./layout.js";
import { absent, count, get, kvsOf, modIs, present, put, valueOf } from "./ops.js";

/** Posts attempts before giving up under contention (each lost race means another post landed). */
const MAX_ATTEMPTS = 50;

/** `Storage.post` for the replicated adapter. */
export async function postMessage(ctx: Context, name: string, message: MailboxMessage): Promise<void> {
  if (!isValidDatabaseName(name)) throw new DatabaseNotFound(name);
  const copy = prepareMessage(message);
  const keys = keysOf(name);
  try {
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      const res = await ctx.txn([], [get(keys.epoch), get(keys.mseq), get(keys.mailId(copy.id)), count(keys.mailPrefix)]);
      if (valueOf(res.responses, 0) === null) throw new DatabaseNotFound(name);
      const mseqKv = kvsOf(res.responses, 1)[0];
      const idValue = valueOf(res.responses, 2);
      if (idValue !== null) {
        const mseq = Number(idValue);
        const existing = await ctx.txn([], [get(keys.mail(mseq))]);
        const stored = valueOf(existing.responses, 0);
        if (stored === null) continue; // acknowledged meanwhile: read again
        if (sameMessage(JSON.parse(stored) as MailboxMessage, copy)) return;
        throw messageConflict(name, copy.id);
      }
      if (Number(res.responses[3]?.response_range.count ?? 0) >= MAILBOX_LIMIT) throw mailboxFull(name);
      const next = Number(mseqKv ? mseqKv.value.toString("utf8") : "0") + 1;
      const done = await ctx.txn(
        [present(keys.epoch), modIs(keys.mseq, mseqKv ? mseqKv.mod_revision : "0"), absent(keys.mailId(copy.id))],
        [put(keys.mseq, String(next)), put(keys.mail(next), JSON.stringify(copy)), put(keys.mailId(copy.id), String(next))],
      );
      if (done.succeeded) return;
    }
  } catch (err) {
    throw ctx.fail(err, "post to", name);
  }
  throw ctx.fail(new Error(`${MAX_ATTEMPTS} concurrent posts won the race`), "post to", name);
}
