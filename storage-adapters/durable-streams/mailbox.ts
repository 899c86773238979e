/**
 * The mailbox stream, read incrementally (the fold's rules: mail-fold.ts), and posting to it.
 *
 * A post is appended without the producer headers (posters never take ownership) and then read back:
 * a poster racing another one with the same id learns which came first from the stream's order, not
 * from its own earlier reading. An ack is appended by the owner after a fence check; a fenced owner's
 * ack can only race the new owner's open, and then it covers messages whose events it committed
 * before the fence (the harness acks only after committing), which the new owner reads in the log.
 */
import { DatabaseNotFound, StorageFailure } from "../../src/storage/errors.js";
import { MAILBOX_LIMIT, type MailboxMessage } from "../../src/storage/contract.js";
import { mailboxFull, messageConflict, sameMessage } from "../../src/storage/semantics.js";
import { DsTransportError, START, type Wire } from "./http.js";
import { Lock } from "./log-view.js";
import { applyMail, emptyMail, type MailState, type PostVerdict } from "./mail-fold.js";
import { parseMailRecord, streamsOf } from "./records.js";

/** Waits `ms`. */
export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** One process's view of a database's mail stream. */
export class MailView {
  readonly state: MailState = emptyMail();
  end = START;
  readonly lock = new Lock();
  private readonly path: string;

  constructor(
    private readonly wire: Wire,
    readonly name: string,
  ) {
    this.path = streamsOf(name).mail;
  }

  /** Reads and folds the mail stream to its tail; returns the verdicts of the posts read. Takes the lock. */
  catchUp(): Promise<PostVerdict[]> {
    return this.lock.run(() => this.catchUpLocked());
  }

  /** As catchUp, for a holder of the lock. Throws DatabaseNotFound when the stream does not exist. */
  async catchUpLocked(): Promise<PostVerdict[]> {
    const verdicts: PostVerdict[] = [];
    for (;;) {
      const res = await this.wire.read(this.path, this.end);
      if (res.kind === "not-found" || res.kind === "gone") throw new DatabaseNotFound(this.name);
      if (res.kind === "timeout") return verdicts;
      for (const m of res.messages) {
        const record = parseMailRecord(m);
        if (record === null) continue;
        const verdict = applyMail(this.state, record);
        if (verdict !== null) verdicts.push(verdict);
      }
      this.end = res.next;
      // As the log's (log-view.ts): only an empty answer ends the read.
      if (res.messages.length === 0) return verdicts;
    }
  }

  /** Appends `record` (a lost answer is retried for up to `retryMs`: a second copy changes nothing). */
  async append(record: unknown, retryMs: number): Promise<void> {
    const body = JSON.stringify(record);
    const deadline = Date.now() + retryMs;
    for (let attempt = 0; ; attempt++) {
      try {
        const res = await this.wire.append(this.path, body);
        if (res.kind === "appended") return;
        if (res.kind === "not-found" || res.kind === "gone") throw new DatabaseNotFound(this.name);
        if (res.kind !== "rate-limited") throw new StorageFailure(`database "${this.name}": the mail stream refused an append (${res.kind}).`);
      } catch (err) {
        if (!(err instanceof DsTransportError) || Date.now() > deadline) throw err;
      }
      await sleep(Math.min(1000, 50 * 2 ** attempt));
    }
  }

  /**
   * Posts `message` (validated by the caller): a no-op when the same message is unacknowledged,
   * StorageRejected `conflict` or `backlog_full` as the fold decides at the post's place in the stream.
   */
  post(message: MailboxMessage, retryMs: number): Promise<void> {
    return this.lock.run(async () => {
      await this.catchUpLocked();
      const existing = this.state.unacked.get(message.id);
      if (existing !== undefined) {
        if (sameMessage(existing.message, message)) return;
        throw messageConflict(this.name, message.id);
      }
      if (this.state.unacked.size >= MAILBOX_LIMIT) throw mailboxFull(this.name);
      await this.append({ v: 1, t: "post", m: message }, retryMs);
      // Read back what became of it (a racing poster may have come first).
      for (let attempt = 0; attempt < 3; attempt++) {
        const mine = (await this.catchUpLocked()).filter((v) => v.id === message.id && sameMessage(v.message, message));
        if (mine.some((v) => v.kind === "added" || v.kind === "same")) return;
        if (mine.some((v) => v.kind === "conflict")) throw messageConflict(this.name, message.id);
        if (mine.some((v) => v.kind === "full")) throw mailboxFull(this.name);
      }
      throw new StorageFailure(`database "${this.name}": the post of "${message.id}" was acknowledged but is not in the mail stream.`);
    });
  }
}
