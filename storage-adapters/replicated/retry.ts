/**
 * The replicated adapter's one retry pause, for every request it sends again after an outage: a call
 * after every member failed once (router.ts), a commit whose outcome is unknown (commit-pipeline.ts),
 * a watch moving to another member (watch.ts, and the etcd3 client's own watch reconnects), a claim
 * refused for a lease that just ran out (open.ts).
 *
 * 100 ms, doubling, at most 500 ms. Short, because an attempt that went unanswered already waited its
 * deadline and an etcd election takes about a second; capped, because a retry that waits longer than
 * the election only delays the commit that waits behind it. No jitter: the requests it spaces out are
 * a few per process, never a crowd.
 *
 * The shape (`duration`, `next()`) is cockatiel's IBackoff, which the etcd3 client takes for its
 * watch reconnects: its own default grows to 30 s, in timers that keep a process alive after close.
 */
import { setTimeout as sleep } from "node:timers/promises";

export const FIRST_PAUSE_MS = 100;
export const MAX_PAUSE_MS = 500;

/** One step of the policy: wait `duration` ms, then `next()` is the step after it. Immutable. */
export class Backoff {
  constructor(readonly duration: number = FIRST_PAUSE_MS) {}

  next(): Backoff {
    return new Backoff(Math.min(this.duration * 2, MAX_PAUSE_MS));
  }
}

/**
 * Retry pauses for one operation: `pause()` waits the current step (never longer than `capMs`, when
 * given: what is left of a deadline) and moves to the next; `reset()` after a success. The pause keeps
 * the process alive (a commit waiting for the quorum must), unless `ref` is false (a watch's retries
 * must not).
 */
export class Retry {
  private step = new Backoff();

  async pause(capMs = Number.POSITIVE_INFINITY, ref = true): Promise<void> {
    const ms = Math.max(0, Math.min(this.step.duration, capMs));
    this.step = this.step.next();
    await sleep(ms, undefined, { ref });
  }

  reset(): void {
    this.step = new Backoff();
  }
}
