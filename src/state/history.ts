/**
 * How much finished history a session's projection keeps.
 *
 * The projection must hold what the run still needs: the cells in context, every execution that is
 * queued, started or an unresolved UnknownExecution, every observation not yet consumed, the open
 * turn, every control note not yet handled, every outside observation (a re-post of one must stay a
 * duplicate forever). Everything else is history: finished executions of cells that left the
 * context, those cells, consumed harness observations (`execution:`, `timer:`, `control:`, `idle:`),
 * accepted turns. (Fired timers stay: registering a timer id again must keep answering with the timer
 * already registered, and a run has few.) The log keeps all of it (`cairn log`, the timeline); the projection
 * keeps the most recent HISTORY_KEEP of each kind, so a run's projection, its snapshot, the time to
 * open it and its etcd footprint stop growing with the number of rounds.
 *
 * Dropping is part of the fold (the reducer calls `dropHistory` when a turn is prepared), so it is
 * deterministic: a projection restored from a snapshot and a fold of the whole log drop the same
 * entries (the snapshot conformance property checks that they are equal). It is amortized: nothing
 * is scanned until a collection holds twice HISTORY_KEEP entries, then it is cut back to the most
 * recent HISTORY_KEEP of what may go.
 *
 * What a run notices: a patch that names a cell dropped from history (to cancel it or resolve it) is
 * answered as for a cell that does not exist, and `cairn status` lists the most recent HISTORY_KEEP
 * finished executions. Runs with fewer than HISTORY_KEEP finished cells see no difference at all.
 * Once a run has ended it keeps only ENDED_HISTORY_KEEP of each kind (below).
 *
 * Pure: no I/O, no clock.
 */
import { observationId } from "./events.js";
import { deleteCell, deleteExecution } from "./live-index.js";
import type { ControlRecord, ExecutionRecord, TurnRecord, ValidatorRecord } from "./projection.js";
import { isUnresolvedUnknown } from "./projection.js";
import type { Cell, Observation, State } from "./schema.js";
import { RESERVED_OBSERVATION_PREFIXES } from "./schema.js";

/** Finished entries of each kind the projection keeps (see the module comment). */
export const HISTORY_KEEP = 1000;

/**
 * Finished entries of each kind an ENDED run keeps. An ended run decides nothing more: what it keeps
 * is for `cairn status` and inspection (the log has the rest), so a database that has held many runs
 * does not carry each one's history in its projection, its snapshots and every open (a 100-round run
 * was about 114 KB of snapshot). Applied once, by the fold, when the run ends (`run_ended`): runs of
 * up to twice this many cells see no difference.
 */
export const ENDED_HISTORY_KEEP = 25;

/** The parts of a session's working projection that `dropHistory` may shrink, mutably. */
export interface HistoryParts {
  readonly state: State;
  readonly cells: Map<number, Cell>;
  readonly executions: Map<number, ExecutionRecord>;
  readonly observations: Map<string, Observation>;
  readonly consumed: Set<string>;
  readonly turns: Map<string, TurnRecord>;
  readonly open_turn: string | null;
  readonly controls: Map<number, ControlRecord>;
  readonly validators_run: Map<number, readonly ValidatorRecord[]>;
}

/** The oldest `count - keep` keys for which `may` holds, in the map's order (oldest first). */
function oldest<K, V>(map: ReadonlyMap<K, V>, keep: number, may: (key: K, value: V) => boolean): K[] {
  const candidates: K[] = [];
  for (const [k, v] of map) if (may(k, v)) candidates.push(k);
  return candidates.length > keep ? candidates.slice(0, candidates.length - keep) : [];
}

const harnessObservation = (id: string) => RESERVED_OBSERVATION_PREFIXES.some((p) => id.startsWith(p));

/** Drops history beyond `keep` of each kind, in place. Returns how many entries went (for tests). */
export function dropHistory(s: HistoryParts, keep: number = HISTORY_KEEP): number {
  let dropped = 0;
  const limit = 2 * keep;
  let inContext: Set<number> | null = null;
  const context = () => (inContext ??= new Set(s.state.cells.map((c) => c.id)));
  /** Cells named by a control note not handled yet (in context or not): their execution is still wanted. */
  let targeted: Set<number> | null = null;
  const targets = () => {
    if (targeted !== null) return targeted;
    targeted = new Set();
    for (const c of s.cells.values()) if (c.kind === "note" && c.role !== undefined && c.target_cell_id !== undefined && !s.controls.has(c.id)) targeted.add(c.target_cell_id);
    return targeted;
  };

  if (s.executions.size > limit) {
    const gone = oldest(s.executions, keep, (id, ex) => {
      if (ex.phase !== "finished" || isUnresolvedUnknown(ex) || context().has(id) || targets().has(id)) return false;
      // Not before the model has read how it ended: its observation is consumed (an error pauses the
      // queue until then), or it never had one (a cell cancelled before it started is told by the
      // control's observation). The driver that launched it also finds it finished after the commit
      // that carried its result (that commit prepares the next turn, which is when this runs).
      const oid = observationId.execution(id);
      return s.consumed.has(oid) || !s.observations.has(oid);
    });
    for (const id of gone) {
      deleteExecution(s.executions, id);
      deleteCell(s.cells, id); // out of context, and no control note waits on it
      const oid = observationId.execution(id);
      if (!s.observations.has(oid)) s.consumed.delete(oid);
      dropped++;
    }
  }
  // Cells with an execution go with it (above); the rest are notes and cells that never ran.
  if (s.cells.size - s.executions.size > limit) {
    const gone = oldest(s.cells, keep, (id, cell) => {
      if (context().has(id) || s.executions.has(id)) return false;
      // A note with a role stays until its control is handled.
      return cell.kind !== "note" || cell.role === undefined || s.controls.has(id);
    });
    for (const id of gone) {
      deleteCell(s.cells, id);
      s.controls.delete(id);
      s.validators_run.delete(id);
      dropped++;
    }
  }
  if (s.observations.size > limit) {
    const gone = oldest(s.observations, keep, (id) => harnessObservation(id) && s.consumed.has(id));
    for (const id of gone) {
      s.observations.delete(id);
      // `execution:<cell>` stays consumed while its execution is kept (a finished error pauses the
      // queue until its observation is consumed); it goes with the execution.
      if (!s.executions.has(executionCellOf(id))) s.consumed.delete(id);
      dropped++;
    }
  }
  // An accepted turn goes with any cell it created (a replay of it answers with those cells), and
  // beyond the most recent `keep`.
  const cellsDropped = dropped > 0;
  if (cellsDropped || s.turns.size > limit) {
    const named = (t: TurnRecord) => t.accepted !== null && t.accepted.new_cell_ids.some((id) => !s.cells.has(id));
    const orphans: string[] = [];
    if (cellsDropped) for (const [id, t] of s.turns) if (id !== s.open_turn && named(t)) orphans.push(id);
    for (const id of orphans) s.turns.delete(id);
    dropped += orphans.length;
    if (s.turns.size > limit) {
      const gone = oldest(s.turns, keep, (id, t) => id !== s.open_turn && t.accepted !== null);
      for (const id of gone) {
        s.turns.delete(id);
        dropped++;
      }
    }
  }
  return dropped;
}

/** The cell id of an `execution:<cell>` observation id, or -1. */
function executionCellOf(id: string): number {
  return id.startsWith("execution:") ? Number(id.slice("execution:".length)) : -1;
}
