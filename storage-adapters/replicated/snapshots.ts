/**
 * Snapshots on the replicated adapter, and the compaction that keeps etcd's footprint flat.
 *
 * Writing (owner only, every transaction with the owner's guard, ops.ts `ownerGuard`): the snapshot text in chunks
 * (`snapdata/<seq>/<i>`), then the identity segment of the events since the previous cut
 * (`idarch/<from>/<to>/<part>`), then the pointer (`snap`), compared on its mod revision so two writers
 * cannot interleave. Until the pointer moves, readers see the previous snapshot whole.
 *
 * Compaction (after the pointer moved): deletes, in transactions of at most COMPACT_BATCH keys, the
 * older snapshots' chunks, the batch records up to the cut, any identity keys an earlier version left whose seq is at or
 * before the cut, and the identity segments no snapshot's chain uses (`orphanSegments`). A crash or a
 * fence in the middle leaves keys that the next compaction deletes (it scans, it does not remember).
 * Why duplicate refusal stays exact: layout.ts.
 */
import { gzipSync } from "node:zlib";
import type { ICompare, IRequestOp } from "etcd3";
import type { StoredSnapshot } from "../../src/storage/contract.js";
import { ResetError, StorageRejected } from "../../src/storage/errors.js";
import { checkSnapshotWrite, snapshotDigest, verifiedSnapshot } from "../../src/storage/snapshots.js";
import { z } from "zod";
import type { Context } from "./context.js";
import { MAX_BATCH_BYTES, SEGMENT_IDS, segmentIdentities, type Keys } from "./layout.js";
import type { LocalCopy } from "./local-copy.js";
import { fencedBy, get, kvsOf, ownerGuard, prefixEnd } from "./ops.js";

/** Keys deleted (or identities scanned) per compaction transaction: bounded, under --max-txn-ops. */
export const COMPACT_BATCH = 100;

const Pointer = z.strictObject({
  v: z.literal(1),
  seq: z.number().int().positive(),
  digest: z.string().regex(/^[0-9a-f]{64}$/),
  chunks: z.number().int().positive(),
  /** The end of the last whole batch at or before `seq`: everything up to it may be compacted. */
  cut: z.number().int().nonnegative(),
  /** The chain hash at `cut` (GENESIS when cut is 0): a copy rebuilt from here starts with it. */
  cutHash: z.string().regex(/^[0-9a-f]{64}$/),
});
export type SnapshotPointer = z.infer<typeof Pointer>;

/** The pointer of the latest snapshot, and its mod revision ("0" when there is none). */
export async function readPointer(ctx: Context, keys: Keys): Promise<{ pointer: SnapshotPointer | null; modRevision: string }> {
  const res = await ctx.txn([], [get(keys.snap)]);
  const kv = kvsOf(res.responses, 0)[0];
  if (!kv) return { pointer: null, modRevision: "0" };
  try {
    return { pointer: Pointer.parse(JSON.parse(kv.value.toString("utf8"))), modRevision: String(kv.mod_revision) };
  } catch (cause) {
    throw new StorageRejected("invalid", `the snapshot pointer ${keys.snap} is malformed; it was altered. Remove it to fall back to the full log only if no entries were compacted.`, { cause });
  }
}

/** The latest snapshot, its digest checked, or null. Throws StorageFailure when damaged or incomplete. */
export async function readSnapshot(ctx: Context, keys: Keys, name: string): Promise<StoredSnapshot | null> {
  for (let attempt = 1; ; attempt++) {
    const { pointer, modRevision } = await readPointer(ctx, keys);
    if (pointer === null) return null;
    const prefix = keys.snapData(pointer.seq);
    const res = await ctx.call((client) => client.kv.range({ key: Buffer.from(prefix), range_end: prefixEnd(prefix), sort_order: "Ascend", sort_target: "Key" }));
    const text = Buffer.concat(res.kvs.slice(0, pointer.chunks).map((kv) => kv.value)).toString("utf8");
    if (snapshotDigest(text) === pointer.digest || attempt >= 3) return verifiedSnapshot(name, pointer.seq, text, pointer.digest);
    // A newer snapshot's compaction may have removed these chunks after we read the pointer: look again.
    if ((await readPointer(ctx, keys)).modRevision === modRevision) return verifiedSnapshot(name, pointer.seq, text, pointer.digest);
  }
}

/** What writing a snapshot needs from the owner's handle. */
export interface SnapshotWriter {
  readonly name: string;
  readonly epoch: number;
  /** The etcd revision of the owner's epoch claim: its guard (ops.ts `ownerGuard`). */
  readonly claimRevision: string;
  readonly keys: Keys;
  readonly copy: LocalCopy;
  /** Marks the handle fenced and returns the error to throw. */
  fenced(epoch: number | null): ResetError;
}

const putBytes = (key: string, value: Buffer): IRequestOp => ({ request_put: { key: Buffer.from(key), value } });

/** Sends one transaction with the owner's guard (ops.ts); throws the fence when the epoch key moved. */
async function guarded(ctx: Context, w: SnapshotWriter, ops: IRequestOp[], extraCompare: ICompare[] = []): Promise<boolean> {
  const res = await ctx.txn([ownerGuard(w.keys.epoch, w.claimRevision), ...extraCompare], ops, [get(w.keys.epoch)]);
  if (res.succeeded) return true;
  const by = fencedBy(res.responses, 0, w.epoch, w.claimRevision);
  if (by !== null) throw w.fenced(by.epoch);
  return false;
}

/**
 * Writes the snapshot of events 1..seq (head: the owner's head now), then compacts. Resolves when the
 * pointer names it; compaction problems are logged, never thrown (the next snapshot retries them).
 */
export async function writeSnapshot(ctx: Context, w: SnapshotWriter, seq: number, data: string, head: number): Promise<void> {
  const { keys, copy } = w;
  const { pointer, modRevision } = await readPointer(ctx, keys);
  checkSnapshotWrite(w.name, seq, data, head, pointer?.seq ?? 0);
  const bytes = Buffer.from(data, "utf8");
  const chunks: Buffer[] = [];
  for (let at = 0; at < bytes.length; at += MAX_BATCH_BYTES) chunks.push(bytes.subarray(at, at + MAX_BATCH_BYTES));
  for (const [i, chunk] of chunks.entries()) {
    await guarded(ctx, w, [putBytes(`${keys.snapData(seq)}${String(i).padStart(6, "0")}`, chunk)]);
  }
  const prevCut = pointer?.cut ?? 0;
  const last = copy.batchEndingBy(seq);
  const cut = last === null || last.last < prevCut ? prevCut : last.last;
  const cutHash = cut === prevCut ? (pointer?.cutHash ?? copy.base().hash) : last!.hash;
  if (cut > prevCut) {
    // The identities before the cut go into a segment BEFORE any of their keys can be deleted.
    const ids = copy.identitiesIn(prevCut, cut);
    for (let part = 0; part * SEGMENT_IDS < ids.length; part++) {
      const gz = gzipSync(ids.slice(part * SEGMENT_IDS, (part + 1) * SEGMENT_IDS).join("\n"));
      await guarded(ctx, w, [putBytes(keys.idArch(prevCut + 1, cut, part), gz)]);
    }
  }
  const next: SnapshotPointer = { v: 1, seq, digest: snapshotDigest(data), chunks: chunks.length, cut, cutHash };
  const modCompare = { key: Buffer.from(keys.snap), target: "Mod" as const, result: "Equal" as const, mod_revision: modRevision };
  const ok = await guarded(ctx, w, [{ request_put: { key: Buffer.from(keys.snap), value: Buffer.from(JSON.stringify(next)) } }], [modCompare as never]);
  if (!ok) throw new StorageRejected("conflict", `writeSnapshot on database "${w.name}": another snapshot was written at the same time; nothing changed, retry.`);
  try {
    await compact(ctx, w, next);
  } catch (err) {
    if (err instanceof ResetError) throw err;
    ctx.log.warn({ db: w.name, err: (err as Error).message }, "compaction after a snapshot did not finish; the next snapshot retries it");
  }
}

/** Deletes, in bounded transactions, what the snapshot `p` made unnecessary (see the file comment). */
export async function compact(ctx: Context, w: SnapshotWriter, p: SnapshotPointer): Promise<{ deleted: number }> {
  const { keys } = w;
  let deleted = 0;
  // Older snapshots' chunks: every snapdata key before this snapshot's prefix.
  deleted += await deleteKeysIn(ctx, w, keys.snapDataPrefix, Buffer.from(keys.snapData(p.seq)));
  if (p.cut === 0) return { deleted };
  // Batch records whose first seq is at or before the cut (the cut ends a batch, so they end by it).
  deleted += await deleteKeysIn(ctx, w, keys.logPrefix, Buffer.from(keys.log(p.cut + 1)));
  // Identity keys whose seq is at or before the cut (scanned: leftovers of an interrupted run go too).
  const end = prefixEnd(keys.identPrefix);
  let from = Buffer.from(keys.identPrefix);
  for (;;) {
    const res = await ctx.call((client) => client.kv.range({ key: from, range_end: end, limit: COMPACT_BATCH * 10 }));
    if (res.kvs.length === 0) break;
    const stale = res.kvs.filter((kv) => Number(kv.value.toString("utf8")) <= p.cut).map((kv) => kv.key);
    for (let i = 0; i < stale.length; i += COMPACT_BATCH) {
      await guarded(ctx, w, stale.slice(i, i + COMPACT_BATCH).map((key) => ({ request_delete_range: { key } })));
      deleted += Math.min(COMPACT_BATCH, stale.length - i);
    }
    if (!res.more) break;
    from = Buffer.concat([res.kvs[res.kvs.length - 1]!.key, Buffer.from([0])]);
  }
  // Identity segments that no chain up to the cut uses.
  const segments = await ctx.call((client) => client.kv.range({ key: Buffer.from(keys.idArchPrefix), range_end: prefixEnd(keys.idArchPrefix), keys_only: true }));
  const orphans = orphanSegments(
    segments.kvs.map((kv) => kv.key.toString("utf8").slice(keys.idArchPrefix.length)),
    p.cut,
  );
  for (let i = 0; i < orphans.length; i += COMPACT_BATCH) {
    await guarded(
      ctx,
      w,
      orphans.slice(i, i + COMPACT_BATCH).map((key) => ({ request_delete_range: { key: Buffer.from(keys.idArchPrefix + key) } })),
    );
    deleted += Math.min(COMPACT_BATCH, orphans.length - i);
  }
  return { deleted };
}

/**
 * The identity segments (keys after the `idarch/` prefix) that compaction up to `cut` may delete:
 * those of snapshots that lost the race for the pointer, or were interrupted before they moved it.
 *
 * Why only those. A snapshot writes the segment of `prevCut + 1 .. cut`, where `prevCut` is the cut of
 * the pointer it read, and moves the pointer only if nobody moved it since (the pointer's mod
 * revision). So the cuts of the snapshots that won are a rising sequence, and their segments a chain:
 * 1 .. c1, c1 + 1 .. c2, and so on, up to the current `cut`. A segment counts as used when it lies on
 * some chain of segments from 1 to `cut` (another such chain holds the same identities, so keeping
 * every one is merely cautious). A segment that starts at or before `cut` and lies on none is a
 * loser's: its writer read a pointer older than the current one, so its own pointer write fails, now
 * or already. A writer still in progress that read the current pointer writes segments that start
 * after `cut`, and those are never candidates. The identities of a deleted segment are all in the
 * chain, so duplicate refusal stays exact.
 *
 * When the segments do not form a complete chain from 1 to `cut` (segments in the earlier form
 * `<from>/<part>`, which name no end, or a database whose first snapshots came before segments
 * existed), nothing is deleted: a chain that cannot be followed cannot tell a loser from a link.
 */
export function orphanSegments(keys: readonly string[], cut: number): string[] {
  const ranges = new Map<string, { from: number; to: number; keys: string[] }>();
  for (const key of keys) {
    const m = /^(\d+)\/(\d+)\/\d+$/.exec(key);
    if (m === null) continue;
    const from = Number(m[1]);
    const to = Number(m[2]);
    if (!(from >= 1 && to >= from)) return [];
    const id = `${from}/${to}`;
    const range = ranges.get(id) ?? { from, to, keys: [] };
    range.keys.push(key);
    ranges.set(id, range);
  }
  const all = [...ranges.values()].filter((r) => r.to <= cut);
  // Boundaries reachable from 0 (nothing before seq 1), following segments forward...
  const forward = new Set([0]);
  for (const r of [...all].sort((a, b) => a.from - b.from)) if (forward.has(r.from - 1)) forward.add(r.to);
  if (!forward.has(cut)) return [];
  // ...and those from which `cut` is reachable, following them backward.
  const backward = new Set([cut]);
  for (const r of [...all].sort((a, b) => b.to - a.to)) if (backward.has(r.to)) backward.add(r.from - 1);
  const used = (r: { from: number; to: number }): boolean => r.to <= cut && forward.has(r.from - 1) && backward.has(r.to);
  return [...ranges.values()].filter((r) => r.from <= cut && !used(r)).flatMap((r) => r.keys);
}

/** Deletes the keys in [prefix, end) in transactions of at most COMPACT_BATCH keys each. */
async function deleteKeysIn(ctx: Context, w: SnapshotWriter, prefix: string, end: Buffer): Promise<number> {
  let deleted = 0;
  for (;;) {
    const res = await ctx.call((client) => client.kv.range({ key: Buffer.from(prefix), range_end: end, limit: COMPACT_BATCH, keys_only: true }));
    if (res.kvs.length === 0) return deleted;
    const lastKey = res.kvs[res.kvs.length - 1]!.key;
    await guarded(ctx, w, [{ request_delete_range: { key: Buffer.from(prefix), range_end: Buffer.concat([lastKey, Buffer.from([0])]) } }]);
    deleted += res.kvs.length;
    if (!res.more) return deleted;
  }
}

/**
 * Every identity segment (key and gzipped bytes), for a copy rebuilt from a snapshot. Each is checked
 * to decompress within its bound (layout.ts `segmentIdentities`) before the copy keeps it: throws
 * StorageFailure for one that does not.
 */
export async function readSegments(ctx: Context, keys: Keys): Promise<{ key: string; gz: Buffer }[]> {
  const res = await ctx.call((client) => client.kv.range({ key: Buffer.from(keys.idArchPrefix), range_end: prefixEnd(keys.idArchPrefix) }));
  const segments = res.kvs.map((kv) => ({ key: kv.key.toString("utf8"), gz: kv.value }));
  for (const s of segments) segmentIdentities(s.key, s.gz);
  return segments;
}
