/**
 * The owner lease's records and their fold (lease.ts does the I/O). Liveness only, never safety:
 * the producer epoch on the log fences, whatever this says.
 *
 * Streams of database NAME, under the base URL:
 *
 *   NAME/lease/G   generation G of the lease's records (application/json), written by every process
 *                  that takes, renews, waits for or gives up the lease. Every generation after the
 *                  first holds a `carry` (who holds it and who waits, as the previous generation
 *                  ended), which counts before every other record of the generation wherever it
 *                  landed (its creator appends it, and others may append before it: the reference
 *                  server's create with a first message is two steps); a generation is read only
 *                  once its carry is there. Its last record is `moved` {to: G + 1}, appended by the
 *                  holder together with closing the stream once it holds ROLL records, so no
 *                  generation grows without bound.
 *   NAME/leases    the generations' index: {t:"gen", g} per roll, read once by a process that does not
 *                  know the current generation yet (then it follows `moved`). One small record per roll.
 *
 * Records (k: a token, one per acquisition or per place in the queue; o: who, as OwnerInfo; l: that
 * process's lease length in ms, by which readers time it out):
 *
 *   carry    {holder: {k, o, l} | null, queue: [{k, o, l}]}
 *   take     {k, o, l, prev, force, w?}  valid when `force`, or when `prev` is the holder's token at this
 *                                        point of the stream (null: none): a compare-and-swap decided by
 *                                        the stream's order, so every reader agrees who holds the lease.
 *                                        It also removes the taker's queue place `w`.
 *   renew    {k, e?}                     the holder renews (and records its epoch)
 *   release  {k}                         the holder gives the lease up
 *   queue    {k, o, l}                   joins the queue (its order: the stream's)
 *   wait     {k}                         a waiter renews its place
 *   leave    {k}                         a waiter withdraws
 *   moved    {to}                        this generation ends; the next is `to`
 *
 * Who holds and who waits is the same for every reader (a function of the stream). Whether they are
 * live is not: each reader times each token on its own monotonic clock from when it observed that
 * token's latest record (lease.ts), so no two machines' clocks are ever compared.
 */
import { z } from "zod";
import type { OwnerInfo } from "../../src/storage/contract.js";

/** A generation is rolled over once it holds this many records (about half an hour of one holder and one standby at the default lease). */
export const ROLL_RECORDS = 1000;

/** The stream of generation `g` of database `name`'s lease, and the generations' index. */
export const leaseStream = (name: string, g: number): string => `${name}/lease/${g}`;
export const leaseIndex = (name: string): string => `${name}/leases`;

const token = z.string().min(1).max(64);
const ms = z.number().int().min(1).max(86_400_000);
const Owner = z.strictObject({ host: z.string().max(300), pid: z.number().int().min(0), since: z.string().max(64), epoch: z.number().int().min(1).nullable(), role: z.string().max(32) });
const EntrySchema = z.strictObject({ k: token, o: Owner, l: ms });
const RecordSchema = z.discriminatedUnion("t", [
  z.strictObject({ v: z.literal(1), t: z.literal("carry"), holder: EntrySchema.nullable(), queue: z.array(EntrySchema) }),
  z.strictObject({ v: z.literal(1), t: z.literal("take"), k: token, o: Owner, l: ms, prev: token.nullable(), force: z.boolean(), w: token.optional() }),
  z.strictObject({ v: z.literal(1), t: z.literal("renew"), k: token, e: z.number().int().min(1).optional() }),
  z.strictObject({ v: z.literal(1), t: z.literal("release"), k: token }),
  z.strictObject({ v: z.literal(1), t: z.literal("queue"), k: token, o: Owner, l: ms }),
  z.strictObject({ v: z.literal(1), t: z.literal("wait"), k: token }),
  z.strictObject({ v: z.literal(1), t: z.literal("leave"), k: token }),
  z.strictObject({ v: z.literal(1), t: z.literal("moved"), to: z.number().int().min(1) }),
]);
const IndexSchema = z.strictObject({ v: z.literal(1), t: z.literal("gen"), g: z.number().int().min(0) });

export type LeaseRecord = z.infer<typeof RecordSchema>;
/** A holder or a waiter. */
export interface Entry {
  readonly k: string;
  readonly o: OwnerInfo;
  readonly l: number;
}

/** What a generation's records say, up to where they were read. */
export interface LeaseState {
  holder: Entry | null;
  queue: Entry[];
  /** The next generation, once this one ended. */
  moved: number | null;
  /** Records in this generation so far. */
  records: number;
  /** The generation's carry was read (always, for generation 0: it has none). */
  carried: boolean;
  /** Records read before the carry: they count after it. */
  pending: LeaseRecord[];
}

/** The state at the start of a generation: `carried` for generation 0 (nothing to carry). */
export const emptyState = (carried = true): LeaseState => ({ holder: null, queue: [], moved: null, records: 0, carried, pending: [] });

/** The carry record that starts the generation after `state` (the same bytes from every reader). */
export function carryOf(state: LeaseState): Extract<LeaseRecord, { t: "carry" }> {
  return { v: 1, t: "carry", holder: state.holder, queue: state.queue };
}

/** Parses one message of a lease generation; null for a message this version does not know (ignored). */
export function parseLeaseRecord(m: unknown): LeaseRecord | null {
  const r = RecordSchema.safeParse(m);
  return r.success ? r.data : null;
}

/** The generation an index message names, or null. */
export function parseIndex(m: unknown): number | null {
  const r = IndexSchema.safeParse(m);
  return r.success ? r.data.g : null;
}

/**
 * Applies `r` to `s` (in place). Returns the tokens the record shows alive (their process wrote it, or
 * a carry names them), and those it ends (released, withdrawn, replaced).
 */
export function applyLease(s: LeaseState, r: LeaseRecord): { readonly seen: readonly string[]; readonly gone: readonly string[] } {
  s.records++;
  if (r.t === "carry") {
    if (s.carried) return { seen: [], gone: [] }; // a second copy (the same content)
    s.carried = true;
    s.holder = r.holder;
    s.queue = [...r.queue];
    const seen = [...(r.holder ? [r.holder.k] : []), ...r.queue.map((e) => e.k)];
    const gone: string[] = [];
    for (const p of s.pending.splice(0)) {
      s.records--;
      const out = applyLease(s, p);
      seen.push(...out.seen);
      gone.push(...out.gone);
    }
    return { seen, gone };
  }
  if (!s.carried) {
    s.pending.push(r);
    return { seen: [], gone: [] };
  }
  return applyCarried(s, r);
}

function applyCarried(s: LeaseState, r: Exclude<LeaseRecord, { t: "carry" }>): { readonly seen: readonly string[]; readonly gone: readonly string[] } {
  switch (r.t) {
    case "take": {
      if (!r.force && r.prev !== (s.holder?.k ?? null)) return { seen: [], gone: [] };
      const gone = s.holder !== null ? [s.holder.k] : [];
      s.holder = { k: r.k, o: r.o, l: r.l };
      s.queue = s.queue.filter((e) => e.k !== r.w && e.k !== r.k);
      if (r.w !== undefined) gone.push(r.w);
      return { seen: [r.k], gone };
    }
    case "renew":
      if (s.holder?.k !== r.k) return { seen: [], gone: [] };
      if (r.e !== undefined) s.holder = { ...s.holder, o: { ...s.holder.o, epoch: r.e } };
      return { seen: [r.k], gone: [] };
    case "release":
      if (s.holder?.k !== r.k) return { seen: [], gone: [] };
      s.holder = null;
      return { seen: [], gone: [r.k] };
    case "queue":
      if (s.holder?.k === r.k || s.queue.some((e) => e.k === r.k)) return { seen: [r.k], gone: [] };
      s.queue.push({ k: r.k, o: r.o, l: r.l });
      return { seen: [r.k], gone: [] };
    case "wait":
      return { seen: s.queue.some((e) => e.k === r.k) ? [r.k] : [], gone: [] };
    case "leave":
      s.queue = s.queue.filter((e) => e.k !== r.k);
      return { seen: [], gone: [r.k] };
    case "moved":
      s.moved = r.to;
      return { seen: [], gone: [] };
  }
}
