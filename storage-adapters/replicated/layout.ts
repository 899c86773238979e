/**
 * The key layout of a Cairn database in etcd, and how log records are encoded.
 *
 * Every key of database `<name>` lives under `cairn/db/<name>/` (so an etcd role granting that prefix
 * grants exactly that database):
 *
 *   cairn/db/<name>/epoch                 ownership epoch (decimal). Opening advances it in one txn.
 *   cairn/db/<name>/uid                   the database's id (random, written once: when it is created,
 *                                         or at the first open of one created before ids existed). A
 *                                         local copy is stamped with it (open.ts, ownCopy).
 *   cairn/db/<name>/head                  highest committed seq (decimal; "0" for an empty log).
 *   cairn/db/<name>/log/<first seq, 16 digits>
 *                                         one committed batch: a header line (JSON: first, last,
 *                                         epoch, token, hash) then the events as a JSON array.
 *   cairn/db/<name>/ident/<identity>      no longer written. Earlier versions wrote one per event (its
 *                                         seq) and compared it absent in every commit; compaction still
 *                                         deletes those up to its cut.
 *   cairn/db/<name>/mseq                  the last mailbox sequence number handed out (decimal).
 *   cairn/db/<name>/mail/<mseq, 16 digits> a posted, not yet acknowledged, mailbox message (JSON).
 *   cairn/db/<name>/mailid/<id>           {mseq, digest} of every message id ever posted (dedupe).
 *   cairn/db/<name>/liveness              the owner's liveness lease (JSON: epoch, lease id, host, pid, and the
 *                                         earlier owners' leases it has not yet seen gone), attached
 *                                         to that etcd lease: gone when the lease expires or is revoked.
 *   cairn/db/<name>/waitfor/<lease id>    an earlier owner's lease (JSON: lease id, host, pid) that an
 *                                         owner's claim handed over (open.ts claim, in the claim's
 *                                         transaction; liveness.ts handOver for the rest), attached
 *                                         to that very lease: gone exactly when it is. Openers wait
 *                                         for these too.
 *   cairn/db/<name>/snap                  the latest snapshot's pointer (JSON: seq, digest, chunks,
 *                                         cut, cutHash); written last, in one txn guarded by the epoch.
 *   cairn/db/<name>/snapdata/<seq>/<i>    the snapshot text, in chunks of at most 1 MiB.
 *   cairn/db/<name>/idarch/<from>/<to>/<part>
 *                                         the identities of the events in [from, to] = (previous cut,
 *                                         cut], sorted, newline-joined, gzipped: one segment per
 *                                         snapshot that moved the cut. The range is in the key so that
 *                                         two snapshots racing from one previous cut never overwrite
 *                                         each other's segment; the next compaction deletes the loser's
 *                                         (snapshots.ts `orphanSegments` argues why only the loser's).
 *                                         Earlier versions wrote idarch/<from>/<part>; both are read.
 *
 * Snapshots and a bounded footprint (snapshots.ts). After a snapshot at seq S, `cut` is the end of the
 * last whole batch at or before S. Compaction then deletes, in transactions of bounded size, each
 * with the owner's guard: the batch records before `cut`, any identity keys an earlier version left whose
 * seq is <= `cut`, the previous snapshot's chunks, and the identity segments of snapshots that lost the
 * race for the pointer. What stays in etcd is the tail after `cut`, the latest snapshot, and the
 * gzipped identity segments of the snapshots that moved the cut.
 *
 * Why duplicate refusal is exact with no identity key at all. Every identity of the log is, at every
 * instant, in etcd in one of two places: an event of a batch record after the cut, or an identity
 * segment. A segment covering (previous cut, cut] is written, and acknowledged, before the pointer
 * naming that cut moves, and compaction deletes nothing before the pointer has moved. The owner decides
 * "already in the log" from what it holds, and what it holds is all of it:
 *  1. Opening claims the epoch and reads the head in ONE transaction, so no commit of an earlier owner
 *     can land after that head (its transaction compares its own epoch, which is gone). The local copy
 *     is then caught up to exactly that head from the cluster: the batch records after its base, and,
 *     when it was rebuilt from a snapshot, every identity segment (loaded once, checked in memory).
 *  2. Every later commit is this owner's own, guarded by `head == expected`: each lands right after the
 *     head its owner knew, so nothing can enter the log that the owner did not send. What it sent and
 *     saw acknowledged is in the copy at once (pending its write: `existing` sees those identities).
 *  3. The commit pipeline checks a commit's identities against the copy when nothing it could collide
 *     with is queued ahead of it or in flight (commit-pipeline.ts: a lone commit at once, the others
 *     with their group), and never sends two commits holding one identity in one transaction.
 *  A transaction whose outcome is unknown is resolved by reading back its own record (its token) before
 *  anything else is sent, and a handle that cannot resolve it is poisoned, so (2) holds after outages
 *  too. The local copy's `identity UNIQUE` column is a tripwire, not a guard: a duplicate that slipped
 *  past all of this would already be durable and acknowledged when the copy's write (up to FLUSH_MS
 *  later) fails on it and poisons the handle.
 *  This needs the owner's local copy file to be its own database's. Two processes on one data dir and
 *  one cluster share it safely: a new owner changes the copy's contents only after its claim, which
 *  fences the old one. The file is named by the database name alone, so a copy is stamped with the
 *  database's id (`uid`, random) and its exact name, atomically on its first open, and every owner
 *  holds a shared lock on a file beside it while it has it open. A copy stamped for another database
 *  (another etcd cluster's, one deleted and created again, or a name differing only in case on a
 *  case-insensitive file system) is taken over (discarded, it diverged) only under an exclusive lock
 *  on that file, so never while any owner has it open; then the open is refused instead (open.ts,
 *  ownCopy). Not covered: a copy written before copies were stamped is adopted by the first database
 *  that opens it.
 *
 * Earlier versions also wrote one key per identity and compared it absent in every commit. That key
 * repeated what (1) to (3) already decide, and it cost every commit a compare and a put in etcd: about
 * 60 bytes of key and revision per event, and, at 64 one-event sessions in one process (63 commits per
 * transaction), about 40% of each member's CPU per transaction (one measurement: 2.8 to 3.6 ms with
 * the keys, 1.5 to 2.3 ms without). Identity storage is now only the segments (about 3-4 bytes per
 * identity, compressed) and the tail's batch records.
 *
 * A commit is ONE etcd transaction: compare the epoch key as my claim wrote it (its mod revision,
 * ops.ts `ownerGuard`) AND head == expected; then put the batch record(s) and the new head.
 *
 * `hash` chains the batches: sha256(previous hash, first seq, events JSON). Comparing the hash of the
 * local copy's last batch with the cluster's record at the same key proves the whole local prefix
 * equals the cluster's, without reading it again.
 */
import { createHash } from "node:crypto";
import { gunzipSync } from "node:zlib";
import { z } from "zod";
import { StorageFailure } from "../../src/storage/errors.js";

/** Database names are the same rule as every adapter's (src/storage/semantics.ts); a name never contains "/". */
export { checkDatabaseName } from "../../src/storage/semantics.js";

/** The etcd key prefix every database lives under. */
export const ROOT_PREFIX = "cairn/db/";
/** etcd's default `--max-txn-ops`: the most compares, and the most operations, in one transaction. */
export const MAX_TXN_OPS = 128;
/** The largest commit we send: events serialized as JSON (etcd's default request limit is 1.5 MiB). */
export const MAX_BATCH_BYTES = 1024 * 1024;
/**
 * At most this many events in one commit: the limit earlier versions had (two compares and one per
 * identity fitting MAX_TXN_OPS), kept so that what a caller may commit does not depend on the version.
 */
export const MAX_BATCH_EVENTS = MAX_TXN_OPS - 2;
/** The hash before the first batch. */
export const GENESIS_HASH = "0".repeat(64);

/** Identities per gzipped segment part (a part stays far below etcd's request limit). */
export const SEGMENT_IDS = 50_000;
/** The longest identity in UTF-8 bytes: 512 UTF-16 code units (src/state/events.ts), at most 3 bytes each. */
const MAX_IDENTITY_BYTES = 512 * 3;
/** The most one segment part can hold once decompressed: SEGMENT_IDS identities and their newlines. */
export const MAX_SEGMENT_BYTES = SEGMENT_IDS * (MAX_IDENTITY_BYTES + 1);

/**
 * The identities of the segment part stored at `key`. Decompressed with an output limit: a part that
 * would expand past MAX_SEGMENT_BYTES (a few hundred bytes of gzip can expand to gigabytes) is refused
 * before that memory is taken. Throws StorageFailure naming the key when the part is not gzip, too
 * large, or holds more than SEGMENT_IDS identities.
 */
export function segmentIdentities(key: string, gz: Buffer): string[] {
  const refuse = (why: string, cause?: unknown): StorageFailure =>
    new StorageFailure(
      `the identity segment ${key} ${why}: it was damaged or written by something other than Cairn, so duplicate refusal cannot rely on it; check who may write under this database's prefix in etcd (deploy/etcd/roles.sh) and restore the cluster from a backup.`,
      cause === undefined ? {} : { cause },
    );
  let text: string;
  try {
    text = gunzipSync(gz, { maxOutputLength: MAX_SEGMENT_BYTES }).toString("utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ERR_BUFFER_TOO_LARGE") throw refuse(`expands past ${MAX_SEGMENT_BYTES} bytes, more than ${SEGMENT_IDS} identities can take`, err);
    throw refuse(`is not a gzip stream (${(err as Error).message})`, err);
  }
  const ids = text === "" ? [] : text.split("\n");
  if (ids.length > SEGMENT_IDS) throw refuse(`holds ${ids.length} identities; a part holds at most ${SEGMENT_IDS}`);
  return ids;
}

const pad = (n: number): string => String(n).padStart(16, "0");

/** The keys of one database. */
export function keysOf(name: string) {
  const base = `${ROOT_PREFIX}${name}/`;
  return {
    prefix: base,
    epoch: `${base}epoch`,
    uid: `${base}uid`,
    head: `${base}head`,
    logPrefix: `${base}log/`,
    log: (firstSeq: number) => `${base}log/${pad(firstSeq)}`,
    identPrefix: `${base}ident/`,
    ident: (identity: string) => `${base}ident/${identity}`,
    mseq: `${base}mseq`,
    mailPrefix: `${base}mail/`,
    mail: (mseq: number) => `${base}mail/${pad(mseq)}`,
    mailId: (id: string) => `${base}mailid/${id}`,
    liveness: `${base}liveness`,
    waitForPrefix: `${base}waitfor/`,
    waitFor: (lease: string) => `${base}waitfor/${lease}`,
    snap: `${base}snap`,
    snapData: (seq: number) => `${base}snapdata/${pad(seq)}/`,
    snapDataPrefix: `${base}snapdata/`,
    idArchPrefix: `${base}idarch/`,
    idArch: (from: number, to: number, part: number) => `${base}idarch/${pad(from)}/${pad(to)}/${String(part).padStart(6, "0")}`,
  } as const;
}
export type Keys = ReturnType<typeof keysOf>;

/** The first seq of a batch key (`.../log/0000000000000042` -> 42). */
export function seqOfLogKey(key: string): number {
  return Number(key.slice(key.lastIndexOf("/") + 1));
}

const Header = z
  .strictObject({
    v: z.literal(1),
    first: z.number().int().positive(),
    last: z.number().int().positive(),
    epoch: z.number().int().positive(),
    token: z.string().min(1),
    hash: z.string().regex(/^[0-9a-f]{64}$/),
  })
  // A reader steps from `first` to `last + 1`: a range running backwards would read the same record forever.
  .refine((h) => h.last >= h.first, { message: "last is before first" });
/** The header of a batch record. `token` names the commit attempt that wrote it (for read-back). */
export type BatchHeader = z.infer<typeof Header>;

/** A batch as stored: its header and the exact events JSON the hash covers. */
export interface BatchRecord {
  readonly header: BatchHeader;
  readonly eventsJson: string;
}

/** sha256 over the previous hash, the first seq and the exact events JSON. */
export function chainHash(prevHash: string, first: number, eventsJson: string): string {
  return createHash("sha256").update(prevHash).update("\n").update(String(first)).update("\n").update(eventsJson).digest("hex");
}

/** Encodes a record: the header as one JSON line, a newline, then the events JSON. */
export function encodeBatch(record: BatchRecord): string {
  return `${JSON.stringify(record.header)}\n${record.eventsJson}`;
}

/** Decodes and validates a record read from etcd. Throws (with the key) when it is malformed. */
export function decodeBatch(key: string, value: string): BatchRecord {
  const nl = value.indexOf("\n");
  try {
    if (nl < 0) throw new Error("no header line");
    const header = Header.parse(JSON.parse(value.slice(0, nl)));
    if (seqOfLogKey(key) !== header.first) throw new Error(`header says first seq ${header.first}`);
    const eventsJson = value.slice(nl + 1);
    // Each event takes at least two characters of the JSON array ("{}" and a comma): a count past that is a lie.
    if (header.last - header.first + 1 > eventsJson.length) throw new Error(`header says ${header.last - header.first + 1} events in ${eventsJson.length} characters`);
    return { header, eventsJson };
  } catch (err) {
    throw new Error(`the etcd record ${key} is malformed: ${(err as Error).message}`, { cause: err });
  }
}
