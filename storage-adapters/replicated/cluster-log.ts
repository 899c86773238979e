/**
 * Reading a database's log from the cluster (linearizable reads), for catching up the local copy
 * and for readers that own nothing. Records are validated and their hash chain checked as they come.
 */
import { CairnError } from "../../src/errors.js";
import { parseLogEvent, type LogEvent } from "../../src/state/events.js";
import { StorageRejected } from "../../src/storage/errors.js";
import type { Context } from "./context.js";
import { readPointer } from "./snapshots.js";
import { chainHash, decodeBatch, type BatchRecord, type Keys } from "./layout.js";
import { splitEvents } from "./local-copy.js";
import { get, kvsOf, prefixEnd, range, valueOf } from "./ops.js";

/** Batches per range request: with records of at most 1 MiB, one page stays under the 64 MiB receive limit. */
const PAGE = 48;

/**
 * The epoch and head of a database as the cluster holds them now (epoch null when it does not exist),
 * and its id (null when it has none: it does not exist, or was created before ids existed).
 * `epochRevision` is the epoch key's mod revision: the revision of the claim that wrote it.
 */
export async function readEpochHead(
  ctx: Context,
  keys: Keys,
): Promise<{ epoch: number | null; epochRevision: string | null; head: number; revision: string; uid: string | null }> {
  const res = await ctx.txn([], [get(keys.epoch), get(keys.head), get(keys.uid)]);
  const epoch = kvsOf(res.responses, 0)[0];
  return {
    epoch: epoch === undefined ? null : Number(epoch.value.toString("utf8")),
    epochRevision: epoch === undefined ? null : epoch.mod_revision,
    head: Number(valueOf(res.responses, 1) ?? "0"),
    revision: res.header.revision,
    uid: valueOf(res.responses, 2),
  };
}

/**
 * Calls `onPage` with the cluster's batches from the one starting at `fromFirst` up to `upTo`
 * (inclusive), in order, checking that each follows the previous one and that its hash chains from
 * `prevHash`. Returns the last hash. Throws CairnError `internal` when the cluster's log is broken.
 */
export async function forEachBatch(
  ctx: Context,
  keys: Keys,
  fromFirst: number,
  upTo: number,
  prevHash: string | null,
  onPage: (records: BatchRecord[]) => void,
): Promise<string | null> {
  let next = fromFirst;
  let hash = prevHash;
  const end = prefixEnd(keys.logPrefix);
  while (next <= upTo) {
    const res = await ctx.txn([], [range(keys.log(next), end, PAGE)]);
    const kvs = kvsOf(res.responses, 0);
    if (kvs.length === 0) throw new CairnError("internal", `the cluster's log of "${keys.prefix}" ends before seq ${next} although its head is ${upTo}`);
    const page: BatchRecord[] = [];
    for (const kv of kvs) {
      const record = decodeBatch(kv.key.toString("utf8"), kv.value.toString("utf8"));
      const h = record.header;
      if (h.first > upTo) break;
      if (h.first !== next) throw new CairnError("internal", `the cluster's log of "${keys.prefix}" jumps from seq ${next - 1} to ${h.first}`);
      if (hash !== null && chainHash(hash, h.first, record.eventsJson) !== h.hash) {
        throw new CairnError("internal", `the cluster's batch at seq ${h.first} of "${keys.prefix}" does not match its hash chain`);
      }
      hash = h.hash;
      next = h.last + 1;
      page.push(record);
    }
    if (page.length === 0) break;
    onPage(page);
  }
  return hash;
}

/** The first seq of the batch holding `seq` (a reverse range, one request). */
export async function batchStartOf(ctx: Context, keys: Keys, seq: number): Promise<number | null> {
  const res = await ctx.call((client) =>
    client.kv.range(
      {
        key: Buffer.from(keys.logPrefix),
        range_end: Buffer.from(keys.log(seq) + "\0"),
        limit: 1,
        sort_order: "Descend",
        sort_target: "Key",
        keys_only: true,
      },
    ),
  );
  const kv = res.kvs[0];
  return kv ? Number(kv.key.toString("utf8").slice(keys.logPrefix.length)) : null;
}

/** Events with seq > afterSeq (at most `limit`), read straight from the cluster, validated. */
export async function readFromCluster(ctx: Context, keys: Keys, afterSeq: number, limit: number | undefined): Promise<LogEvent[]> {
  const { head } = await readEpochHead(ctx, keys);
  if (afterSeq >= head || limit === 0) return [];
  const cut = (await readPointer(ctx, keys)).pointer?.cut ?? 0;
  if (afterSeq < cut) {
    throw new StorageRejected(
      "compacted",
      `events up to seq ${cut} of "${keys.prefix}" were dropped from the cluster after a snapshot; read from seq ${cut} on, starting from latestSnapshot() (the owner's local copy or an archive keeps the full history).`,
    );
  }
  const start = await batchStartOf(ctx, keys, afterSeq + 1);
  if (start === null) throw new CairnError("internal", `the cluster's log of "${keys.prefix}" has no batch holding seq ${afterSeq + 1}`);
  const out: LogEvent[] = [];
  const want = limit ?? Number.POSITIVE_INFINITY;
  const stopAt = Math.min(head, afterSeq + want);
  await forEachBatch(ctx, keys, start, stopAt, null, (records) => {
    for (const r of records) {
      const { events } = splitEvents(r.eventsJson);
      events.forEach((e, i) => {
        const seq = r.header.first + i;
        if (seq > afterSeq && out.length < want) out.push(parseLogEvent({ ...e, seq }));
      });
    }
  });
  return out;
}
