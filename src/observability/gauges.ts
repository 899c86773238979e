/**
 * The gauges a harness reports from its projection: executions queued and running, unresolved
 * UnknownExecutions, unread observations, pending timers, active runs, and the storage's own stats.
 */
import type { Projection } from "../state/projection.js";
import type { DatabaseStats } from "../storage/contract.js";
import type { Metrics } from "./metrics.js";

/** Sets every gauge from `projection` and `stats`. */
export function reportGauges(m: Metrics, projection: Projection, stats: DatabaseStats): void {
  let queued = 0;
  let running = 0;
  let unknown = 0;
  let inbox = 0;
  let timers = 0;
  let active = 0;
  let blocked = 0;
  for (const s of projection.sessions.values()) {
    if (s.terminal === null) active++;
    if (s.blocked !== null) blocked++;
    inbox += s.pending.length;
    for (const t of s.timers.values()) if (!t.fired) timers++;
    for (const e of s.executions.values()) {
      if (e.phase === "queued") queued++;
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
  m.storageStats(stats);
}
