/**
 * Progress on a terminal as events commit: the model round, the cell being run, its output as it
 * arrives, the result. With --json: one committed event per line instead.
 *
 * Every line is written with its control characters made visible (../ui/visible.ts): a cell's output,
 * a goal, a model's note or a provider's error cannot move the cursor, retitle the terminal or
 * overprint the lines around it. A cell's output keeps its line breaks, each line prefixed.
 */
import type { LogEvent } from "../state/events.js";
import type { SessionProjection } from "../state/projection.js";
import { visibleLine, visibleOutputLine } from "../ui/visible.js";

export type Write = (line: string) => void;

/** What rendering needs: a Harness, or a view over a Reducer (a follower that does not own). */
export interface ProgressView {
  sessions(): readonly string[];
  session(id: string): SessionProjection | undefined;
  follow(listener: (events: readonly LogEvent[]) => void): () => void;
}

export function followProgress(h: ProgressView, json: boolean, write: Write): () => void {
  if (json) return h.follow((events) => events.forEach((e) => write(JSON.stringify(e))));
  const partial = new Map<string, string>();
  return h.follow((events) => {
    for (const e of events) for (const line of render(h, e, partial)) write(visibleLine(line));
  });
}

function render(h: ProgressView, e: LogEvent, partial: Map<string, string>): string[] {
  const tag = h.sessions().length > 1 ? `${e.session} ` : "";
  switch (e.kind) {
    case "session_created":
      return [`${tag}goal: ${e.body.goal}`, `${tag}cwd: ${e.body.cwd}${e.body.validators.length ? `; validators: ${e.body.validators.map((v) => v.join(" ")).join(" | ")}` : ""}`];
    case "turn_prepared":
      return [`${tag}[round ${e.body.n}] the model decides (revision ${e.body.revision}, ${e.body.delivered.length} new observation(s))`];
    case "model_attempt_failed":
      return [`${tag}[model] attempt ${e.body.attempt} failed${e.body.retryable ? " (will retry)" : ""}: ${e.body.error}`];
    case "patch_rejected":
      return [`${tag}[model] patch refused (${e.body.code}): ${e.body.reason}`];
    case "patch_accepted": {
      const s = h.session(e.session);
      const added = e.body.new_cell_ids.map((id) => {
        const c = s?.cells.get(id);
        if (c === undefined) return `cell ${id}`;
        if (c.kind === "cmd") return `cell ${id} cmd \`${c.argv.join(" ")}\``;
        if (c.kind === "script") return `cell ${id} script`;
        return `cell ${id} note${c.role ? ` (${c.role}${c.result ? `: ${c.result}` : ""})` : ""}: ${oneLine(c.text, 100)}`;
      });
      const removed = e.body.removed_ids.length ? `; removed ${e.body.removed_ids.join(", ")}` : "";
      return [`${tag}[step] revision ${e.body.revision}: ${added.length ? added.join("; ") : "no new cells"}${removed}`];
    }
    case "execution_started":
      return [`${tag}[cell ${e.body.cell_id}] started (pid ${e.body.pid})`];
    case "execution_output": {
      const key = `${e.session}:${e.body.cell_id}`;
      const text = (partial.get(key) ?? "") + e.body.data;
      const lines = text.split("\n");
      partial.set(key, lines.pop() ?? "");
      return lines.map((l) => `${tag}[cell ${e.body.cell_id}] | ${visibleOutputLine(l)}`);
    }
    case "execution_finished": {
      const key = `${e.session}:${e.body.cell_id}`;
      const rest = partial.get(key);
      partial.delete(key);
      const out = rest ? [`${tag}[cell ${e.body.cell_id}] | ${visibleOutputLine(rest)}`] : [];
      const exit = e.body.exit_code !== null ? ` exit ${e.body.exit_code}` : e.body.signal ? ` ${e.body.signal}` : "";
      const ms = e.body.duration_ms !== null ? `, ${Math.round(e.body.duration_ms)} ms` : "";
      const dropped = e.body.dropped_bytes > 0 ? `, ${e.body.dropped_bytes} output bytes dropped` : "";
      out.push(`${tag}[cell ${e.body.cell_id}] ${e.body.result}${exit}${ms}${dropped}${e.body.detail ? `: ${oneLine(e.body.detail, 300)}` : ""}`);
      return out;
    }
    case "inbox_received":
      return e.body.observation.source === "external" || e.body.observation.source === "idle" || e.body.observation.source === "timer"
        ? [`${tag}[inbox] ${e.body.observation.id} (${e.body.observation.kind})`]
        : [];
    case "timer_registered":
      return [`${tag}[timer] ${e.body.timer_id} due ${e.body.due_at}`];
    case "control_handled":
      return [`${tag}[${e.body.role}] ${e.body.outcome}: ${oneLine(e.body.detail, 400)}`];
    case "validator_result":
      return [`${tag}[validator] \`${e.body.argv.join(" ")}\` ${e.body.passed ? "passed" : `failed (exit ${e.body.exit_code ?? "none"})`}`];
    case "run_paused":
      return [`${tag}[operator] paused${e.body.now ? " (the running cell is stopped)" : ""}${e.body.reason ? `: ${oneLine(e.body.reason, 300)}` : ""}; \`cairn unpause\` lets it go on`];
    case "run_unpaused":
      return [`${tag}[operator] unpaused${e.body.reason ? `: ${oneLine(e.body.reason, 300)}` : ""}`];
    case "run_cancel_requested":
      return [`${tag}[operator] cancelled${e.body.reason ? `: ${oneLine(e.body.reason, 300)}` : ""}`];
    case "approval_requested":
      return [`${tag}[cell ${e.body.cell_id}] waits for approval (rule ${e.body.rule}): \`cairn approve --cell ${e.body.cell_id}\` or \`cairn deny --cell ${e.body.cell_id} --reason TEXT\``];
    case "approval_decided":
      return [`${tag}[cell ${e.body.cell_id}] ${e.body.decision}${e.body.reason ? `: ${oneLine(e.body.reason, 300)}` : ""}`];
    case "run_ended":
      return [`${tag}run ${e.session} ended: ${e.body.result}: ${oneLine(e.body.reason, 400)}`];
    default:
      return [];
  }
}

function oneLine(s: string, max: number): string {
  const t = s.replace(/\s+/g, " ").trim();
  return t.length > max ? `${t.slice(0, max - 3)}...` : t;
}
