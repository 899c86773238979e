/**
 * Deciding ahead of a commit: a session's projection as it will be once a finished cell's events
 * are folded. Pure.
 */
import type { NewEvent } from "./events.js";
import type { ExecutionRecord, SessionProjection } from "./projection.js";
import { registerOverlay } from "./live-index.js";

/**
 * The session as it will be once `events` (a finished cell's `execution_finished`, its outputs and
 * its `inbox_received`) are folded, for deciding the next step before they are committed; null for
 * any other kind of event (then they are committed first). Nothing is copied but the changed entries.
 */
export function speculate(s: SessionProjection, events: readonly NewEvent[]): SessionProjection | null {
  const executions = new Map<number, ExecutionRecord>();
  const pending = [...s.pending];
  for (const e of events) {
    if (e.kind === "execution_finished") {
      const ex = executions.get(e.body.cell_id) ?? s.executions.get(e.body.cell_id);
      if (ex === undefined) return null;
      executions.set(ex.cell_id, { ...ex, phase: "finished", result: e.body.result, unknown: e.body.unknown });
    } else if (e.kind === "inbox_received") {
      pending.push(e.body.observation.id);
    } else if (e.kind !== "execution_output") return null;
  }
  const view = overlay(s.executions, executions);
  registerOverlay(view, s.executions, executions);
  return { ...s, executions: view, pending };
}

/** A read-only map: `base` with `changes` replacing some of its entries (no new keys). */
function overlay<K, V>(base: ReadonlyMap<K, V>, changes: ReadonlyMap<K, V>): ReadonlyMap<K, V> {
  const view: ReadonlyMap<K, V> = {
    get: (k) => changes.get(k) ?? base.get(k),
    has: (k) => base.has(k),
    get size() {
      return base.size;
    },
    forEach: (f) => base.forEach((v, k) => f(changes.get(k) ?? v, k, view)),
    keys: () => base.keys(),
    values: function* () {
      for (const [k, v] of base) yield changes.get(k) ?? v;
    } as unknown as ReadonlyMap<K, V>["values"],
    entries: function* () {
      for (const [k, v] of base) yield [k, changes.get(k) ?? v] as [K, V];
    } as unknown as ReadonlyMap<K, V>["entries"],
    [Symbol.iterator]: () => view.entries(),
  };
  return view;
}
