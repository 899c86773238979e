/**
 * The streams of one database and the records in them. Every stream is `application/json`; each
 * record is one message, a JSON object with `v: 1`. What is read from the network is validated here
 * (zod), once, before anything folds it.
 *
 * Streams of database NAME, under the base URL:
 *
 *   NAME/log      the event log. Written only with the producer headers (one producer id for every
 *                 owner), so the server fences a superseded owner. Records, per owner epoch E:
 *                   (E, 0) claim   {t:"claim", e, s:0, n: nonce, host, pid, at}
 *                   (E, 1) opened  {t:"opened", e, s:1}
 *                   (E, s) commit  {t:"commit", e, s >= 2, f: first seq, c: count, h: sha256(ev), ev}
 *                 `ev` is the batch's JSON text (an array of events without seq) carried as a string,
 *                 so the server's re-serialization of the message cannot change a byte of it.
 *   NAME/owners   one notice per completed claim {t:"claim", e, n}: what an owner's watch follows to
 *                 learn promptly that it was fenced, without re-reading the log.
 *   NAME/mail     the mailbox: {t:"post", m: message} from anyone, {t:"ack", upTo, e} from owners.
 *   NAME/snaps    the snapshot index: {t:"snapshot", seq, path, digest, cut} per snapshot written.
 *   NAME/snap/ID  one snapshot, created closed: {seq, digest, ids: [segment paths], data}.
 *   NAME/ids/ID   the identities of the events in (from, to], created closed: {from, to, count, h, gz}.
 *   _databases    the catalog, {t:"db", name} per database created (for `list`).
 *
 * Database names match DATABASE_NAME (letters, digits, ".", "_", "-"; never starting with "_"), so
 * they are URL-safe path segments and never collide with `_databases`.
 */
import { createHash } from "node:crypto";
import { z } from "zod";
import type { MailboxMessage } from "../../src/storage/contract.js";

/** The producer id every owner of every database appends to its log with. */
export const PRODUCER_ID = "cairn-owner";

/** The stream paths of database `name`. */
export function streamsOf(name: string): { log: string; owners: string; mail: string; snaps: string; snap: (id: string) => string; ids: (id: string) => string } {
  return {
    log: `${name}/log`,
    owners: `${name}/owners`,
    mail: `${name}/mail`,
    snaps: `${name}/snaps`,
    snap: (id) => `${name}/snap/${id}`,
    ids: (id) => `${name}/ids/${id}`,
  };
}

/** The catalog stream (`list`). */
export const CATALOG = "_databases";

/** sha256 of `text`, hex. */
export function sha256(text: string): string {
  return createHash("sha256").update(text).digest("hex");
}

const epoch = z.number().int().min(1).max(Number.MAX_SAFE_INTEGER);
const count = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const hex64 = z.string().regex(/^[0-9a-f]{64}$/);

const Claim = z.strictObject({ v: z.literal(1), t: z.literal("claim"), e: epoch, s: z.literal(0), n: z.string().min(1).max(64), host: z.string().max(300), pid: count, at: z.string().max(64) });
const Opened = z.strictObject({ v: z.literal(1), t: z.literal("opened"), e: epoch, s: z.literal(1) });
const Commit = z.strictObject({ v: z.literal(1), t: z.literal("commit"), e: epoch, s: z.number().int().min(2).max(Number.MAX_SAFE_INTEGER), f: z.number().int().min(1), c: z.number().int().min(1), h: hex64, ev: z.string() });
const LogRecordSchema = z.discriminatedUnion("t", [Claim, Opened, Commit]);

export type ClaimRecord = z.infer<typeof Claim>;
export type OpenedRecord = z.infer<typeof Opened>;
export type CommitRecord = z.infer<typeof Commit>;
export type LogRecord = z.infer<typeof LogRecordSchema>;

/**
 * Parses one message of the log stream. Throws an Error saying what is wrong when it is not a record
 * of this adapter, or when a commit's events do not match their digest (damaged or altered).
 */
export function parseLogRecord(message: unknown): LogRecord {
  const parsed = LogRecordSchema.safeParse(message);
  if (!parsed.success) throw new Error(`not a log record of this adapter (${parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")})`);
  const r = parsed.data;
  if (r.t === "commit" && sha256(r.ev) !== r.h) throw new Error(`the events of the commit at producer seq (${r.e}, ${r.s}) do not match their digest`);
  return r;
}

/** The text of a claim record. */
export function claimRecord(e: number, nonce: string, host: string, pid: number, at: string): ClaimRecord {
  return { v: 1, t: "claim", e, s: 0, n: nonce, host, pid, at };
}

/** The text of a commit record for the batch whose JSON text is `ev`, `count` events from seq `first`. */
export function commitRecord(e: number, s: number, first: number, count: number, ev: string): CommitRecord {
  return { v: 1, t: "commit", e, s, f: first, c: count, h: sha256(ev), ev };
}

const Notice = z.object({ v: z.literal(1), t: z.literal("claim"), e: epoch, n: z.string() });

/** The epoch of an owners-stream notice, or null for anything else (ignored). */
export function noticeEpoch(message: unknown): number | null {
  const parsed = Notice.safeParse(message);
  return parsed.success ? parsed.data.e : null;
}

const Message = z.strictObject({ id: z.string(), session: z.string(), kind: z.string(), payload: z.unknown(), at: z.string() });
const Post = z.object({ v: z.literal(1), t: z.literal("post"), m: Message });
const Ack = z.object({ v: z.literal(1), t: z.literal("ack"), upTo: z.number().int().min(Number.MIN_SAFE_INTEGER).max(Number.MAX_SAFE_INTEGER), e: z.number().int() });
const MailRecordSchema = z.discriminatedUnion("t", [Post, Ack]);

export type MailRecord = { readonly t: "post"; readonly m: MailboxMessage } | { readonly t: "ack"; readonly upTo: number; readonly e: number };

/**
 * Parses one message of the mail stream, or null when it is not a mail record. Anyone may append to
 * a mailbox, so a message that is not a record is ignored by every reader alike, never an error.
 */
export function parseMailRecord(message: unknown): MailRecord | null {
  const parsed = MailRecordSchema.safeParse(message);
  if (!parsed.success) return null;
  const r = parsed.data;
  if (r.t === "ack") return { t: "ack", upTo: r.upTo, e: r.e };
  return r.m.payload === undefined ? null : { t: "post", m: r.m as MailboxMessage };
}

/** A frame of the log fold, as a snapshot's cut stores it (fold.ts). */
const FrameSchema = z.strictObject({
  t: z.enum(["claim", "opened", "commit"]),
  e: epoch,
  s: count,
  proven: z.boolean(),
  n: z.string().optional(),
  f: z.number().int().min(1).optional(),
  c: z.number().int().min(1).optional(),
  h: hex64.optional(),
});

/** The state of the log fold at an offset (fold.ts FoldState), as stored in a snapshot's cut. */
export const FoldStateSchema = z.strictObject({ head: count, maxEpoch: count, frames: z.array(FrameSchema).max(10_000) });

const IndexEntry = z.object({
  v: z.literal(1),
  t: z.literal("snapshot"),
  seq: z.number().int().min(1),
  path: z.string().min(1).max(500),
  digest: hex64,
  cut: z.strictObject({ offset: z.string().min(1).max(300), state: FoldStateSchema }),
});
export type IndexEntry = z.infer<typeof IndexEntry>;

/** An entry of the snapshot index, or null for anything else (an entry is only a pointer: its target is checked). */
export function parseIndexEntry(message: unknown): IndexEntry | null {
  const parsed = IndexEntry.safeParse(message);
  return parsed.success ? parsed.data : null;
}

const SnapshotBody = z.object({ v: z.literal(1), seq: z.number().int().min(1), digest: hex64, ids: z.array(z.string().min(1).max(500)), data: z.string() });
export type SnapshotBody = z.infer<typeof SnapshotBody>;

/** Parses a snapshot stream's one message; throws an Error naming what is wrong. */
export function parseSnapshotBody(message: unknown): SnapshotBody {
  const parsed = SnapshotBody.safeParse(message);
  if (!parsed.success) throw new Error(`not a snapshot of this adapter (${parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")})`);
  return parsed.data;
}

const SegmentBody = z.object({ v: z.literal(1), from: count, to: count, count, h: hex64, gz: z.string() });
export type SegmentBody = z.infer<typeof SegmentBody>;

/** Parses an identity segment's one message; throws an Error naming what is wrong. */
export function parseSegmentBody(message: unknown): SegmentBody {
  const parsed = SegmentBody.safeParse(message);
  if (!parsed.success) throw new Error(`not an identity segment of this adapter (${parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")})`);
  return parsed.data;
}

const CatalogEntry = z.object({ v: z.literal(1), t: z.literal("db"), name: z.string() });

/** The database name of a catalog entry, or null. */
export function catalogName(message: unknown): string | null {
  const parsed = CatalogEntry.safeParse(message);
  return parsed.success ? parsed.data.name : null;
}
