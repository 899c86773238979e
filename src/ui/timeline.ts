/**
 * The timeline of a database: rounds, cells, ownership changes and marks (timers, posts, controls,
 * the run's end), folded from the event log for `cairn log` and the timeline page.
 *
 * Pure: no I/O, no clock. `TimelineBuilder.apply` takes events in seq order (as the storage returns
 * them) and keeps, per session, one view per round and per executable cell. It remembers which views
 * an `apply` changed (`takeChanges`), so the page streams only what moved. Output is kept per cell
 * (at most what the harness recorded: 1 MiB per execution by default) and served on request.
 */
import { MAX_CELL_EFFECTS } from "../state/effects.js";
import type { LogEvent } from "../state/events.js";
import type { Cell } from "../state/schema.js";

/** One model round: its attempts, refusals, tokens and model latency. */
export interface RoundView {
  readonly n: number;
  readonly turn: string;
  /** When the round was prepared, and when it ended (its patch accepted; null while open). */
  readonly start: string;
  end: string | null;
  outcome: "open" | "accepted";
  attempts: number;
  failed: { attempt: number; error: string; retryable: boolean }[];
  rejected: { attempt: number; code: string; reason: string }[];
  tokens_in: number;
  tokens_out: number;
  /** Milliseconds from each attempt's start to its response or failure, summed. */
  latency_ms: number;
  revision: number | null;
  new_cells: { id: number; kind: string; summary: string; role?: string }[];
  removed: number[];
}

/** One executable cell's execution: where it ran, how long, how it ended. */
export interface CellView {
  readonly id: number;
  readonly kind: "script" | "cmd";
  readonly summary: string;
  /** The round whose patch added it. */
  readonly round: number | null;
  readonly queued_at: string;
  started_at: string | null;
  finished_at: string | null;
  host: string | null;
  pid: number | null;
  /** The ownership epoch in effect when it started (from `owner_claimed`), if recorded. */
  epoch: number | null;
  /** Where it ran: the sandbox ("bwrap" or "none") and its network, as recorded at launch. */
  sandbox: "bwrap" | "none" | null;
  network: "off" | "host" | null;
  result: "success" | "error" | "cancelled" | "UnknownExecution" | null;
  exit_code: number | null;
  signal: string | null;
  duration_ms: number | null;
  output_bytes: number;
  dropped_bytes: number;
  detail: string | null;
  unknown: { reason: string; worker_stopped: boolean } | null;
  /** The resolution note that resolved an UnknownExecution, and when. */
  resolved_by: { note_id: number; at: string } | null;
  /** Its approval gate: waiting for a person, or how they decided (null: no rule asked for one). */
  approval: { state: "waiting" | "approved" | "denied"; rule: string; requested_at: string; decided_at: string | null; reason: string | null } | null;
  /** Effects it began or ended (`cairn effect`; the first MAX_CELL_EFFECTS): begun while it runs, uncertain once it finished without ending one, done. */
  effects: { name: string; status: "begun" | "uncertain" | "done"; result?: unknown }[];
}

/** A change of owner for a session: a new epoch's first commit. */
export interface OwnerView {
  readonly epoch: number;
  readonly host: string;
  readonly pid: number;
  readonly at: string;
}

/** Something that happened at one instant: a timer, a post from outside, a control note, an operator's request, the end. */
export interface MarkView {
  readonly kind: "timer_registered" | "timer_fired" | "post" | "control" | "validator" | "pause" | "unpause" | "cancel" | "approval" | "fork" | "end";
  readonly at: string;
  readonly text: string;
  readonly outcome: "success" | "failure" | "info";
}

export interface SessionView {
  readonly id: string;
  readonly goal: string;
  readonly cwd: string;
  readonly created_at: string;
  /** The time of the last event of the session. */
  last_at: string;
  status: "running" | "paused" | "success" | "failure" | "cancelled";
  reason: string | null;
  /** While paused: why and since when. */
  paused: { reason: string; at: string; now: boolean } | null;
  /** For a fork: the run and round it comes from. */
  fork_of: { session: string; round: number } | null;
  /** Cells waiting for a person's approval now. */
  awaiting_approval: number[];
  rounds: RoundView[];
  cells: CellView[];
  owners: OwnerView[];
  marks: MarkView[];
}

/** What one `apply` changed, for streaming: changed views only (owners and marks are appended). */
export interface TimelineChanges {
  readonly head: number;
  readonly sessions: {
    readonly id: string;
    readonly header: Omit<SessionView, "rounds" | "cells" | "owners" | "marks">;
    readonly rounds: readonly RoundView[];
    readonly cells: readonly CellView[];
    readonly owners: readonly OwnerView[];
    readonly marks: readonly MarkView[];
  }[];
}

interface SessionWork {
  view: SessionView;
  rounds: Map<string, RoundView>;
  cells: Map<number, CellView>;
  /** Every cell version by id (notes too), for summaries. */
  defs: Map<number, Cell>;
  output: Map<number, string[]>;
  attemptStart: Map<string, number>;
  epoch: number | null;
  lastTurn: RoundView | null;
  patches: Map<number, unknown>;
  /** Cells that began each effect name (their listing turns done when it ends). */
  effectCells: Map<string, Set<number>>;
  dirtyHeader: boolean;
  dirtyRounds: Set<RoundView>;
  dirtyCells: Set<CellView>;
  newOwners: OwnerView[];
  newMarks: MarkView[];
}

/** A one-line summary of a cell (the command line, the note text, a script's first code line). */
export function cellSummary(c: Cell): string {
  const s = c.kind === "note" ? c.text : c.kind === "cmd" ? c.argv.join(" ") : `python: ${c.source.split("\n").find((l) => l.trim() !== "" && !l.trim().startsWith("#"))?.trim() ?? "(comments only)"}`;
  const one = s.replace(/\s+/g, " ").trim();
  return one.length > 160 ? `${one.slice(0, 157)}...` : one;
}

function cellsOfPatch(patch: unknown): Cell[] {
  if (!Array.isArray(patch)) return [];
  const out: Cell[] = [];
  for (const op of patch as { op?: unknown; value?: unknown }[]) {
    if ((op.op === "add" || op.op === "replace") && op.value !== null && typeof op.value === "object" && "id" in op.value && "kind" in op.value) out.push(op.value as Cell);
  }
  return out;
}

const ms = (iso: string): number => Date.parse(iso);

/** Folds events into per-session timelines. Apply in seq order; an event seen twice is ignored. */
export class TimelineBuilder {
  private headSeq = 0;
  private readonly sessions = new Map<string, SessionWork>();
  private readonly order: string[] = [];

  get head(): number {
    return this.headSeq;
  }

  apply(events: readonly LogEvent[]): void {
    for (const e of events) {
      if (e.seq <= this.headSeq) continue;
      this.headSeq = e.seq;
      this.applyOne(e);
    }
  }

  /** Every session, in creation order. Live objects: serialize before holding across `apply`. */
  views(): SessionView[] {
    return this.order.map((id) => this.sessions.get(id)!.view);
  }

  view(session: string): SessionView | undefined {
    return this.sessions.get(session)?.view;
  }

  /** The output a cell recorded (stdout and stderr interleaved, in order), or undefined. */
  output(session: string, cell: number): { text: string; bytes: number; dropped_bytes: number } | undefined {
    const s = this.sessions.get(session);
    const c = s?.cells.get(cell);
    if (s === undefined || c === undefined) return undefined;
    return { text: (s.output.get(cell) ?? []).join(""), bytes: c.output_bytes, dropped_bytes: c.dropped_bytes };
  }

  /** The accepted patch of round `n`, or the last response's patch while the round is open. */
  patch(session: string, n: number): unknown {
    return this.sessions.get(session)?.patches.get(n);
  }

  /** What changed since the last call (everything, the first time), and forgets it. */
  takeChanges(): TimelineChanges {
    const out: TimelineChanges["sessions"][number][] = [];
    for (const id of this.order) {
      const s = this.sessions.get(id)!;
      if (!s.dirtyHeader && s.dirtyRounds.size === 0 && s.dirtyCells.size === 0 && s.newOwners.length === 0 && s.newMarks.length === 0) continue;
      const { rounds: _r, cells: _c, owners: _o, marks: _m, ...header } = s.view;
      out.push({ id, header, rounds: [...s.dirtyRounds], cells: [...s.dirtyCells], owners: s.newOwners, marks: s.newMarks });
      s.dirtyHeader = false;
      s.dirtyRounds = new Set();
      s.dirtyCells = new Set();
      s.newOwners = [];
      s.newMarks = [];
    }
    return { head: this.headSeq, sessions: out };
  }

  private mark(s: SessionWork, m: MarkView): void {
    s.view.marks.push(m);
    s.newMarks.push(m);
  }

  private applyOne(e: LogEvent): void {
    if (e.kind === "session_created") {
      const fork = e.body.fork;
      const view: SessionView = {
        id: e.session, goal: e.body.goal, cwd: e.body.cwd, created_at: e.at, last_at: e.at, status: "running", reason: null, paused: null,
        fork_of: fork === undefined ? null : { session: fork.session, round: fork.round }, awaiting_approval: [], rounds: [], cells: [], owners: [], marks: [],
      };
      this.sessions.set(e.session, {
        view, rounds: new Map(), cells: new Map(), defs: new Map(), output: new Map(), attemptStart: new Map(), epoch: null, lastTurn: null, patches: new Map(), effectCells: new Map(),
        dirtyHeader: true, dirtyRounds: new Set(), dirtyCells: new Set(), newOwners: [], newMarks: [],
      });
      this.order.push(e.session);
      if (fork !== undefined) this.mark(this.sessions.get(e.session)!, { kind: "fork", at: e.at, text: `forked from run ${fork.session} after round ${fork.round}`, outcome: "info" });
      return;
    }
    const s = this.sessions.get(e.session);
    if (s === undefined) return; // the reducer refuses such a log; the view skips it
    if (e.at > s.view.last_at) s.view.last_at = e.at;
    s.dirtyHeader = true;
    const round = (turn: string): RoundView | undefined => s.rounds.get(turn);
    const touchRound = (r: RoundView): void => void s.dirtyRounds.add(r);
    const touchCell = (c: CellView): void => void s.dirtyCells.add(c);
    switch (e.kind) {
      case "owner_claimed": {
        s.epoch = e.body.epoch;
        const o = { epoch: e.body.epoch, host: e.body.host, pid: e.body.pid, at: e.at };
        s.view.owners.push(o);
        s.newOwners.push(o);
        return;
      }
      case "turn_prepared": {
        const r: RoundView = { n: e.body.n, turn: e.body.turn, start: e.at, end: null, outcome: "open", attempts: 0, failed: [], rejected: [], tokens_in: 0, tokens_out: 0, latency_ms: 0, revision: null, new_cells: [], removed: [] };
        s.rounds.set(e.body.turn, r);
        s.view.rounds.push(r);
        s.lastTurn = r;
        touchRound(r);
        return;
      }
      case "model_attempt": {
        const r = round(e.body.turn);
        if (r === undefined) return;
        r.attempts = Math.max(r.attempts, e.body.attempt);
        s.attemptStart.set(`${e.body.turn}:${e.body.attempt}`, ms(e.at));
        touchRound(r);
        return;
      }
      case "model_attempt_failed":
      case "model_response": {
        const r = round(e.body.turn);
        if (r === undefined) return;
        const t0 = s.attemptStart.get(`${e.body.turn}:${e.body.attempt}`);
        if (t0 !== undefined && Number.isFinite(t0)) r.latency_ms += Math.max(0, ms(e.at) - t0);
        if (e.body.usage) {
          r.tokens_in += e.body.usage.input_tokens;
          r.tokens_out += e.body.usage.output_tokens;
        }
        if (e.kind === "model_attempt_failed") r.failed.push({ attempt: e.body.attempt, error: e.body.error, retryable: e.body.retryable });
        else if (r.outcome === "open") s.patches.set(r.n, e.body.patch);
        touchRound(r);
        return;
      }
      case "patch_rejected": {
        const r = round(e.body.turn);
        if (r === undefined) return;
        r.rejected.push({ attempt: e.body.attempt, code: e.body.code, reason: e.body.reason });
        touchRound(r);
        return;
      }
      case "patch_accepted": {
        const r = round(e.body.turn);
        const added = cellsOfPatch(e.body.patch);
        for (const c of added) s.defs.set(c.id, c);
        if (r === undefined) return;
        r.end = e.at;
        r.outcome = "accepted";
        r.revision = e.body.revision;
        r.new_cells = e.body.new_cell_ids.map((id) => {
          const c = s.defs.get(id);
          return { id, kind: c?.kind ?? "?", summary: c ? cellSummary(c) : "", ...(c?.kind === "note" && c.role !== undefined ? { role: c.role } : {}) };
        });
        r.removed = [...e.body.removed_ids];
        s.patches.set(r.n, e.body.patch);
        touchRound(r);
        return;
      }
      case "execution_queued": {
        const def = s.defs.get(e.body.cell_id);
        const c: CellView = {
          id: e.body.cell_id, kind: e.body.kind, summary: def ? cellSummary(def) : "", round: s.lastTurn?.n ?? null, queued_at: e.at,
          started_at: null, finished_at: null, host: null, pid: null, epoch: null, sandbox: null, network: null, result: null, exit_code: null, signal: null, duration_ms: null,
          output_bytes: 0, dropped_bytes: 0, detail: null, unknown: null, resolved_by: null, approval: null, effects: [],
        };
        s.cells.set(c.id, c);
        s.view.cells.push(c);
        touchCell(c);
        return;
      }
      case "execution_started": {
        const c = s.cells.get(e.body.cell_id);
        if (c === undefined) return;
        c.started_at = e.at;
        c.host = e.body.host;
        c.pid = e.body.pid;
        c.epoch = s.epoch;
        c.sandbox = e.body.sandbox ?? null;
        c.network = e.body.network ?? null;
        touchCell(c);
        return;
      }
      case "execution_output": {
        const c = s.cells.get(e.body.cell_id);
        if (c === undefined) return;
        const parts = s.output.get(c.id) ?? [];
        parts.push(e.body.data);
        s.output.set(c.id, parts);
        c.output_bytes += Buffer.byteLength(e.body.data, "utf8");
        touchCell(c);
        return;
      }
      case "execution_finished": {
        const c = s.cells.get(e.body.cell_id);
        if (c === undefined) return;
        const b = e.body;
        c.finished_at = e.at;
        c.result = b.result;
        c.exit_code = b.exit_code;
        c.signal = b.signal;
        c.duration_ms = b.duration_ms;
        c.output_bytes = b.output_bytes;
        c.dropped_bytes = b.dropped_bytes;
        c.detail = b.detail;
        c.unknown = b.unknown ? { reason: b.unknown.reason, worker_stopped: b.unknown.worker_stopped } : null;
        s.view.awaiting_approval = s.view.awaiting_approval.filter((id) => id !== c.id);
        for (const f of c.effects) if (f.status === "begun") f.status = "uncertain";
        touchCell(c);
        return;
      }
      case "approval_requested": {
        const c = s.cells.get(e.body.cell_id);
        if (c !== undefined) {
          c.approval = { state: "waiting", rule: e.body.rule, requested_at: e.at, decided_at: null, reason: null };
          touchCell(c);
        }
        if (!s.view.awaiting_approval.includes(e.body.cell_id)) s.view.awaiting_approval.push(e.body.cell_id);
        this.mark(s, { kind: "approval", at: e.at, text: `cell ${e.body.cell_id} waits for approval (rule ${e.body.rule})`, outcome: "info" });
        return;
      }
      case "approval_decided": {
        const c = s.cells.get(e.body.cell_id);
        if (c !== undefined && c.approval !== null) {
          c.approval = { ...c.approval, state: e.body.decision, decided_at: e.at, reason: e.body.reason === "" ? null : e.body.reason };
          touchCell(c);
        }
        s.view.awaiting_approval = s.view.awaiting_approval.filter((id) => id !== e.body.cell_id);
        const why = e.body.reason !== "" ? `: ${e.body.reason}` : "";
        this.mark(s, { kind: "approval", at: e.at, text: `cell ${e.body.cell_id} ${e.body.decision}${why}`, outcome: e.body.decision === "approved" ? "success" : "failure" });
        return;
      }
      case "run_paused":
        s.view.status = "paused";
        s.view.paused = { reason: e.body.reason, at: e.at, now: e.body.now };
        this.mark(s, { kind: "pause", at: e.at, text: `paused by an operator${e.body.now ? " (the running cell stopped)" : ""}${e.body.reason !== "" ? `: ${e.body.reason}` : ""}`, outcome: "info" });
        return;
      case "run_unpaused":
        if (s.view.status === "paused") s.view.status = "running";
        s.view.paused = null;
        this.mark(s, { kind: "unpause", at: e.at, text: `unpaused by an operator${e.body.reason !== "" ? `: ${e.body.reason}` : ""}`, outcome: "info" });
        return;
      case "run_cancel_requested":
        this.mark(s, { kind: "cancel", at: e.at, text: `cancelled by an operator${e.body.reason !== "" ? `: ${e.body.reason}` : ""}`, outcome: "failure" });
        return;
      case "fork_completed":
        this.mark(s, { kind: "fork", at: e.at, text: `fork ready (${e.body.copied} events copied from run ${s.view.fork_of?.session ?? "?"})`, outcome: "info" });
        return;
      case "effect_begun": {
        const cells = s.effectCells.get(e.body.name) ?? new Set<number>();
        cells.add(e.body.cell_id);
        s.effectCells.set(e.body.name, cells);
        const c = s.cells.get(e.body.cell_id);
        if (c === undefined) return;
        const status = c.finished_at === null ? "begun" : "uncertain";
        const f = c.effects.find((x) => x.name === e.body.name);
        if (f === undefined) {
          if (c.effects.length < MAX_CELL_EFFECTS) c.effects.push({ name: e.body.name, status });
        }
        else if (f.status !== "done") f.status = status;
        touchCell(c);
        return;
      }
      case "effect_ended": {
        for (const id of new Set([...(s.effectCells.get(e.body.name) ?? []), e.body.cell_id])) {
          const c = s.cells.get(id);
          if (c === undefined) continue;
          const f = c.effects.find((x) => x.name === e.body.name);
          if (f === undefined) {
            if (c.effects.length < MAX_CELL_EFFECTS) c.effects.push({ name: e.body.name, status: "done", result: e.body.result });
          }
          else {
            f.status = "done";
            f.result = e.body.result;
          }
          touchCell(c);
        }
        return;
      }
      case "timer_registered":
        this.mark(s, { kind: "timer_registered", at: e.at, text: `timer ${e.body.timer_id} registered${e.body.cell_id !== null ? ` by cell ${e.body.cell_id}` : ""}, due ${e.body.due_at}${e.body.note ? `: ${e.body.note}` : ""}`, outcome: "info" });
        return;
      case "timer_fired":
        this.mark(s, { kind: "timer_fired", at: e.at, text: `timer ${e.body.timer_id} fired (due ${e.body.due_at}, ${Math.round(e.body.late_ms)} ms late)`, outcome: "info" });
        return;
      case "inbox_received": {
        const o = e.body.observation;
        if (o.source === "external") this.mark(s, { kind: "post", at: e.at, text: `post ${o.id} (${o.kind}): ${JSON.stringify(o.payload).slice(0, 200)}`, outcome: "info" });
        return;
      }
      case "control_handled": {
        const b = e.body;
        if (b.role === "resolution" && b.outcome === "resolved") {
          const note = s.defs.get(b.note_id);
          const target = note?.kind === "note" ? note.target_cell_id : undefined;
          const c = target === undefined ? undefined : s.cells.get(target);
          if (c !== undefined) {
            c.resolved_by = { note_id: b.note_id, at: e.at };
            touchCell(c);
          }
        }
        const outcome = b.outcome === "refused" ? "failure" : b.role === "conclusion" && b.outcome === "concluded" ? "success" : "info";
        this.mark(s, { kind: "control", at: e.at, text: `${b.role} note ${b.note_id}: ${b.outcome}${b.detail ? ` (${b.detail})` : ""}`, outcome });
        return;
      }
      case "validator_result":
        this.mark(s, { kind: "validator", at: e.at, text: `validator ${e.body.argv.join(" ")}: ${e.body.passed ? "passed" : `failed (exit ${e.body.exit_code})`}`, outcome: e.body.passed ? "success" : "failure" });
        return;
      case "run_ended":
        s.view.status = e.body.result;
        s.view.reason = e.body.reason;
        s.view.paused = null;
        s.view.awaiting_approval = [];
        this.mark(s, { kind: "end", at: e.at, text: `run ended: ${e.body.result} (${e.body.reason})`, outcome: e.body.result === "cancelled" ? "failure" : e.body.result });
        return;
      default:
        return;
    }
  }
}
