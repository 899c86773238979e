/**
 * Who hears about a harness's life: followers of committed batches, listeners for its stop
 * (fenced, poisoned, closed), and for a session driver that stopped on an error. A listener that
 * throws is logged and the others still hear.
 */
import type { Logger } from "pino";
import type { LogEvent } from "../state/events.js";
import type { CairnError } from "../errors.js";
import type { HarnessStatus } from "./types.js";

export class Listeners {
  private readonly followers = new Set<(events: readonly LogEvent[]) => void>();
  private readonly stops = new Set<(status: HarnessStatus, error: CairnError | null) => void>();
  private readonly failures = new Set<(session: string, err: unknown) => void>();

  constructor(private readonly logger: Logger) {}

  follow(listener: (events: readonly LogEvent[]) => void): () => void {
    this.followers.add(listener);
    return () => this.followers.delete(listener);
  }

  onStop(listener: (status: HarnessStatus, error: CairnError | null) => void): () => void {
    this.stops.add(listener);
    return () => this.stops.delete(listener);
  }

  onFailure(listener: (session: string, err: unknown) => void): () => void {
    this.failures.add(listener);
    return () => this.failures.delete(listener);
  }

  committed(events: readonly LogEvent[]): void {
    for (const f of this.followers) {
      try {
        f(events);
      } catch (err) {
        this.logger.error({ err }, "an event follower threw");
      }
    }
  }

  stopped(status: HarnessStatus, error: CairnError | null): void {
    for (const f of this.stops) {
      try {
        f(status, error);
      } catch (err) {
        this.logger.error({ err }, "a stop listener threw");
      }
    }
  }

  failed(session: string, err: unknown): void {
    for (const f of this.failures) f(session, err);
  }

  /**
   * Resolves or rejects with what `probe` says about `session` (null: not yet), asked now and after
   * every commit, stop and failure of that session, until it says something.
   */
  until<T>(session: string, probe: () => { ok: true; value: T } | { ok: false; error: unknown } | null): Promise<T> {
    return new Promise((resolve, reject) => {
      const check = (): void => {
        const r = probe();
        if (r === null) return;
        cleanup();
        if (r.ok) resolve(r.value);
        else reject(r.error);
      };
      const unfollow = this.follow(() => check());
      const unstop = this.onStop(() => check());
      const unfail = this.onFailure((s) => {
        if (s === session) check();
      });
      const cleanup = () => {
        unfollow();
        unstop();
        unfail();
      };
      check();
    });
  }
}
