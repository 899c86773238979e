/**
 * Whether the cluster holds a quorum, as this process sees it: a background poll of every member's
 * status (membersReachable, a leader known), run at once when a request goes unanswered, and
 * corrected by real requests (a linearizable success means held). Logs a warning when the quorum is lost and when it is
 * back. The poll is for stats and logs only: correctness never depends on it.
 */
import type { Etcd3, IOptions } from "etcd3";
import { closeEtcdClient, memberClient } from "./client.js";
import type { ReplicatedLogger } from "./options.js";

/** `http://localhost:2379/` and `http://127.0.0.1:2379` name the same member. */
function normalize(url: string): string {
  return url.replace(/\/+$/, "").replace("//localhost:", "//127.0.0.1:");
}

export interface QuorumView {
  readonly membersReachable: number;
  readonly membersTotal: number;
  readonly quorumHeld: boolean;
  /** Total seconds the quorum has been seen lost, since this monitor started. */
  readonly lostSeconds: number;
}

/**
 * Polls members and tracks quorum. `stop()` releases its clients; idempotent. Each member is polled
 * with a client of its own (its advertised client URL may not be one of the configured endpoints),
 * given `clientOptions` without the require-leader metadata (client.ts): a member without a leader
 * answers, and says so.
 */
export class HealthMonitor {
  private clients: { readonly url: string; readonly client: Etcd3 }[] = [];
  private timer: NodeJS.Timeout | null = null;
  private reachable = 0;
  private held = true;
  private lostSince: number | null = null;
  private lostTotalMs = 0;
  private polling = false;
  /** Per member URL: answered the last poll with a leader. */
  private readonly memberOk = new Map<string, boolean>();

  constructor(
    private readonly clientOptions: Omit<IOptions, "hosts">,
    private readonly intervalMs: number,
    private readonly log: ReplicatedLogger,
    private readonly now: () => number = Date.now,
  ) {}

  /** (Re)starts polling the given member client URLs. */
  start(memberUrls: readonly string[]): void {
    const known = new Set(this.clients.map((c) => c.url));
    if (memberUrls.length === known.size && memberUrls.every((u) => known.has(u)) && this.timer) return;
    this.closeClients();
    const deadlineMs = Math.max(500, this.intervalMs);
    this.clients = memberUrls.map((url) => ({ url, client: memberClient(url, this.clientOptions, deadlineMs) }));
    this.reachable = memberUrls.length;
    if (!this.timer) {
      this.timer = setInterval(() => void this.poll(), this.intervalMs);
      this.timer.unref();
    }
  }

  private async poll(): Promise<void> {
    if (this.polling || this.clients.length === 0) return;
    this.polling = true;
    try {
      const results = await Promise.all(
        this.clients.map(async ({ url, client }) => {
          let r = { up: false, leader: false };
          try {
            const s = await client.maintenance.status();
            r = { up: true, leader: s.leader !== "0" };
          } catch {
            // unreachable, silent or refusing: counted as down
          }
          this.memberOk.set(normalize(url), r.up && r.leader);
          return r;
        }),
      );
      this.reachable = results.filter((r) => r.up).length;
      const withLeader = results.filter((r) => r.leader).length;
      this.set(withLeader * 2 > this.clients.length, "members poll");
    } finally {
      this.polling = false;
    }
  }

  /**
   * A request went unanswered: poll the members now. (One dead member can fail a request while the
   * quorum holds, so the members' answers decide, not the failed request.)
   */
  noteOutage(): void {
    void this.poll();
  }

  /** A linearizable request succeeded: the quorum is held. */
  noteSuccess(): void {
    if (!this.held) this.set(true, "request succeeded");
  }

  private set(held: boolean, reason: string): void {
    if (held === this.held) return;
    const t = this.now();
    this.held = held;
    if (!held) {
      this.lostSince = t;
      this.log.warn({ membersReachable: this.reachable, membersTotal: this.clients.length, reason }, "etcd quorum lost: commits wait until a majority of members is back");
    } else {
      const waited = this.lostSince === null ? 0 : t - this.lostSince;
      this.lostTotalMs += waited;
      this.lostSince = null;
      this.log.warn({ membersReachable: this.reachable, membersTotal: this.clients.length, lostSeconds: waited / 1000 }, "etcd quorum is back");
    }
  }

  /** Whether member `url` answered the last poll with a leader (undefined: not polled yet). */
  member(url: string): boolean | undefined {
    return this.memberOk.get(normalize(url));
  }

  /** How long the quorum has been seen lost without a break, in ms (0 while held). */
  lostForMs(): number {
    return this.lostSince === null ? 0 : this.now() - this.lostSince;
  }

  /** The current view; never throws. */
  view(): QuorumView {
    const current = this.lostSince === null ? 0 : this.now() - this.lostSince;
    return {
      membersReachable: this.reachable,
      membersTotal: this.clients.length,
      quorumHeld: this.held,
      lostSeconds: (this.lostTotalMs + current) / 1000,
    };
  }

  private closeClients(): void {
    for (const c of this.clients) closeEtcdClient(c.client);
    this.clients = [];
    this.memberOk.clear();
  }

  /** Stops polling and closes the member clients. */
  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.closeClients();
  }
}
