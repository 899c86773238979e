/**
 * `cairn status`: what a database holds, read without taking ownership (it never disturbs the owner).
 * Each text line is printed with its control characters made visible (goals, cell summaries and
 * reasons come from models, cells and posts); --json prints the document as read.
 */
import { loadProjection } from "../storage/snapshots.js";
import { summarize, type Inspection } from "../harness/inspect.js";
import { flag, parse, str, UsageError } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";
import type { OwnerInfo, PostedMessage, Storage } from "../storage/contract.js";
import { START_REQUEST_KIND, StartRequest } from "../harness/start-request.js";
import { visibleLine } from "../ui/visible.js";

const HELP = `usage: cairn status --db NAME [--session ID] [--json]

Shows the runs in database NAME: goal and result, cells, executions and their phases (with the
effects each cell declared), unresolved UnknownExecutions, the effect ledger, usage. Reads only: the owner keeps running. --json prints the cairn.status/1
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
    const base = await readInspection(choice.storage, name, str(p, "session"));
    const inspection = await withOwnership(choice.storage, name, base);
    if (flag(p, "json")) io.out(JSON.stringify(inspection, null, 2));
    else for (const line of renderStatus(inspection)) io.out(visibleLine(line));
    return EXIT.ok;
  } finally {
    await choice.storage.close().catch(() => undefined);
  }
}

/** Loads the projection through a reader (latest snapshot plus the events after it; no ownership taken). */
export async function readInspection(storage: Storage, name: string, session?: string): Promise<Inspection> {
  const reader = await storage.reader(name);
  try {
    const r = await loadProjection(reader);
    if (session !== undefined && r.session(session) === undefined) {
      throw new UsageError(`session "${session}" does not exist in database "${name}" (it has ${r.projection().order.join(", ") || "no sessions"}).`);
    }
    return summarize(name, r.projection(), session);
  } finally {
    await reader.close().catch(() => undefined);
  }
}

/** What `cairn status` adds to cairn.status/1: the owner (and whether it is gone) and waiting start requests. */
export interface OwnershipView {
  /** The owner lease: null when none is recorded (or the adapter keeps none). `live` false: the owner is gone. */
  owner: (OwnerInfo & { live: boolean }) | null;
  /** Runs submitted and not yet started by an owner. */
  pending_starts: { session: string; goal: string; submitted_at: string }[];
}

async function withOwnership(storage: Storage, name: string, i: Inspection): Promise<Inspection & OwnershipView> {
  const view = (await storage.leases?.read(name)) ?? null;
  const owner = view === null ? null : { ...view.owner, live: view.live };
  const reader = await storage.reader(name);
  let mail: PostedMessage[] = [];
  try {
    mail = (await reader.pending?.()) ?? [];
  } finally {
    await reader.close().catch(() => undefined);
  }
  const pending_starts = mail
    .filter((m) => m.kind === START_REQUEST_KIND)
    .map((m) => {
      const r = StartRequest.safeParse(m.payload);
      return { session: m.session, goal: r.success ? r.data.goal : "(malformed request)", submitted_at: m.at };
    });
  // Without a live owner nobody drives an unfinished run: say so instead of "running".
  const ownerGone = storage.leases !== undefined && (owner === null || !owner.live);
  const sessions = i.sessions.map((s) => (s.status === "running" && ownerGone ? { ...s, status: "owner_gone" as Inspection["sessions"][number]["status"] } : s));
  return { ...i, sessions, owner, pending_starts };
}

function renderStatus(i: Inspection & OwnershipView): string[] {
  const out = [`database ${i.db}: ${i.sessions.length} run(s), ${i.head} events`];
  if (i.owner === null) out.push(`owner: none (no worker holds this database; start one with \`cairn serve\`, or \`cairn resume\`)`);
  else if (i.owner.live) out.push(`owner: ${i.owner.host} pid ${i.owner.pid} (${i.owner.role}) since ${i.owner.since}${i.owner.epoch !== null ? `, epoch ${i.owner.epoch}` : ""}`);
  else out.push(`owner: GONE (last ${i.owner.host} pid ${i.owner.pid}, ${i.owner.role}, since ${i.owner.since}; its lease ended): unfinished runs wait for \`cairn serve\` or \`cairn resume\``);
  for (const p of i.pending_starts) out.push(`pending start: ${p.session} (submitted ${p.submitted_at}): ${p.goal.replace(/\s+/g, " ").slice(0, 120)}`);
  for (const s of i.sessions) {
    out.push("");
    out.push(`run ${s.id}: ${s.status === "owner_gone" ? "unfinished, owner gone (nobody drives it)" : s.status}${s.result ? ` (${s.result.reason})` : ""}${s.blocked ? ` (${s.blocked.reason})` : ""}`);
    out.push(`  goal: ${s.goal}`);
    if (s.fork_of !== null) out.push(`  fork of run ${s.fork_of.session} after round ${s.fork_of.round}`);
    if (s.paused !== null) out.push(`  PAUSED since ${s.paused.at}${s.paused.reason ? `: ${s.paused.reason}` : ""}${s.paused.now ? " (the running cell was stopped)" : ""}; \`cairn unpause --db ${i.db} --session ${s.id}\` lets it go on`);
    if (s.cancel_requested !== null && s.result === null) out.push(`  CANCELLING since ${s.cancel_requested.at}${s.cancel_requested.reason ? `: ${s.cancel_requested.reason}` : ""}`);
    if (s.approval_rules.length > 0) out.push(`  approval required for: ${s.approval_rules.join(", ")}`);
    for (const a of s.awaiting_approval) out.push(`  WAITS FOR APPROVAL: cell ${a.cell_id} since ${a.since} (rule ${a.rule}): ${a.summary.replace(/\s+/g, " ").slice(0, 120)}; \`cairn approve --db ${i.db} --session ${s.id} --cell ${a.cell_id}\` or \`cairn deny ... --reason TEXT\``);
    if (s.cells_ran_in !== null) out.push(`  cells: ${s.cells_ran_in.sandbox === "bwrap" ? `sandboxed (bubblewrap), network ${s.cells_ran_in.network}` : "NOT sandboxed (--sandbox none): the worker's full reach"}`);
    else if (s.cell_network === "host") out.push("  cells: host network asked for");
    out.push(`  cwd: ${s.cwd}; revision ${s.revision}; ${s.rounds} round(s); tokens ${s.usage.input_tokens} in, ${s.usage.output_tokens} out; ${s.usage.attempts} attempt(s)${s.usage.unknown_usage_attempts ? ` (${s.usage.unknown_usage_attempts} with unknown usage)` : ""}`);
    const exec = new Map(s.executions.map((e) => [e.cell_id, e]));
    for (const c of s.cells) {
      if (!c.in_context && !exec.has(c.id)) continue;
      const e = exec.get(c.id);
      const phase = e ? ` [${e.phase}${e.result ? `: ${e.result}` : ""}${e.exit_code !== null && e.exit_code !== undefined ? ` exit ${e.exit_code}` : ""}]` : "";
      out.push(`  ${c.in_context ? " " : "-"}cell ${c.id} ${c.kind}${c.role ? `(${c.role})` : ""}${phase}: ${c.summary.replace(/\s+/g, " ").slice(0, 120)}`);
      for (const f of e?.effects ?? []) out.push(`      effect ${f.name}: ${f.status}${f.status === "done" ? ` ${JSON.stringify(f.result ?? null).slice(0, 100)}` : f.status === "uncertain" ? " (begun, never ended: check outside before doing it again)" : ""}`);
    }
    const uncertain = s.effects.filter((f) => f.status === "uncertain");
    if (s.effects.length > 0) out.push(`  effects: ${s.effects.length} in the ledger, ${s.effects.filter((f) => f.status === "done").length} done${uncertain.length ? `, UNCERTAIN: ${uncertain.map((f) => f.name).join(", ").slice(0, 200)}` : ""}`);
    for (const u of s.unresolved_unknown) out.push(`  UNRESOLVED UnknownExecution: cell ${u.cell_id} (${u.reason}; worker stopped: ${u.worker_stopped ? "yes" : "not confirmed"})`);
    if (s.inbox.unread) out.push(`  inbox: ${s.inbox.unread} unread`);
    for (const r of s.refused_posts) out.push(`  post ${r.id} refused (${r.code}): ${r.reason}`);
    for (const t of s.timers.filter((t) => !t.fired)) out.push(`  timer ${t.timer_id} due ${t.due_at}`);
  }
  return out;
}
