/**
 * Test helpers for the state layer: frozen inputs, admission contexts, execution records, events.
 */
import type { AdmissionContext } from "../../src/state/admission.js";
import type { EventBody, EventKind, LogEvent } from "../../src/state/events.js";
import type { ExecutionRecord } from "../../src/state/projection.js";
import { queuedExecution, runtimeCellsView } from "../../src/state/projection.js";
import type { Cell, Observation, State } from "../../src/state/schema.js";
import { initialState } from "../../src/state/schema.js";

/** Freezes `value` and everything reachable from it; Maps and Sets become read-only too. */
export function deepFreeze<T>(value: T): T {
  if (value === null || typeof value !== "object" || Object.isFrozen(value)) return value;
  if (value instanceof Map) {
    for (const [k, v] of value) {
      deepFreeze(k);
      deepFreeze(v);
    }
    lock(value, ["set", "delete", "clear"]);
  } else if (value instanceof Set) {
    for (const v of value) deepFreeze(v);
    lock(value, ["add", "delete", "clear"]);
  }
  Object.freeze(value);
  for (const key of Reflect.ownKeys(value)) deepFreeze((value as Record<string | symbol, unknown>)[key]);
  return value;
}

function lock(target: object, methods: string[]): void {
  for (const m of methods) {
    Object.defineProperty(target, m, {
      value: () => {
        throw new TypeError(`attempt to ${m} on a frozen collection`);
      },
    });
  }
}

/** A valid PEP 723 script. */
export function script(body = "print('hi')"): string {
  return `# /// script\n# requires-python = ">=3.11"\n# dependencies = []\n# ///\n${body}\n`;
}

export const note = (id: number, text = `note ${id}`, extra: Partial<Cell> = {}, previous_id: number | null = null): Cell =>
  ({ id, previous_id, kind: "note", text, ...extra }) as Cell;
export const cmd = (id: number, argv: string[] = ["true"], previous_id: number | null = null): Cell => ({ id, previous_id, kind: "cmd", argv });
export const scriptCell = (id: number, source = script(), previous_id: number | null = null): Cell => ({ id, previous_id, kind: "script", source });

/** An execution record in a given phase/result. */
export function execution(cellId: number, phase: "queued" | "started" | "finished", result: ExecutionRecord["result"] = null, extra: Partial<ExecutionRecord> = {}): ExecutionRecord {
  const base = queuedExecution(cellId, "cmd", cellId);
  const unknown =
    result === "UnknownExecution" ? { type: "UnknownExecution" as const, cell_id: cellId, reason: "worker_lost_before_result_commit", worker_stopped: true, evidence_refs: [] } : null;
  return { ...base, phase, result: phase === "finished" ? (result ?? "success") : null, exit_code: phase === "finished" ? 0 : null, unknown, ...extra };
}

export interface CtxInit {
  cells?: Cell[];
  removed?: Cell[];
  revision?: number;
  nextId?: number;
  executions?: ExecutionRecord[];
  inbox?: Observation[];
  pending?: number;
  headSeq?: number;
  accepted?: AdmissionContext["accepted"];
}

/** An admission context built from cells and executions, with a consistent runtime view. */
export function makeCtx(init: CtxInit = {}): AdmissionContext {
  const cells = init.cells ?? [];
  const executions = new Map((init.executions ?? []).map((e) => [e.cell_id, e] as const));
  const cellsEver = new Map([...(init.removed ?? []), ...cells].map((c) => [c.id, c] as const));
  const maxId = Math.max(0, ...cellsEver.keys());
  const base = initialState("s1", "Fix the Flask route and pass tests");
  const state: State = {
    ...base,
    revision: init.revision ?? 12,
    cells,
    runtime: { ...base.runtime, next_cell_id: init.nextId ?? maxId + 1, inbox: init.inbox ?? [], cells: runtimeCellsView(cells, executions) },
  };
  return { state, executions, cellsEver, pendingObservations: init.pending ?? 0, headSeq: init.headSeq ?? 100, accepted: init.accepted ?? new Map() };
}

/** The mandatory first op. */
export const rev = (value: number) => ({ op: "test", path: "/revision", value });

/** Builds log events with consecutive seqs. */
export class LogBuilder {
  readonly events: LogEvent[] = [];
  private seq = 0;
  constructor(
    readonly session = "s1",
    readonly at = "2026-01-01T00:00:00.000Z",
  ) {}

  add<K extends EventKind>(kind: K, identity: string, body: EventBody<K>, session = this.session): LogEvent<K> {
    this.seq += 1;
    const e = { seq: this.seq, identity, kind, session, at: this.at, body } as LogEvent<K>;
    this.events.push(e as unknown as LogEvent);
    return e;
  }

  get head(): number {
    return this.seq;
  }
}

/** An external observation. */
export function observation(id: string, payload: unknown = { text: id }): Observation {
  return { id, source: "external", kind: "message", at: "2026-01-01T00:00:00.000Z", payload };
}
