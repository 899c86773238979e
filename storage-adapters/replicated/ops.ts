/**
 * Raw etcd request builders (compares, puts, ranges) used by the adapter's transactions. Raw requests,
 * not the client's fluent builders, so a commit is exactly one `Txn` call with nothing in between.
 */
import type { ICompare, IKeyValue, IRequestOp, IResponseOp } from "etcd3";

const b = (s: string): Buffer => Buffer.from(s, "utf8");

/** The first key after every key starting with `prefix`. */
export function prefixEnd(prefix: string): Buffer {
  const buf = Buffer.from(prefix, "utf8");
  for (let i = buf.length - 1; i >= 0; i--) {
    if (buf[i]! < 0xff) {
      const end = Buffer.from(buf.subarray(0, i + 1));
      end[i]! += 1;
      return end;
    }
  }
  return Buffer.from([0]);
}

/** `key`'s value equals `value`. */
export const valueIs = (key: string, value: string): ICompare => ({ key: b(key), target: "Value", result: "Equal", value: b(value) });
/** `key` does not exist (its create revision is 0). */
export const absent = (key: string): ICompare => ({ key: b(key), target: "Create", result: "Equal", create_revision: 0 });
/** `key` exists. */
export const present = (key: string): ICompare => ({ key: b(key), target: "Create", result: "Greater", create_revision: 0 });
/** `key`'s mod revision equals `rev` ("0" for a missing key). */
export const modIs = (key: string, rev: string): ICompare => ({ key: b(key), target: "Mod", result: "Equal", mod_revision: rev });

/**
 * The owner's guard, in every write an owner makes: the epoch key is exactly as this owner's claim
 * wrote it (its mod revision is the claim's revision). The epoch's number alone would not do: a
 * database deleted and created again (outside Cairn) starts again at epoch 1, and its new owner and
 * an old owner of epoch 1 would then both pass a compare of the number.
 */
export const ownerGuard = (epochKey: string, claimRevision: string): ICompare => modIs(epochKey, claimRevision);

/** The epoch key as read: its number and mod revision (both null when it is gone). */
export interface EpochSeen {
  readonly epoch: number | null;
  readonly revision: string | null;
}

/** The epoch key as a read or a watch event returned it (undefined: gone). */
export function epochSeen(kv: IKeyValue | undefined): EpochSeen {
  return kv === undefined ? { epoch: null, revision: null } : { epoch: Number(kv.value.toString("utf8")), revision: kv.mod_revision };
}

/**
 * The one rule every owner check uses (a refused guard's read-back, a linearizable read, a watch
 * event): null while the epoch key is this owner's claim; else who fenced it, as the epoch now there
 * (null when the key is gone, or was written again by someone else with this owner's own number).
 */
export function fencer(seen: EpochSeen, ownEpoch: number, claimRevision: string): { epoch: number | null } | null {
  if (seen.epoch !== null && seen.revision === claimRevision) return null;
  return { epoch: seen.epoch === ownEpoch ? null : seen.epoch };
}

/** `fencer` on the read-back `get(epochKey)` at response `i` of a refused transaction. */
export function fencedBy(responses: readonly IResponseOp[], i: number, ownEpoch: number, claimRevision: string): { epoch: number | null } | null {
  return fencer(epochSeen(kvsOf(responses, i)[0]), ownEpoch, claimRevision);
}

/**
 * `fencer` on a watch event of the epoch key: null for the claim itself or anything older, which a
 * watch moved to a member still catching up may deliver late (it restarts from that member's present);
 * any write after the claim is another's (a claim, or the database deleted and created again).
 */
export function fencedByEvent(kind: "put" | "delete", kv: IKeyValue, ownEpoch: number, claimRevision: string): { epoch: number | null } | null {
  if (BigInt(kv.mod_revision) <= BigInt(claimRevision)) return null;
  return fencer(kind === "delete" ? epochSeen(undefined) : epochSeen(kv), ownEpoch, claimRevision);
}

export const put = (key: string, value: string): IRequestOp => ({ request_put: { key: b(key), value: b(value) } });
/** Puts `key` attached to lease `lease` (decimal id): etcd deletes it when the lease ends. */
export const putWithLease = (key: string, value: string, lease: string): IRequestOp => ({ request_put: { key: b(key), value: b(value), lease } });
export const get = (key: string): IRequestOp => ({ request_range: { key: b(key) } });
/** Keys in [start, end), ascending, at most `limit` (0: all). */
export const range = (start: string, end: Buffer, limit = 0): IRequestOp => ({ request_range: { key: b(start), range_end: end, limit } });
export const count = (prefix: string): IRequestOp => ({ request_range: { key: b(prefix), range_end: prefixEnd(prefix), count_only: true } });
/** Deletes one key. */
export const del = (key: string): IRequestOp => ({ request_delete_range: { key: b(key) } });
/** Deletes keys in [start, end). */
export const delRange = (start: string, end: Buffer): IRequestOp => ({ request_delete_range: { key: b(start), range_end: end } });

/** The key-values of the `i`th response of a transaction (a range response). */
export function kvsOf(responses: readonly IResponseOp[], i: number): IKeyValue[] {
  return responses[i]?.response_range?.kvs ?? [];
}

/** The value of a single-key range response as a string, or null. */
export function valueOf(responses: readonly IResponseOp[], i: number): string | null {
  const kv = kvsOf(responses, i)[0];
  return kv ? kv.value.toString("utf8") : null;
}
