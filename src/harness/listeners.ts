/**
 * Who hears about a harness's life: followers of committed batches, listeners for its stop
 * (fenced, poisoned, closed), and for a session driver that stopped on an error. A listener that
 * throws is logged and the others still hear.
 */
import type { Logger } from "pino";
import type { LogEvent } from "../state/events.js";
import type { CairnError } from "../errors.js";
import type { SessionProjection } from "../state/projection.js";
import type { HarnessStatus, RunOutcome } from "./types.js";

/** What `until` is told on each ask: an answer, a failure, or null (not yet). */
export type Probe<T> = { ok: true; value: T } | { ok: false; error: unknown } | null;

/**
 * What `Harness.wait` answers for `session` from what is known now: its end once the log has one;
 * otherwise the harness's stop error when it stopped, the driver's error when the driver gave up; or
 * null, not yet.
 */
export function runOutcome(session: string, s: SessionProjection | undefined, stopped: CairnError | null, driverError: unknown): Probe<RunOutcome> {
  if (s?.terminal) return { ok: true, value: { session, result: s.terminal.result, reason: s.terminal.reason } };
  if (stopped !== null) return { ok: false, error: stopped };
  return driverError ? { ok: false, error: driverError } : null;
}

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
  until<T>(session: string, probe: () => Probe<T>): Promise<T> {
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
