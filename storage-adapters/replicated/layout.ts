/**
 * The key layout of a Cairn database in etcd, and how log records are encoded.
 *
 * Every key of database `<name>` lives under `cairn/db/<name>/` (so an etcd role granting that prefix
 * grants exactly that database):
 *
 *   cairn/db/<name>/epoch                 ownership epoch (decimal). Opening advances it in one txn.
 *   cairn/db/<name>/head                  highest committed seq (decimal; "0" for an empty log).
 *   cairn/db/<name>/log/<first seq, 16 digits>
 *                                         one committed batch: a header line (JSON: first, last,
 *                                         epoch, token, hash) then the events as a JSON array.
 *   cairn/db/<name>/ident/<identity>      the seq holding that identity (uniqueness: every commit
 *                                         compares create_revision == 0 on each of its identities).
 *   cairn/db/<name>/mseq                  the last mailbox sequence number handed out (decimal).
 *   cairn/db/<name>/mail/<mseq, 16 digits> a posted, not yet acknowledged, mailbox message (JSON).
 *   cairn/db/<name>/mailid/<id>           {mseq, digest} of every message id ever posted (dedupe).
 *   cairn/db/<name>/liveness              the owner's liveness lease (JSON: epoch, lease id, host, pid, and the
 *                                         earlier owners' leases it has not yet seen gone), attached
 *                                         to that etcd lease: gone when the lease expires or is revoked.
 *   cairn/db/<name>/snap                  the latest snapshot's pointer (JSON: seq, digest, chunks,
 *                                         cut, cutHash); written last, in one txn guarded by the epoch.
 *   cairn/db/<name>/snapdata/<seq>/<i>    the snapshot text, in chunks of at most 1 MiB.
 *   cairn/db/<name>/idarch/<from>/<part>  the identities of the events in (previous cut, cut], sorted,
 *                                         newline-joined, gzipped: one segment per compaction.
 *
 * Snapshots and a bounded footprint (snapshots.ts). After a snapshot at seq S, `cut` is the end of the
 * last whole batch at or before S. Compaction then deletes, in transactions of bounded size, each
 * guarded by the epoch: the batch records before `cut`, the identity keys whose seq is <= `cut`, and
 * the previous snapshot's chunks. What stays in etcd is the tail after `cut`, its identity keys, the
 * latest snapshot, and the gzipped identity segments.
 *
 * Why duplicate refusal stays exact although identity keys are deleted:
 *  1. An identity of an event after `cut` still has its key, and every commit compares that key
 *     absent in etcd itself: exact against any owner, including one that just took over.
 *  2. An identity of an event at or before `cut` is in exactly one identity segment, written (and its
 *     write acknowledged) BEFORE any identity key it replaces is deleted: at every instant each
 *     identity is in etcd as a key, in a segment, or both.
 *  3. Only the owner commits, and it checks every identity against its local copy first: the events
 *     it holds, written or still pending their write (full history when the copy kept up; everything
 *     after the base when it was rebuilt)
 *     plus, when rebuilt from a snapshot, every segment (loaded at open, checked in memory). Identities
 *     after the local copy's head are covered by (1) because the copy is caught up to the head at open
 *     and every later commit goes through this owner.
 *  So "already in the log" is decided exactly; only its storage moved from one key per identity (the
 *  unbounded part: about 60 bytes of key and revision per event) to about 3-4 bytes per identity in
 *  compressed segments. The number of identity KEYS stays bounded by the snapshot interval.
 *
 * A commit is ONE etcd transaction: compare epoch == mine AND head == expected AND every identity
 * key absent; then put the batch record(s), the identity keys and the new head.
 *
 * `hash` chains the batches: sha256(previous hash, first seq, events JSON). Comparing the hash of the
 * local copy's last batch with the cluster's record at the same key proves the whole local prefix
 * equals the cluster's, without reading it again.
 */
import { createHash } from "node:crypto";
import { z } from "zod";

/** Database names are the same rule as every adapter's (src/storage/semantics.ts); a name never contains "/". */
export { checkDatabaseName } from "../../src/storage/semantics.js";

/** The etcd key prefix every database lives under. */
export const ROOT_PREFIX = "cairn/db/";
/** etcd's default `--max-txn-ops`: the most compares, and the most operations, in one transaction. */
export const MAX_TXN_OPS = 128;
/** The largest commit we send: events serialized as JSON (etcd's default request limit is 1.5 MiB). */
export const MAX_BATCH_BYTES = 1024 * 1024;
/** At most this many events in one commit (two compares + one per identity must fit MAX_TXN_OPS). */
export const MAX_BATCH_EVENTS = MAX_TXN_OPS - 2;
/** The hash before the first batch. */
export const GENESIS_HASH = "0".repeat(64);

const pad = (n: number): string => String(n).padStart(16, "0");

/** The keys of one database. */
export function keysOf(name: string) {
  const base = `${ROOT_PREFIX}${name}/`;
  return {
    prefix: base,
    epoch: `${base}epoch`,
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
    snap: `${base}snap`,
    snapData: (seq: number) => `${base}snapdata/${pad(seq)}/`,
    snapDataPrefix: `${base}snapdata/`,
    idArchPrefix: `${base}idarch/`,
    idArch: (from: number, part: number) => `${base}idarch/${pad(from)}/${String(part).padStart(6, "0")}`,
  } as const;
}
export type Keys = ReturnType<typeof keysOf>;

/** The first seq of a batch key (`.../log/0000000000000042` -> 42). */
export function seqOfLogKey(key: string): number {
  return Number(key.slice(key.lastIndexOf("/") + 1));
}

const Header = z.strictObject({
  v: z.literal(1),
  first: z.number().int().positive(),
  last: z.number().int().positive(),
  epoch: z.number().int().positive(),
  token: z.string().min(1),
  hash: z.string().regex(/^[0-9a-f]{64}$/),
});
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
    return { header, eventsJson: value.slice(nl + 1) };
  } catch (err) {
    throw new Error(`the etcd record ${key} is malformed: ${(err as Error).message}`, { cause: err });
  }
}
