/**
 * Routing of etcd calls around silent members.
 *
 * A member that is SIGSTOPped, partitioned or hung keeps its TCP connections open and answers
 * nothing; a member cut off from its peers answers, but has no leader. Either would cost every call
 * routed to it the full request deadline. So:
 *
 * - one etcd client per member (client.ts), and every call names the member it goes to: a short
 *   per-attempt deadline (`attemptTimeoutMs`), then the next member, until the call's overall
 *   deadline, pausing (retry.ts) after every member failed once;
 * - every call carries etcd's require-leader metadata, and gRPC keepalive drops a connection to a
 *   silent member (client.ts);
 * - members that just failed, and members the health monitor sees unreachable or leaderless, are
 *   tried last; the member that answered last is tried first.
 *
 * Retrying elsewhere is safe for every request the adapter sends: reads are idempotent, and writes
 * are guarded transactions whose failure branch reads back what happened (commit-pipeline.ts).
 */
import type { Etcd3, IOptions } from "etcd3";
import { closeEtcdClient, memberClient } from "./client.js";
import { classifyEtcdError } from "./etcd-errors.js";
import { Retry } from "./retry.js";

/** How long a member that failed an attempt is tried last. */
const PENALTY_MS = 3000;
/** A keep-alive is tiny: one that takes longer went to a silent member (renewals overlap anyway). */
const KEEPALIVE_ATTEMPT_MS = 1000;

export interface Member {
  readonly url: string;
  readonly client: Etcd3;
  penalizedUntil: number;
}

/** What the router asks the health monitor: is this member answering with a leader (undefined: not known). */
export type MemberHealth = (url: string) => boolean | undefined;

export class Router {
  readonly members: Member[];
  private preferred: Member | null = null;
  private closed = false;

  /** The deadline of one ownership lease keep-alive attempt (liveness.ts). */
  readonly keepAliveAttemptMs: number;

  constructor(
    endpoints: readonly string[],
    clientOptions: Omit<IOptions, "hosts">,
    attemptTimeoutMs: number,
    private readonly healthOf: MemberHealth,
    overallMs: number,
    private readonly now: () => number = Date.now,
  ) {
    this.keepAliveAttemptMs = Math.min(attemptTimeoutMs, KEEPALIVE_ATTEMPT_MS);
    this.members = endpoints.map((url) => ({ url, client: memberClient(url, clientOptions, attemptTimeoutMs, overallMs), penalizedUntil: 0 }));
  }

  /** Members in the order to try them: preferred, then healthy and unpenalized, then the rest. */
  order(): Member[] {
    const t = this.now();
    const rank = (m: Member): number => {
      const healthy = this.healthOf(m.url);
      let r = 0;
      if (m.penalizedUntil > t) r += 2;
      if (healthy === false) r += 4;
      if (m === this.preferred && r === 0) r = -1;
      return r;
    };
    const shuffled = [...this.members].sort(() => Math.random() - 0.5);
    return shuffled.sort((a, b) => rank(a) - rank(b));
  }

  /** A member to hold a stream on (a watch, the lease keep-alive): the first in `order()`. */
  pick(exclude?: Member): Member {
    const all = this.order();
    return all.find((m) => m !== exclude) ?? all[0]!;
  }

  /** Marks `m` as having failed an attempt: tried last for a while. */
  penalize(m: Member): void {
    m.penalizedUntil = this.now() + PENALTY_MS;
    if (this.preferred === m) this.preferred = null;
  }

  /**
   * Runs `op` on one member after another (each attempt bounded by the per-attempt deadline) until
   * one answers or `overallMs` has passed. Errors that are not outages (refusals, auth, too large)
   * are thrown at once; the last outage is thrown when time runs out.
   */
  async call<T>(op: (client: Etcd3, member: Member) => Promise<T>, overallMs: number): Promise<T> {
    const deadline = this.now() + overallMs;
    let last: unknown = null;
    const retry = new Retry();
    for (;;) {
      for (const m of this.order()) {
        const remaining = deadline - this.now();
        if (remaining <= 0 || this.closed) break;
        try {
          const res = await op(m.client, m);
          this.preferred = m;
          m.penalizedUntil = 0;
          return res;
        } catch (err) {
          if (classifyEtcdError(err) !== "outage") throw err;
          this.penalize(m);
          last = err;
        }
      }
      const remaining = deadline - this.now();
      if (remaining <= 0 || this.closed) throw last ?? new Error("no etcd member answered");
      await retry.pause(remaining);
    }
  }

  close(): void {
    this.closed = true;
    for (const m of this.members) closeEtcdClient(m.client);
  }
}
