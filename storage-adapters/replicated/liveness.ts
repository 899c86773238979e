/**
 * The owner's etcd lease: liveness, never safety. Fencing stays the epoch's job.
 *
 * - Open grants a lease (whole seconds, at least etcd's minimum) and claims the epoch in the same
 *   transaction that writes `<db>/liveness` attached to it, reading the previous owner record first.
 * - Renewal: a keep-alive every ttl/6 on a member the router picks (one short stream per renewal,
 *   bounded by a short attempt deadline, so a silent member costs one attempt); renewals overlap, so
 *   one stuck on a silent member does not hold up the next. `sentAt` of the last
 *   renewal etcd confirmed is taken on this process's monotonic clock *before* sending: etcd's leader
 *   receives it later, so the lease cannot expire before `sentAt + ttl` (given bounded clock drift).
 * - Lost: at `sentAt + ttl - margin` without a newer confirmed renewal, `onLost` fires: the harness
 *   SIGKILLs its cells' process groups and stops acting. After a fence the handle stops renewing.
 * - A new owner's `previousGone()` polls the previous owners' leases (LeaseTimeToLive, -1 = gone),
 *   skipping those whose process ran on this host and is gone. The claim's own transaction hands the
 *   earlier leases over to keys attached to them (open.ts `claim`; `handOver` here when it could not
 *   hold them all). A clean close revokes the lease.
 */
import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { EtcdLeaseInvalidError, type IRequestOp } from "etcd3";
import type { OwnershipLease } from "../../src/storage/contract.js";
import { keepAliveOnce } from "./client.js";
import type { Context } from "./context.js";
import type { Keys } from "./layout.js";
import { ownerGuard, putWithLease } from "./ops.js";

/** One owner's lease as `<db>/liveness` records it. */
export interface LeaseRef {
  readonly lease: string;
  readonly host: string;
  readonly pid: number;
}

export interface OwnerRecord extends LeaseRef {
  readonly epoch: number;
  readonly ttlMs: number;
  /** Earlier owners' leases this owner had not seen gone when it claimed. */
  readonly pending: readonly LeaseRef[];
}

/** Parses an owner record; null for anything else (an absent key, an older layout). */
export function parseOwner(value: string | null): OwnerRecord | null {
  if (value === null) return null;
  try {
    const o = JSON.parse(value) as OwnerRecord;
    // The pending leases are waited for and handed over by lease id: an item without one is dropped.
    const pending = Array.isArray(o.pending) ? o.pending.flatMap((r: unknown) => refOf(r)) : [];
    return typeof o.lease === "string" && typeof o.pid === "number" ? { ...o, pending } : null;
  } catch {
    return null;
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Safety margin before the lease could expire: the harness must have killed its cells by then. */
export function marginMs(ttlMs: number): number {
  return Math.max(500, Math.round(ttlMs / 4));
}

/** Renewals outstanding at once: a renewal stuck on a silent member does not hold up the next. */
const MAX_INFLIGHT = 4;

/** Grants a lease of `ttlMs` (rounded up to whole seconds). Returns its id (decimal string). */
export async function grantLease(ctx: Context, ttlMs: number): Promise<string> {
  const res = await ctx.call((client) => client.leaseClient.leaseGrant({ TTL: Math.ceil(ttlMs / 1000), ID: 0 }));
  return String(res.ID);
}

/** The live lease of an owned handle. */
export class ReplicatedLease implements OwnershipLease {
  private lastSentOk = performance.now();
  private lostTimer: NodeJS.Timeout | null = null;
  private ticker: NodeJS.Timeout | null = null;
  private inflight = new Set<Promise<void>>();
  private stopped = false;
  private lost: string | null = null;
  private released = false;
  private readonly listeners = new Set<(reason: string) => void>();
  private previous: Promise<void> | null = null;
  /** Every earlier owner's lease was seen gone (waitPrevious ended): nothing to hand over at close. */
  private previousSeenGone = false;
  /** The earlier owners' leases were handed over: by the claim's transaction, or right after it (handOverNow). */
  private handedOver = false;

  constructor(
    private readonly ctx: Context,
    private readonly db: string,
    private readonly keys: Keys,
    private readonly epoch: number,
    /** The etcd revision of the epoch claim: the owner's guard (ops.ts `ownerGuard`). */
    private readonly claimRevision: string,
    readonly id: string,
    readonly ttlMs: number,
    /** Leases of earlier owners to wait for (every one the open's reads saw named and not gone: open.ts `claim`). */
    private readonly waitFor: readonly LeaseRef[],
    grantedAt: number,
  ) {
    this.lastSentOk = grantedAt;
  }

  /** The owner record this lease is written as. */
  static record(epoch: number, lease: string, ttlMs: number, pending: readonly LeaseRef[]): string {
    const rec: OwnerRecord = { epoch, lease, host: hostname(), pid: process.pid, ttlMs, pending };
    return JSON.stringify(rec);
  }

  start(): void {
    this.arm();
    const every = Math.max(250, Math.round(this.ttlMs / 6));
    this.ticker = setInterval(() => this.renewOnce(), every);
    this.ticker.unref();
    this.renewOnce();
  }

  private arm(): void {
    if (this.lostTimer) clearTimeout(this.lostTimer);
    const at = this.lastSentOk + this.ttlMs - marginMs(this.ttlMs);
    this.lostTimer = setTimeout(() => this.markLost(`no renewal of the ownership lease confirmed for ${Math.round(performance.now() - this.lastSentOk)} ms (lease ${this.ttlMs} ms)`), Math.max(0, at - performance.now()));
    this.lostTimer.unref();
  }

  /**
   * One renewal on the member the router picks (another after a failed attempt), bounded by the time
   * left before the lease could be lost. Renewals overlap: the newest confirmed `sentAt` counts.
   */
  private renewOnce(): void {
    if (this.stopped || this.inflight.size >= MAX_INFLIGHT) return;
    const sentAt = performance.now();
    const p = this.keepAlive()
      .then((ttl) => {
        if (this.stopped || this.lost !== null) return;
        if (ttl <= 0) {
          this.markLost("etcd reports the ownership lease expired");
          return;
        }
        if (sentAt > this.lastSentOk) {
          this.lastSentOk = sentAt;
          this.arm();
        }
      })
      .catch((err: unknown) => {
        if (!this.stopped) this.ctx.log.warn({ db: this.db, err: (err as Error).message }, "could not renew the ownership lease; retrying");
      })
      .finally(() => this.inflight.delete(p));
    this.inflight.add(p);
  }

  /** One keep-alive on the member the router picks (another after a failed attempt): the TTL etcd reports (<= 0: gone). */
  private keepAlive(): Promise<number> {
    return this.ctx.router.call((client) => keepAliveOnce(client, this.id, this.ctx.router.keepAliveAttemptMs), Math.max(250, this.ttlMs - marginMs(this.ttlMs)));
  }

  /**
   * Before `start()`: a lease granted more than half its TTL ago (a slow cluster, a claim sent again
   * after refusals) is renewed once first, so that `start()` does not count it lost at once from its
   * grant time. Unanswered or gone: left to `start()` to judge from the grant time, as before.
   */
  async renewIfOld(): Promise<void> {
    if (performance.now() - this.lastSentOk < this.ttlMs / 2) return;
    const sentAt = performance.now();
    try {
      if ((await this.keepAlive()) > 0) this.lastSentOk = sentAt;
    } catch {
      // start() judges from the grant time
    }
  }

  private markLost(reason: string): void {
    if (this.lost !== null || this.released) return;
    this.lost = reason;
    this.halt();
    this.ctx.log.error({ db: this.db, epoch: this.epoch, reason }, "ownership lease lost: stop acting");
    for (const l of [...this.listeners]) {
      try {
        l(reason);
      } catch {
        // a listener's own bug must not stop the others
      }
    }
  }

  /** Fenced: this handle has no right to the lease any more; stop renewing (it runs out, or is released). */
  stopRenewing(): void {
    this.halt();
  }

  private halt(): void {
    this.stopped = true;
    if (this.ticker) clearInterval(this.ticker);
    this.ticker = null;
  }

  onLost(listener: (reason: string) => void): () => void {
    if (this.lost !== null) {
      queueMicrotask(() => listener(this.lost!));
      return () => {};
    }
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  held(): boolean {
    return this.lost === null && !this.released && !this.stopped;
  }

  remainingMs(): number {
    if (this.lost !== null || this.released) return 0;
    return Math.max(0, this.lastSentOk + this.ttlMs - marginMs(this.ttlMs) - performance.now());
  }

  /** Whether renewals stopped being confirmed (the owner is cut off, or its renewals go unanswered). */
  isLost(): boolean {
    return this.lost !== null;
  }

  previousGone(): Promise<void> {
    this.previous ??= this.waitPrevious();
    return this.previous;
  }

  /**
   * The earlier owners' leases still to wait for: never this lease itself (a claim resent after an
   * unanswered attempt that landed, router.ts resends on an outage, reads the record that attempt
   * wrote, which names this lease), nor one whose process ran on this host and is gone.
   */
  private openPrevious(): LeaseRef[] {
    const host = hostname();
    return this.waitFor.filter((r) => r.lease !== this.id && !(r.host === host && r.pid !== process.pid && !pidAlive(r.pid)));
  }

  private async waitPrevious(): Promise<void> {
    const host = hostname();
    const open = this.openPrevious();
    const t0 = performance.now();
    let logged = false;
    for (const ref of open) {
      for (;;) {
        if (this.released) return;
        let ttl: number;
        try {
          const res = await this.ctx.call((client) => client.leaseClient.leaseTimeToLive({ ID: ref.lease, keys: false }), false);
          ttl = Number(res.TTL);
        } catch {
          ttl = 1; // unknown: keep waiting
        }
        if (leaseGone(ttl)) break;
        if (ref.host === host && ref.pid !== process.pid && !pidAlive(ref.pid)) break;
        if (!logged) {
          logged = true;
          this.ctx.log.warn({ db: this.db, previousLease: ref.lease, previousHost: ref.host, previousPid: ref.pid }, "waiting for the previous owner's lease to end before launching anything");
        }
        await sleep(200);
      }
    }
    if (open.length > 0) this.ctx.log.info({ db: this.db, waitedMs: Math.round(performance.now() - t0) }, "the previous owner's lease is gone");
    this.previousSeenGone = true;
    // Nothing left to wait for: drop them from our record so that the next owner does not poll them.
    if (this.waitFor.length > 0 && !this.released && this.lost === null) {
      await this.ctx.txn([ownerGuard(this.keys.epoch, this.claimRevision)], [putWithLease(this.keys.liveness, ReplicatedLease.record(this.epoch, this.id, this.ttlMs, []), this.id)]).catch(() => undefined);
    }
  }

  /**
   * Hands the earlier owners' leases over (see handOver) right after the claim, when the claim's own
   * transaction could not hold them all (open.ts MAX_HANDED_IN_CLAIM), so that they are waited for by
   * the next opener whatever becomes of this owner: its record, which names them, goes with its lease
   * when it dies. Unanswered: done again at close, and meanwhile the record names them.
   */
  async handOverNow(): Promise<void> {
    if (this.handedOver) return;
    const open = this.openPrevious();
    if (open.length === 0) return;
    if ((await handOver(this.ctx, this.keys, this.claimRevision, open)) === "done") this.handedOver = true;
    else this.ctx.log.warn({ db: this.db }, "could not hand the earlier owners' leases over after the claim; retried at close");
  }

  /** The claim's own transaction handed every earlier lease over (open.ts `claim`): nothing left to hand over. */
  markHandedOver(): void {
    this.handedOver = true;
  }

  async release(): Promise<void> {
    if (this.released) return;
    // Fenced (renewals stopped) or lost: no owner record of ours to hand over.
    const owner = !this.stopped && this.lost === null;
    const left = this.remainingMs();
    this.released = true;
    // The owner record is attached to this lease, and revoking it deletes the record. If it still
    // names earlier owners' leases not seen gone and the hand-over after the claim went unanswered,
    // they are handed over now (see handOver), while this lease is still renewed, and within the time
    // it is sure to be held; if that cannot be done, the lease is left to run out.
    let handed: "done" | "unknown" = "done";
    if (owner && !this.previousSeenGone && !this.handedOver) {
      let timer: NodeJS.Timeout | undefined;
      handed = await Promise.race([
        handOver(this.ctx, this.keys, this.claimRevision, this.openPrevious()),
        new Promise<"unknown">((resolve) => (timer = setTimeout(() => resolve("unknown"), left))),
      ]).finally(() => clearTimeout(timer));
    }
    this.halt();
    if (this.lostTimer) clearTimeout(this.lostTimer);
    this.lostTimer = null;
    // Lost: renewals went unconfirmed, so the cluster is out of reach and the lease runs out by itself.
    if (this.lost !== null) return;
    if (handed === "unknown") {
      await Promise.all([...this.inflight]);
      return;
    }
    try {
      await this.ctx.router.call((client) => client.leaseClient.leaseRevoke({ ID: this.id }), Math.min(this.ctx.opts.commitTimeoutMs, this.ttlMs));
    } catch {
      // unreachable: the lease runs out by itself
    }
    await Promise.all([...this.inflight]);
  }
}

/**
 * Each earlier owner's lease still to wait for is written as `<db>/waitfor/<lease>` (layout.ts)
 * attached to that very lease; openers read those keys with the owner record (open.ts `claim`). The
 * claim's own transaction writes them (open.ts); this writes them, guarded by this owner's claim, only
 * when the claim could not hold them all: right after the claim (handOverNow), and again before a clean
 * close revokes this lease if that went unanswered. Each entry lasts exactly as long as its lease,
 * whoever renews or revokes it, and a lease already gone is refused by etcd and skipped here (the claim
 * drops it and is sent again). Without them, a close soon after an open (before `previousGone()`
 * resolved, or when no cell asked for it), or this owner's death, deleted the only record of a
 * previous owner whose cells may still run (the record is attached to this lease), and the next opener
 * launched beside them. Written right after the claim, an owner frozen between the two whose lease ran
 * out left that window open: hence the claim. (A first version attached the whole record to one
 * pending lease: that owner's revoke deleted it while an earlier one lived; a second, to a new lease of
 * the longest TTL left: an owner fenced without knowing it renews past that.)
 *
 * "done": every entry written or its lease gone, or this owner was fenced meanwhile (the new owner's
 * claim read the record as it was). "unknown": the cluster did not answer.
 */
async function handOver(ctx: Context, keys: Keys, claimRevision: string, open: readonly LeaseRef[]): Promise<"done" | "unknown"> {
  for (const ref of open) {
    try {
      const res = await ctx.txn([ownerGuard(keys.epoch, claimRevision)], [handOverOp(keys, ref)]);
      if (!res.succeeded) return "done";
    } catch (err) {
      if (leaseNotFound(err)) continue;
      // Unanswered: this lease is left to run out, and the record attached to it names them all.
      return "unknown";
    }
  }
  return "done";
}

/** The put of `<db>/waitfor/<lease>` naming `ref`, attached to that very lease (handOver, and the claim in open.ts). */
export function handOverOp(keys: Keys, ref: LeaseRef): IRequestOp {
  return putWithLease(keys.waitFor(ref.lease), JSON.stringify({ lease: ref.lease, host: ref.host, pid: ref.pid }), ref.lease);
}

/** etcd refused a request for a lease it does not hold (expired or revoked). */
export function leaseNotFound(err: unknown): boolean {
  return err instanceof EtcdLeaseInvalidError || (err instanceof Error && err.message.includes("requested lease not found"));
}

/** A `<db>/waitfor/<lease>` entry (handOver); null for anything else. */
export function parseLeaseRef(value: string | null): LeaseRef | null {
  if (value === null) return null;
  try {
    return refOf(JSON.parse(value))[0] ?? null;
  } catch {
    return null;
  }
}

/** `o` as a lease reference (a decimal lease id, a host and a pid), in a list of one; empty for anything else. */
function refOf(o: unknown): LeaseRef[] {
  const r = o as Partial<LeaseRef> | null;
  return typeof r?.lease === "string" && /^\d+$/.test(r.lease) && typeof r.host === "string" && typeof r.pid === "number" ? [{ lease: r.lease, host: r.host, pid: r.pid }] : [];
}

/**
 * Whether a lease's TTL as LeaseTimeToLive reports it says the lease is gone: -1. etcd reports the
 * remaining time in whole seconds rounded down, so 0 is a lease with less than a second left.
 */
export function leaseGone(ttl: number): boolean {
  return ttl < 0;
}
