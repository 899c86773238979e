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

/**
 * After a refused owner's guard, from the read-back `get(epochKey)` at response `i`: null when the
 * epoch key is still this owner's claim (another compare was refused), else the epoch that fenced this
 * owner (null when the key is gone, or was written again by someone else with this owner's number).
 */
export function fencedBy(responses: readonly IResponseOp[], i: number, ownEpoch: number, claimRevision: string): { epoch: number | null } | null {
  const kv = kvsOf(responses, i)[0];
  if (kv !== undefined && kv.mod_revision === claimRevision) return null;
  const epoch = kv === undefined ? null : Number(kv.value.toString("utf8"));
  return { epoch: epoch === ownEpoch ? null : epoch };
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
