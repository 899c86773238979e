/**
 * Owner leases of the replicated adapter (liveness for standby workers, never safety: the epoch
 * compare in every commit fences, as before). The holder puts `cairn/db/<name>/owner` (JSON: its
 * token, host, pid, since, epoch, role) attached to an etcd lease that its own process keeps alive.
 * etcd deletes the key when the lease runs out, so a hung, SIGSTOPped or cut-off holder loses it
 * after the lease length, measured by etcd's clock alone (no clock comparison between machines).
 * Taking the lease is one transaction: the key must be absent (or `force`).
 */
import { randomUUID } from "node:crypto";
import type { Lease } from "etcd3";
import type { HeldLease, LeaseView, OwnerInfo, OwnerLeases } from "../../src/storage/contract.js";
import type { Context } from "./context.js";
import { checkDatabaseName, keysOf } from "./layout.js";
import { absent, get, valueOf } from "./ops.js";

const b = (s: string): Buffer => Buffer.from(s, "utf8");

interface Stored extends OwnerInfo {
  readonly token: string;
}

/** The owner lease key of database `name` (under its prefix, so per-database roles cover it). */
export const ownerKey = (name: string): string => `${keysOf(name).prefix}owner`;

export function replicatedLeases(ctx: Context, ttlMs: number): OwnerLeases {
  const ttlSeconds = Math.max(1, Math.ceil(ttlMs / 1000));
  return {
    ttlMs: ttlSeconds * 1000,

    async read(name: string): Promise<LeaseView | null> {
      checkDatabaseName(name);
      let value: string | null;
      try {
        value = valueOf((await ctx.txn([], [get(ownerKey(name))])).responses, 0);
      } catch (err) {
        throw ctx.fail(err, "read the owner lease of", name);
      }
      if (value === null) return null;
      const s = JSON.parse(value) as Stored;
      return { owner: { host: s.host, pid: s.pid, since: s.since, epoch: s.epoch, role: s.role }, live: true };
    },

    async acquire(name: string, owner: OwnerInfo, options: { readonly force?: boolean } = {}): Promise<HeldLease | null> {
      checkDatabaseName(name);
      const key = ownerKey(name);
      const token = randomUUID();
      // One member client (router.ts): the library keeps the lease alive on it.
      const lease = ctx.router.pick().client.lease(ttlSeconds, { autoKeepAlive: true });
      try {
        const id = await lease.grant();
        const value = JSON.stringify({ token, ...owner } satisfies Stored);
        const putOp = { request_put: { key: b(key), value: b(value), lease: id } };
        const res = await ctx.txn(options.force === true ? [] : [absent(key)], [putOp]);
        if (!res.succeeded) {
          await lease.revoke().catch(() => undefined);
          return null;
        }
        return new EtcdHeldLease(ctx, key, token, owner, id, lease);
      } catch (err) {
        await lease.revoke().catch(() => undefined);
        throw ctx.fail(err, "take the owner lease of", name);
      }
    },
  };
}

class EtcdHeldLease implements HeldLease {
  private readonly listeners: ((why: string) => void)[] = [];
  private lost: string | null = null;
  private released = false;

  constructor(
    private readonly ctx: Context,
    private readonly key: string,
    private readonly token: string,
    private owner: OwnerInfo,
    private readonly id: string,
    private readonly lease: Lease,
  ) {
    lease.on("lost", (err) => this.lose(`the etcd lease ran out (${err.message})`));
  }

  private lose(why: string): void {
    if (this.lost !== null || this.released) return;
    this.lost = why;
    for (const l of this.listeners) l(why);
  }

  async update(epoch: number): Promise<void> {
    if (this.released) return;
    this.owner = { ...this.owner, epoch };
    const value = JSON.stringify({ token: this.token, ...this.owner } satisfies Stored);
    const res = await this.ctx.txn(
      [{ key: b(this.key), target: "Lease", result: "Equal", lease: this.id }],
      [{ request_put: { key: b(this.key), value: b(value), lease: this.id } }],
    );
    if (!res.succeeded) this.lose("another process took the lease over");
  }

  onLost(listener: (why: string) => void): void {
    if (this.lost !== null) listener(this.lost);
    else this.listeners.push(listener);
  }

  async release(): Promise<void> {
    if (this.released) return;
    this.released = true;
    // Revoking deletes the key only if it is still attached to our lease (a forced taker's key stays).
    await Promise.race([this.lease.revoke().catch(() => undefined), new Promise((r) => setTimeout(r, 2000).unref())]);
    this.lease.release();
  }
}
