/**
 * The inspection: a plain-JSON summary of a database's projection, for `Harness.inspect()` and
 * `cairn status --json`. Pure. Its shape is documented in the README ("cairn status --json") and
 * covered by a test; change both together.
 */
import { effectStatus } from "../state/effects.js";
import type { Projection, SessionProjection } from "../state/projection.js";
import { isUnresolvedUnknown } from "../state/projection.js";
import type { RunResult, Usage } from "../state/schema.js";
import { describeRule } from "../state/approval.js";
import { effectKey, effectScope } from "./effects.js";

export interface CellSummary {
  readonly id: number;
  readonly kind: "note" | "script" | "cmd";
  readonly previous_id: number | null;
  /** A one-line description: the note's text, the command line, or the script's first code line. */
  readonly summary: string;
  readonly role?: string;
  readonly in_context: boolean;
}

export interface ExecutionSummary {
  readonly cell_id: number;
  readonly kind: "script" | "cmd";
  readonly phase: "queued" | "started" | "finished";
  readonly result: string | null;
  readonly exit_code: number | null;
  readonly duration_ms: number | null;
  readonly output_bytes: number;
  readonly truncated: boolean;
  readonly detail: string | null;
  readonly pid: number | null;
  readonly host: string | null;
  /** The boundary it ran in: "bwrap" (the sandbox) or "none"; null when not started (or logged before sandboxes). */
  readonly sandbox: "bwrap" | "none" | null;
  /** Its network: "off" (none at all) or "host"; null when not started. */
  readonly network: "off" | "host" | null;
  /** Its approval gate, when a rule asked for one: waiting, approved or denied, the rule, and when. */
  readonly approval: { readonly state: "waiting" | "approved" | "denied"; readonly rule: string; readonly requested_at: string; readonly decided_at: string | null; readonly reason: string | null } | null;
  /** The effects it began or ended (`cairn effect`): "begun" while it runs, "uncertain" once it finished without ending one, "done". */
  readonly effects: readonly { readonly name: string; readonly status: "begun" | "uncertain" | "done"; readonly result?: unknown }[];
}

/** One name of the run's effect ledger. */
export interface EffectSummary {
  readonly name: string;
  /** "done"; "begun" while the cell of its last attempt runs; "uncertain" once it finished without ending it. */
  readonly status: "done" | "begun" | "uncertain";
  /** The idempotency key the run's cells get for it (`cairn effect key NAME`). */
  readonly key: string;
  /** Each committed begin: the cell, when, and its event. */
  readonly attempts: readonly { readonly attempt: number; readonly cell_id: number; readonly at: string; readonly seq: number }[];
  readonly ended: { readonly cell_id: number; readonly at: string; readonly seq: number; readonly result: unknown } | null;
}

export interface UnknownSummary {
  readonly cell_id: number;
  readonly reason: string;
  readonly worker_stopped: boolean;
  readonly evidence_refs: readonly string[];
}

export interface SessionSummary {
  readonly id: string;
  readonly goal: string;
  readonly cwd: string;
  readonly created_at: string;
  /**
   * "running" until the run ends, then "success", "failure" or "cancelled"; "blocked" while it waits
   * for an operator to fix its model; "paused" while an operator has it paused; "cancelling" between a
   * cancel and the run's end; "forking" while a fork's copy of its origin is being made;
   * "awaiting_approval" while a cell waits for a person's decision. `owner_gone` (set by `cairn
   * status` only): unfinished, and no live worker holds the database.
   */
  readonly status: "running" | "owner_gone" | "blocked" | "paused" | "cancelling" | "forking" | "awaiting_approval" | RunResult;
  /** Set while the run is paused: why, since when, and whether the running cell was stopped (`now`). */
  readonly paused: { readonly reason: string; readonly at: string; readonly now: boolean } | null;
  /** Set once an operator cancelled the run. */
  readonly cancel_requested: { readonly reason: string; readonly at: string } | null;
  /** Cells waiting for a person's approval (`cairn approve` / `cairn deny`). */
  readonly awaiting_approval: readonly { readonly cell_id: number; readonly rule: string; readonly since: string; readonly summary: string }[];
  /** The run's own approval rules (a worker may add its own), as `cairn run --require-approval` takes them. */
  readonly approval_rules: readonly string[];
  /** For a fork: the run and the round it was forked after. */
  readonly fork_of: { readonly session: string; readonly round: number } | null;
  /** Why the run is blocked (fix it, then `cairn resume`), or null. */
  readonly blocked: { readonly cause: string; readonly reason: string; readonly at: string } | null;
  /** Posted observations the owner refused (the run had ended, the id conflicted...), with the reason. */
  readonly refused_posts: readonly { readonly id: string; readonly kind: string; readonly code: string; readonly reason: string; readonly at: string }[];
  readonly result: { readonly result: RunResult; readonly reason: string; readonly at: string } | null;
  readonly revision: number;
  readonly rounds: number;
  readonly cells: readonly CellSummary[];
  readonly executions: readonly ExecutionSummary[];
  readonly unresolved_unknown: readonly UnknownSummary[];
  readonly inbox: { readonly unread: number; readonly delivered: number };
  readonly timers: readonly { readonly timer_id: string; readonly due_at: string; readonly fired: boolean }[];
  readonly usage: Usage;
  readonly budgets: SessionProjection["budgets"];
  readonly validators: readonly (readonly string[])[];
  /** The network the run asked for its cells ("host" with --cell-network host), "off" otherwise. */
  readonly cell_network: "off" | "host";
  /** Where its most recent cell ran: sandbox and network as recorded at launch; null before any. */
  readonly cells_ran_in: { readonly sandbox: "bwrap" | "none"; readonly network: "off" | "host" } | null;
  /** The run's effect ledger, by name in the order first begun. */
  readonly effects: readonly EffectSummary[];
}

export interface Inspection {
  readonly schema: "cairn.status/1";
  readonly db: string;
  readonly head: number;
  readonly sessions: readonly SessionSummary[];
}

export function summarize(db: string, p: Projection, only?: string): Inspection {
  const ids = only === undefined ? p.order : p.order.filter((id) => id === only);
  return { schema: "cairn.status/1", db, head: p.head, sessions: ids.map((id) => summarizeSession(p.sessions.get(id)!, db)) };
}

/** The summary of one run; `db` (its database's name) is needed for the effect keys of a run older than the ledger. */
export function summarizeSession(s: SessionProjection, db = ""): SessionSummary {
  const inContext = new Set(s.state.cells.map((c) => c.id));
  const cells: CellSummary[] = [...s.cells.values()]
    .sort((a, b) => a.id - b.id)
    .map((c) => {
      const summary = c.kind === "note" ? c.text : c.kind === "cmd" ? c.argv.join(" ") : firstCodeLine(c.source);
      return {
        id: c.id,
        kind: c.kind,
        previous_id: c.previous_id,
        summary: summary.length > 200 ? `${summary.slice(0, 197)}...` : summary,
        ...(c.kind === "note" && c.role !== undefined ? { role: c.role } : {}),
        in_context: inContext.has(c.id),
      };
    });
  const executions: ExecutionSummary[] = [...s.executions.values()]
    .sort((a, b) => a.cell_id - b.cell_id)
    .map((e) => ({
      cell_id: e.cell_id,
      kind: e.kind,
      phase: e.phase,
      result: e.result,
      exit_code: e.exit_code,
      duration_ms: e.duration_ms,
      output_bytes: e.output_bytes,
      truncated: e.dropped_bytes > 0,
      detail: e.detail,
      pid: e.started?.pid ?? null,
      host: e.started?.host ?? null,
      sandbox: e.started?.sandbox ?? null,
      network: e.started?.network ?? null,
      approval: e.approval === null ? null : { ...e.approval },
      effects: e.effects.map((f) => (f.status === "done" ? { name: f.name, status: "done" as const, result: f.result ?? null } : { name: f.name, status: e.phase === "finished" ? ("uncertain" as const) : ("begun" as const) })),
    }));
  const awaiting = [...s.executions.values()]
    .filter((e) => e.phase === "queued" && e.approval?.state === "waiting")
    .map((e) => ({ cell_id: e.cell_id, rule: e.approval!.rule, since: e.approval!.requested_at, summary: cells.find((c) => c.id === e.cell_id)?.summary ?? "" }));
  const scope = effectScope(db, s);
  const effects: EffectSummary[] = [...s.effects.values()].map((r) => ({
    name: r.name,
    status: effectStatus(r, s.executions),
    key: effectKey(scope, r.name),
    attempts: r.attempts.map((a) => ({ ...a })),
    ended: r.ended === null ? null : { ...r.ended },
  }));
  const unresolved = [...s.executions.values()].filter(isUnresolvedUnknown).map((e) => ({
    cell_id: e.cell_id,
    reason: e.unknown?.reason ?? "unknown",
    worker_stopped: e.unknown?.worker_stopped ?? false,
    evidence_refs: e.unknown?.evidence_refs ?? [],
  }));
  return {
    id: s.id,
    goal: s.goal,
    cwd: s.cwd,
    created_at: s.created_at,
    status:
      s.terminal !== null
        ? s.terminal.result
        : s.forming !== null
          ? "forking"
          : s.cancel_requested !== null
            ? "cancelling"
            : s.paused !== null
              ? "paused"
              : s.blocked !== null
                ? "blocked"
                : awaiting.length > 0
                  ? "awaiting_approval"
                  : "running",
    paused: s.paused === null ? null : { reason: s.paused.reason, at: s.paused.at, now: s.paused.now },
    cancel_requested: s.cancel_requested === null ? null : { reason: s.cancel_requested.reason, at: s.cancel_requested.at },
    awaiting_approval: awaiting,
    approval_rules: (s.approval ?? []).map(describeRule),
    fork_of: s.fork_of === undefined ? null : { session: s.fork_of.session, round: s.fork_of.round },
    blocked: s.blocked === null ? null : { cause: s.blocked.cause, reason: s.blocked.reason, at: s.blocked.at },
    refused_posts: s.refused_posts.map((r) => ({ ...r })),
    result: s.terminal,
    revision: s.state.revision,
    rounds: s.turn_count,
    cells,
    executions,
    unresolved_unknown: unresolved,
    inbox: { unread: s.pending.length, delivered: s.delivered.length },
    timers: [...s.timers.values()].map((t) => ({ timer_id: t.timer_id, due_at: t.due_at, fired: t.fired })),
    usage: s.state.runtime.usage,
    budgets: s.budgets,
    validators: s.validators,
    cell_network: s.cell_network ?? "off",
    cells_ran_in: lastContained(s),
    effects,
  };
}

/** The sandbox and network of the session's most recently started execution that recorded them. */
function lastContained(s: SessionProjection): SessionSummary["cells_ran_in"] {
  let best: { seq: number; sandbox: "bwrap" | "none"; network: "off" | "host" } | null = null;
  for (const e of s.executions.values()) {
    const st = e.started;
    if (st?.sandbox === undefined || (best !== null && st.seq < best.seq)) continue;
    best = { seq: st.seq, sandbox: st.sandbox, network: st.network ?? (st.sandbox === "none" ? "host" : "off") };
  }
  return best === null ? null : { sandbox: best.sandbox, network: best.network };
}

function firstCodeLine(source: string): string {
  const line = source.split("\n").find((l) => l.trim() !== "" && !l.trim().startsWith("#"));
  return `python: ${line?.trim() ?? "(comments only)"}`;
}
