/**
 * Whether the cluster holds a quorum, as this process sees it: a background poll of every member's
 * status (membersReachable, a leader known), run at once when a request goes unanswered, and
 * corrected by real requests (a linearizable success means held). Logs a warning when the quorum is lost and when it is
 * back. The poll is for stats and logs only: correctness never depends on it.
 */
import { Etcd3, type IOptions } from "etcd3";
import type { ReplicatedLogger } from "./options.js";
import type { TxnWire } from "./txn-wire.js";

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

/** One member's poll: `status()` resolves with the leader it knows ("0": none), rejects when it does not answer. */
interface Poller {
  readonly url: string;
  status(): Promise<{ readonly leader: string }>;
  close(): void;
}

/**
 * Polls members and tracks quorum. `stop()` releases its clients; idempotent. Each member is polled
 * on a txn-wire connection of its own when `wireFor` gives one (a status call there costs a fraction
 * of the etcd3 client's: the poll runs every second for the process's life), else with an etcd3
 * client (etcd authentication).
 */
export class HealthMonitor {
  private clients: Poller[] = [];
  private timer: NodeJS.Timeout | null = null;
  private reachable = 0;
  private held = true;
  private lostSince: number | null = null;
  private lostTotalMs = 0;
  private polling = false;
  /** Polls answered on txn-wire connections (stats). */
  pollsHttp2 = 0;
  /** Per member URL: answered the last poll with a leader. */
  private readonly memberOk = new Map<string, boolean>();

  constructor(
    private readonly clientOptions: Omit<IOptions, "hosts">,
    private readonly intervalMs: number,
    private readonly log: ReplicatedLogger,
    private readonly wireFor: (url: string) => TxnWire | null = () => null,
    private readonly now: () => number = Date.now,
  ) {}

  /** (Re)starts polling the given member client URLs. */
  start(memberUrls: readonly string[]): void {
    const known = new Set(this.clients.map((c) => c.url));
    if (memberUrls.length === known.size && memberUrls.every((u) => known.has(u)) && this.timer) return;
    this.closeClients();
    const deadlineMs = Math.max(500, this.intervalMs);
    this.clients = memberUrls.map((url): Poller => {
      const wire = this.wireFor(url);
      if (wire !== null) {
        return {
          url,
          status: () => {
            this.pollsHttp2++;
            return wire.status(deadlineMs);
          },
          close: () => wire.close(),
        };
      }
      const client = new Etcd3({ ...this.clientOptions, hosts: [url], defaultCallOptions: () => ({ deadline: Date.now() + deadlineMs }) });
      return { url, status: () => client.maintenance.status(), close: () => client.close() };
    });
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
        this.clients.map(async ({ url, status }) => {
          let r = { up: false, leader: false };
          try {
            const s = await status();
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
    for (const c of this.clients) c.close();
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
