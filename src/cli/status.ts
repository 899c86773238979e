/**
 * `cairn status`: what a database holds, read without taking ownership (it never disturbs the owner).
 */
import { parseLogEvent } from "../state/events.js";
import { Reducer } from "../state/reducer.js";
import { summarize, type Inspection } from "../harness/inspect.js";
import { flag, parse, str, UsageError } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";
import type { Storage } from "../storage/contract.js";

const HELP = `usage: cairn status --db NAME [--session ID] [--json]

Shows the runs in database NAME: goal and result, cells, executions and their phases, unresolved
UnknownExecutions, usage. Reads only: the owner keeps running. --json prints the cairn.status/1
document described in the README.
${STORAGE_HELP}`;

export async function statusCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("status", argv, { ...STORAGE_FLAGS, session: { type: "string" }, json: { type: "boolean" } });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn status takes no arguments besides flags, got "${p.positionals.join(" ")}".`);
  const name = dbName(p, "status");
  const choice = await chooseStorage(p, "status", io.env);
  try {
    const inspection = await readInspection(choice.storage, name, str(p, "session"));
    if (flag(p, "json")) io.out(JSON.stringify(inspection, null, 2));
    else for (const line of renderStatus(inspection)) io.out(line);
    return EXIT.ok;
  } finally {
    await choice.storage.close().catch(() => undefined);
  }
}

/** Folds the whole log through a reader (no ownership taken). */
export async function readInspection(storage: Storage, name: string, session?: string): Promise<Inspection> {
  const reader = await storage.reader(name);
  try {
    const r = new Reducer();
    for (;;) {
      const batch = await reader.read(r.headSeq, 5000);
      if (batch.length === 0) break;
      r.apply(batch.map((e) => parseLogEvent(e)));
    }
    if (session !== undefined && r.session(session) === undefined) {
      throw new UsageError(`session "${session}" does not exist in database "${name}" (it has ${r.projection().order.join(", ") || "no sessions"}).`);
    }
    return summarize(name, r.projection(), session);
  } finally {
    await reader.close().catch(() => undefined);
  }
}

function renderStatus(i: Inspection): string[] {
  const out = [`database ${i.db}: ${i.sessions.length} run(s), ${i.head} events`];
  for (const s of i.sessions) {
    out.push("");
    out.push(`run ${s.id}: ${s.status}${s.result ? ` (${s.result.reason})` : ""}`);
    out.push(`  goal: ${s.goal}`);
    out.push(`  cwd: ${s.cwd}; revision ${s.revision}; ${s.rounds} round(s); tokens ${s.usage.input_tokens} in, ${s.usage.output_tokens} out; ${s.usage.attempts} attempt(s)${s.usage.unknown_usage_attempts ? ` (${s.usage.unknown_usage_attempts} with unknown usage)` : ""}`);
    const exec = new Map(s.executions.map((e) => [e.cell_id, e]));
    for (const c of s.cells) {
      if (!c.in_context && !exec.has(c.id)) continue;
      const e = exec.get(c.id);
      const phase = e ? ` [${e.phase}${e.result ? `: ${e.result}` : ""}${e.exit_code !== null && e.exit_code !== undefined ? ` exit ${e.exit_code}` : ""}]` : "";
      out.push(`  ${c.in_context ? " " : "-"}cell ${c.id} ${c.kind}${c.role ? `(${c.role})` : ""}${phase}: ${c.summary.replace(/\s+/g, " ").slice(0, 120)}`);
    }
    for (const u of s.unresolved_unknown) out.push(`  UNRESOLVED UnknownExecution: cell ${u.cell_id} (${u.reason}; worker stopped: ${u.worker_stopped ? "yes" : "not confirmed"})`);
    if (s.inbox.unread) out.push(`  inbox: ${s.inbox.unread} unread`);
    for (const t of s.timers.filter((t) => !t.fired)) out.push(`  timer ${t.timer_id} due ${t.due_at}`);
  }
  return out;
}
