/**
 * The gauges a harness reports from its projection: executions queued and running, unresolved
 * UnknownExecutions, unread observations, pending timers, active runs, and the storage's own stats.
 */
import type { Projection } from "../state/projection.js";
import type { DatabaseStats } from "../storage/contract.js";
import type { Metrics } from "./metrics.js";

/** Sets every gauge from `projection` and `stats`; `now` (ms) dates the oldest approval's wait. */
export function reportGauges(m: Metrics, projection: Projection, stats: DatabaseStats, now: number = Date.now()): void {
  let queued = 0;
  let running = 0;
  let unknown = 0;
  let inbox = 0;
  let timers = 0;
  let active = 0;
  let blocked = 0;
  let paused = 0;
  let waiting = 0;
  let oldest: number | null = null;
  for (const s of projection.sessions.values()) {
    if (s.terminal === null) active++;
    if (s.blocked !== null) blocked++;
    if (s.paused !== null) paused++;
    inbox += s.pending.length;
    for (const t of s.timers.values()) if (!t.fired) timers++;
    for (const e of s.executions.values()) {
      if (e.phase === "queued") {
        queued++;
        if (e.approval?.state === "waiting" && s.terminal === null) {
          waiting++;
          const since = Date.parse(e.approval.requested_at);
          if (Number.isFinite(since) && (oldest === null || since < oldest)) oldest = since;
        }
      }
      else if (e.phase === "started") running++;
      else if (e.result === "UnknownExecution" && e.resolved_by === null) unknown++;
    }
  }
  m.setExecutions(queued, running);
  m.unresolvedUnknown(unknown);
  m.setInbox(inbox);
  m.setTimersPending(timers);
  m.setRunsActive(active);
  m.setRunsBlocked(blocked);
  m.setRunsPaused(paused);
  m.setApprovalsWaiting(waiting, oldest === null ? 0 : Math.max(0, (now - oldest) / 1000));
  m.storageStats(stats);
}
