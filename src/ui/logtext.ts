/**
 * The terminal rendering of `cairn log`: one aligned line per thing that happened, times relative to
 * the run's start, output lines indented under their cell. Colour only when asked (`color: true`).
 *
 * Every string an event carries (a cell's output, a goal, a model's note, an error from a provider)
 * is printed with its control characters made visible (./visible.ts): a cell cannot move the cursor,
 * retitle the terminal or overprint these lines. Only Cairn's own colour codes reach the terminal.
 * `raw: true` prints the text as stored instead.
 *
 * Pure given its input: it folds events into a TimelineBuilder for context (cell summaries, attempt
 * latencies) and returns lines; it never reads a clock.
 */
import type { LogEvent } from "../state/events.js";
import { TimelineBuilder, type CellView, type RoundView } from "./timeline.js";
import { visibleDeep, visibleOutputLine } from "./visible.js";
import { describeRule } from "../state/approval.js";

export interface LogTextOptions {
  readonly color: boolean;
  /** Only this session's events. */
  readonly session?: string;
  /** Only events about this cell (its patch, start, output, end, resolution). */
  readonly cell?: number;
  /** Print recorded text as stored, control characters included (default false: made visible). */
  readonly raw?: boolean;
}

/** `e` with every string made visible; an output chunk's data is kept whole, for its lines to be. */
function visibleEvent(e: LogEvent): LogEvent {
  const clean = visibleDeep(e);
  if (e.kind === "execution_output" && clean.kind === "execution_output") return { ...clean, body: { ...clean.body, data: e.body.data } };
  return clean;
}

const CODES = { red: 31, green: 32, yellow: 33, blue: 34, magenta: 35, cyan: 36, dim: 2, bold: 1 } as const;
type Tone = keyof typeof CODES;

/** Whether event `e` concerns cell `cell`. */
export function concernsCell(e: LogEvent, cell: number): boolean {
  switch (e.kind) {
    case "execution_queued":
    case "execution_started":
    case "execution_output":
    case "execution_finished":
      return e.body.cell_id === cell;
    case "patch_accepted":
      return e.body.new_cell_ids.includes(cell) || e.body.removed_ids.includes(cell);
    case "timer_registered":
    case "effect_begun":
    case "effect_ended":
      return e.body.cell_id === cell;
    case "control_handled":
    case "validator_result":
      return e.body.note_id === cell;
    case "inbox_received":
      return e.body.observation.id === `execution:${cell}`;
    case "approval_requested":
    case "approval_decided":
      return e.body.cell_id === cell;
    default:
      return false;
  }
}

/** "+M:SS.mmm" (or "+H:MM:SS" past an hour) from `from` to `at`. */
export function relativeTime(from: string, at: string): string {
  const d = Math.max(0, Date.parse(at) - Date.parse(from));
  if (!Number.isFinite(d)) return "+?";
  const h = Math.floor(d / 3_600_000);
  const m = Math.floor((d % 3_600_000) / 60_000);
  const s = Math.floor((d % 60_000) / 1000);
  const msPart = String(d % 1000).padStart(3, "0");
  return h > 0 ? `+${h}:${String(m).padStart(2, "0")}:${String(s).padStart(2, "0")}` : `+${m}:${String(s).padStart(2, "0")}.${msPart}`;
}

/** A duration in words: 340 ms, 2.5 s, 3 min 4 s. */
export function duration(ms: number | null): string {
  if (ms === null || !Number.isFinite(ms)) return "?";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const m = Math.floor(ms / 60_000);
  return `${m} min ${Math.round((ms % 60_000) / 1000)} s`;
}

function bytes(n: number): string {
  return n < 1024 ? `${n} B` : n < 1024 * 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${(n / 1024 / 1024).toFixed(1)} MiB`;
}

const TIME_WIDTH = 11;
const SUBJECT_WIDTH = 10;

/** Renders events into terminal lines, incrementally: feed batches in seq order with `render`. */
export class LogText {
  private readonly tl = new TimelineBuilder();
  /** Partial output lines per `session:cell`, printed when complete or when the cell finishes. */
  private readonly partial = new Map<string, string>();

  constructor(private readonly options: LogTextOptions) {}

  get timeline(): TimelineBuilder {
    return this.tl;
  }

  private paint(tone: Tone, text: string): string {
    return this.options.color ? `\u001b[${CODES[tone]}m${text}\u001b[0m` : text;
  }

  private line(session: string, at: string | null, subject: string, text: string, tone: Tone | null = null): string {
    const start = this.tl.view(session)?.created_at ?? at ?? "";
    const time = at === null ? "" : relativeTime(start, at);
    const sess = this.options.session === undefined ? `${session.padEnd(4)} ` : "";
    return `${this.paint("dim", time.padStart(TIME_WIDTH))}  ${sess}${subject.padEnd(SUBJECT_WIDTH)} ${tone === null ? text : this.paint(tone, text)}`;
  }

  private outputLines(session: string, cell: number, data: string, flush: boolean): string[] {
    const key = `${session}:${cell}`;
    const text = (this.partial.get(key) ?? "") + data;
    const parts = text.split("\n");
    const rest = parts.pop() ?? "";
    if (flush && rest !== "") parts.push(rest);
    if (flush) this.partial.delete(key);
    else this.partial.set(key, rest);
    const bar = this.paint("dim", "│");
    // Raw: the line exactly as stored, its trailing `\r` or spaces included.
    if (this.options.raw === true) return parts.map((l) => this.line(session, null, "", l === "" ? bar : `${bar} ${l}`));
    return parts.map((l) => this.line(session, null, "", `${bar} ${visibleOutputLine(l)}`.trimEnd()));
  }

  /** Folds `events` and returns the lines they produce (possibly none). */
  render(events: readonly LogEvent[]): string[] {
    const out: string[] = [];
    for (const stored of events) {
      const e = this.options.raw === true ? stored : visibleEvent(stored);
      this.tl.apply([e]);
      if (this.options.session !== undefined && e.session !== this.options.session) continue;
      if (this.options.cell !== undefined && !concernsCell(e, this.options.cell)) continue;
      out.push(...this.renderOne(e));
    }
    return out;
  }

  private round(e: LogEvent & { body: { turn: string } }): RoundView | undefined {
    return this.tl.view(e.session)?.rounds.find((r) => r.turn === e.body.turn);
  }

  private cell(session: string, id: number): CellView | undefined {
    return this.tl.view(session)?.cells.find((c) => c.id === id);
  }

  private renderOne(e: LogEvent): string[] {
    const s = e.session;
    const L = (subject: string, text: string, tone: Tone | null = null): string => this.line(s, e.at, subject, text, tone);
    switch (e.kind) {
      case "session_created":
        return [
          this.line(
            s,
            e.at,
            "run",
            `${this.paint("bold", s)} started ${e.at}: "${e.body.goal}" in ${e.body.cwd}${e.body.validators.length ? `; validators: ${e.body.validators.map((v) => v.join(" ")).join(", ")}` : ""}${e.body.cell_network === "host" ? "; cells on the host's network" : ""}${e.body.approval?.length ? `; approval required for ${e.body.approval.map(describeRule).join(", ")}` : ""}${e.body.fork ? `; a fork of run ${e.body.fork.session} after round ${e.body.fork.round}` : ""}`,
          ),
        ];
      case "run_paused":
        return [L("pause", `paused by an operator${e.body.now ? ", the running cell stopped" : ", the running cell finishes"}${e.body.reason ? `: ${e.body.reason}` : ""} (request ${e.body.request})`, "yellow")];
      case "run_unpaused":
        return [L("unpause", `unpaused by an operator${e.body.reason ? `: ${e.body.reason}` : ""} (request ${e.body.request})`, "cyan")];
      case "run_cancel_requested":
        return [L("cancel", `cancelled by an operator${e.body.reason ? `: ${e.body.reason}` : ""} (request ${e.body.request})`, "magenta")];
      case "approval_requested":
        return [L(`cell ${e.body.cell_id}`, `waits for approval (rule ${e.body.rule}): cairn approve / cairn deny --cell ${e.body.cell_id}`, "yellow")];
      case "approval_decided":
        return [L(`cell ${e.body.cell_id}`, `${e.body.decision} by a person${e.body.reason ? `: ${e.body.reason}` : ""}`, e.body.decision === "approved" ? "green" : "red")];
      case "fork_completed":
        return [L("fork", `ready: ${e.body.copied} event(s) copied from its origin`, "cyan")];
      case "owner_claimed":
        return [L("owner", `epoch ${e.body.epoch} on ${e.body.host} (pid ${e.body.pid}) since ${e.at}`, "cyan")];
      case "turn_prepared":
        return [L(`round ${e.body.n}`, `prepared at revision ${e.body.revision}${e.body.delivered.length ? `, ${e.body.delivered.length} observation(s): ${e.body.delivered.join(", ")}` : ""}`)];
      case "model_attempt":
        return e.body.attempt > 1 ? [L(`round ${this.round(e)?.n ?? "?"}`, `model attempt ${e.body.attempt}`)] : [];
      case "model_attempt_failed": {
        const r = this.round(e);
        return [L(`round ${r?.n ?? "?"}`, `attempt ${e.body.attempt} failed${e.body.retryable ? " (will retry)" : ""}: ${e.body.error}`, "yellow")];
      }
      case "model_response":
        return [];
      case "patch_rejected": {
        const r = this.round(e);
        return [L(`round ${r?.n ?? "?"}`, `patch refused (attempt ${e.body.attempt}, ${e.body.code}): ${e.body.reason}`, "red")];
      }
      case "patch_accepted": {
        const r = this.round(e);
        const head = r
          ? `accepted: revision ${e.body.revision}; ${r.attempts} attempt(s), model ${duration(r.latency_ms)}, tokens ${r.tokens_in} in / ${r.tokens_out} out${r.rejected.length ? `, ${r.rejected.length} refused` : ""}`
          : `accepted: revision ${e.body.revision}`;
        const lines = [L(`round ${r?.n ?? "?"}`, head, "green")];
        for (const c of r?.new_cells ?? []) {
          if (this.options.cell !== undefined && c.id !== this.options.cell) continue;
          lines.push(this.line(s, null, "", `+ cell ${c.id} ${c.kind}${c.role ? ` (${c.role})` : ""}: ${c.summary}`));
        }
        if (e.body.removed_ids.length) lines.push(this.line(s, null, "", `- removed cell(s) ${e.body.removed_ids.join(", ")}`));
        return lines;
      }
      case "execution_queued":
        return [];
      case "execution_started": {
        const c = this.cell(s, e.body.cell_id);
        const contained = e.body.sandbox === undefined ? "" : `, sandbox ${e.body.sandbox}${e.body.sandbox === "bwrap" ? `, network ${e.body.network ?? "off"}` : ""}`;
        return [L(`cell ${e.body.cell_id}`, `${c?.kind ?? ""} started on ${e.body.host}${c?.epoch !== null && c?.epoch !== undefined ? ` epoch ${c.epoch}` : ""} (pid ${e.body.pid}${contained}): ${c?.summary ?? ""}`, e.body.sandbox === "none" ? "yellow" : "blue")];
      }
      case "execution_output":
        return this.outputLines(s, e.body.cell_id, e.body.data, false);
      case "execution_finished": {
        const b = e.body;
        const lines = this.outputLines(s, b.cell_id, "", true);
        const subject = `cell ${b.cell_id}`;
        if (b.result === "UnknownExecution") {
          lines.push(L(subject, `UnknownExecution: ${b.unknown?.reason ?? b.detail ?? "outcome unknown"} (worker stopped: ${b.unknown?.worker_stopped ? "yes" : "not confirmed"}); never re-run`, "yellow"));
          const u = b.unknown;
          if (u?.uncertain_effects !== undefined) {
            const done = u.done_effects?.length ? `; done: ${u.done_effects.join(", ")}` : "";
            lines.push(this.line(s, null, "", this.paint("yellow", u.uncertain_effects.length ? `effects begun and never ended (reconcile these): ${u.uncertain_effects.join(", ")}${done}` : `no effect left uncertain${done}`)));
          }
        } else {
          const exit = b.exit_code !== null ? `exit ${b.exit_code}` : b.signal !== null ? `signal ${b.signal}` : "no exit code";
          const tone: Tone = b.result === "success" ? "green" : b.result === "error" ? "red" : "magenta";
          lines.push(L(subject, `${b.result} ${exit} in ${duration(b.duration_ms)}, ${bytes(b.output_bytes)} output${b.detail ? ` (${b.detail})` : ""}`, tone));
        }
        if (b.dropped_bytes > 0) lines.push(this.line(s, null, "", this.paint("yellow", `[output truncated: ${bytes(b.dropped_bytes)} dropped]`)));
        return lines;
      }
      case "timer_registered":
        return [L("timer", `${e.body.timer_id} registered${e.body.cell_id !== null ? ` by cell ${e.body.cell_id}` : ""}, due ${e.body.due_at}${e.body.note ? `: ${e.body.note}` : ""}`)];
      case "timer_fired":
        return [L("timer", `${e.body.timer_id} fired (due ${e.body.due_at}, ${duration(e.body.late_ms)} late)`)];
      case "effect_begun":
        return [L(`cell ${e.body.cell_id}`, `effect ${e.body.name} begun${e.body.attempt > 1 ? ` (attempt ${e.body.attempt}: retried after it was found not done)` : ""}`, "cyan")];
      case "effect_ended":
        return [L(`cell ${e.body.cell_id}`, `effect ${e.body.name} done: ${JSON.stringify(e.body.result).slice(0, 200)}`, "cyan")];
      case "inbox_received": {
        const o = e.body.observation;
        if (o.source !== "external") return [];
        return [L("post", `${o.id} (${o.kind}): ${JSON.stringify(o.payload).slice(0, 200)}`)];
      }
      case "control_handled": {
        const b = e.body;
        const tone: Tone = b.outcome === "refused" ? "red" : b.role === "resolution" ? "cyan" : "magenta";
        return [L(b.role === "conclusion" ? "conclude" : b.role, `note ${b.note_id}: ${b.outcome}${b.detail ? ` (${b.detail})` : ""}`, tone)];
      }
      case "validator_result":
        return [L("validate", `${e.body.argv.join(" ")}: ${e.body.passed ? "passed" : `failed (exit ${e.body.exit_code})`}`, e.body.passed ? "green" : "red")];
      case "run_ended":
        return [L("end", `run ${s} ${e.body.result}: ${e.body.reason}`, e.body.result === "success" ? "green" : e.body.result === "cancelled" ? "magenta" : "red")];
      default:
        return [];
    }
  }
}
