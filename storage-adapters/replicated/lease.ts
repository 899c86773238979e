/**
 * Owner leases of the replicated adapter (liveness for standby workers, never safety: the epoch
 * compare in every commit fences, as before). The holder puts `cairn/db/<name>/owner` (JSON: its
 * token, host, pid, since, epoch, role) attached to an etcd lease that its own process keeps alive.
 * etcd deletes the key when the lease runs out, so a hung, SIGSTOPped or cut-off holder loses it
 * after the lease length, measured by etcd's clock alone (no clock comparison between machines).
 * Taking the lease is one transaction: the key must be absent (or `force`).
 *
 * Waiters queue under `cairn/db/<name>/waiting/<token>`, each key attached to its waiter's own etcd
 * lease (so a dead or frozen waiter drops out after the lease length). A free lease goes to the waiter
 * whose key has the lowest create revision (etcd's election recipe): a worker restarted by its
 * scheduler queues behind the standby that waited longer.
 */
import { randomUUID } from "node:crypto";
import type { Lease } from "etcd3";
import type { HeldLease, LeaseTicket, LeaseView, OwnerInfo, OwnerLeases } from "../../src/storage/contract.js";
import type { Context } from "./context.js";
import { checkDatabaseName, keysOf } from "./layout.js";
import { absent, del, get, kvsOf, prefixEnd, present, valueOf } from "./ops.js";

const b = (s: string): Buffer => Buffer.from(s, "utf8");

interface Stored extends OwnerInfo {
  readonly token: string;
}

/** The owner lease key of database `name` (under its prefix, so per-database roles cover it). */
export const ownerKey = (name: string): string => `${keysOf(name).prefix}owner`;

/** The prefix of the waiters' queue of database `name`. */
const waitingPrefix = (name: string): string => `${keysOf(name).prefix}waiting/`;

/** The oldest waiter of `name` (lowest create revision), as one range request. */
const oldestWaiter = (name: string) => ({
  request_range: { key: b(waitingPrefix(name)), range_end: prefixEnd(waitingPrefix(name)), sort_order: "Ascend" as const, sort_target: "Create" as const, limit: 1, keys_only: true },
});

class EtcdTicket implements LeaseTicket {
  private withdrawn = false;
  constructor(
    readonly key: string,
    private readonly lease: Lease,
  ) {}

  async withdraw(): Promise<void> {
    if (this.withdrawn) return;
    this.withdrawn = true;
    // Revoking the waiter's etcd lease deletes its key; bounded, as a silent member must not hang an exit.
    await Promise.race([this.lease.revoke().catch(() => undefined), new Promise((r) => setTimeout(r, 2000).unref())]);
    this.lease.release();
  }
}

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

    async acquire(name: string, owner: OwnerInfo, options: { readonly force?: boolean; readonly ticket?: LeaseTicket } = {}): Promise<HeldLease | null> {
      checkDatabaseName(name);
      const key = ownerKey(name);
      const ticket = options.ticket instanceof EtcdTicket ? options.ticket : undefined;
      const force = options.force === true;
      if (!force) {
        // A live holder, or a waiter queued before this one (any waiter, without a ticket): not our turn.
        let res;
        try {
          res = await ctx.txn([], [get(key), oldestWaiter(name)]);
        } catch (err) {
          throw ctx.fail(err, "read the owner lease of", name);
        }
        if (valueOf(res.responses, 0) !== null) return null;
        const first = kvsOf(res.responses, 1)[0];
        if (first !== undefined && first.key.toString("utf8") !== ticket?.key) return null;
      }
      const token = randomUUID();
      // One member client (router.ts): the library keeps the lease alive on it.
      const lease = ctx.router.pick().client.lease(ttlSeconds, { autoKeepAlive: true });
      try {
        const id = await lease.grant();
        const value = JSON.stringify({ token, ...owner } satisfies Stored);
        const putOp = { request_put: { key: b(key), value: b(value), lease: id } };
        const compare = force ? [] : [absent(key), ...(ticket ? [present(ticket.key)] : [])];
        const res = await ctx.txn(compare, [putOp, ...(ticket ? [del(ticket.key)] : [])]);
        if (!res.succeeded) {
          await lease.revoke().catch(() => undefined);
          return null;
        }
        if (ticket) await ticket.withdraw();
        return new EtcdHeldLease(ctx, key, token, owner, id, lease);
      } catch (err) {
        await lease.revoke().catch(() => undefined);
        throw ctx.fail(err, "take the owner lease of", name);
      }
    },

    async enqueue(name: string, owner: OwnerInfo): Promise<LeaseTicket> {
      checkDatabaseName(name);
      const key = `${waitingPrefix(name)}${randomUUID()}`;
      const lease = ctx.router.pick().client.lease(ttlSeconds, { autoKeepAlive: true });
      try {
        const id = await lease.grant();
        await ctx.txn([], [{ request_put: { key: b(key), value: b(JSON.stringify(owner)), lease: id } }]);
        return new EtcdTicket(key, lease);
      } catch (err) {
        await lease.revoke().catch(() => undefined);
        lease.release();
        throw ctx.fail(err, "queue for the owner lease of", name);
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
