/**
 * `cairn pause`, `unpause`, `cancel`, `approve`, `deny`: an operator steers a run from any machine,
 * without taking ownership. Each request goes through the database's mailbox to whichever process
 * owns it (src/harness/operator.ts, shared with the HTTP API); with no live owner it waits there,
 * and the next owner applies it before its runs do anything.
 *
 * Exit: 0 applied (or already so, or waiting for an owner), 2 refused (the reason is printed), 4 an
 * owner is live but did not apply it in time (it stays in the mailbox).
 */
import { parseRule, type ApprovalRule } from "../state/approval.js";
import type { SteerRequest } from "../state/steer.js";
import { checkRequestId, steerRun, type RequestOutcome } from "../harness/operator.js";
import { durationSeconds, flag, list, parse, positiveInt, required, str, UsageError, type Parsed } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";

const COMMON_HELP = `  --reason TEXT           why (recorded in the log, shown in status, log and the page)
  --id ID                 this request's id (default: a fresh one); the same id again is the same
                          request, so a retried command never applies twice
  --wait DURATION         how long to wait for a live owner to apply it (default 30s; 0: do not wait)
  --json                  print the outcome as JSON: {"status", "message", "request"}
${STORAGE_HELP}`;

const HELP = {
  pause: `usage: cairn pause --db NAME --session ID [--now] [--reason TEXT]

Pauses run ID: it asks the model nothing more, launches nothing and asks no approval until \`cairn
unpause\`; it stays paused across restarts and failovers, and costs nothing meanwhile (a due timer
is still recorded). The running cell finishes first, or with --now is stopped as a cancel note stops
it (recorded as UnknownExecution, stopped_by_pause, for the model to look at after the unpause).
  --now                   stop the running cell now
${COMMON_HELP}`,
  unpause: `usage: cairn unpause --db NAME --session ID [--reason TEXT]

Lets a paused run go on where it was.
${COMMON_HELP}`,
  cancel: `usage: cairn cancel --db NAME --session ID [--reason TEXT]

Cancels run ID: its running cell is stopped and recorded as cancelled, queued cells are cancelled,
no validator runs, and the run ends as cancelled. Cancelling again changes nothing.
${COMMON_HELP}`,
  approve: `usage: cairn approve --db NAME --session ID --cell N [--reason TEXT]

Approves cell N, which waits for a person's approval (\`cairn status\` lists them): it runs next.
${COMMON_HELP}`,
  deny: `usage: cairn deny --db NAME --session ID --cell N --reason TEXT

Denies cell N, which waits for a person's approval: it never runs, and the model is told why (an
observation it reads before anything else in the queue runs).
${COMMON_HELP}`,
} as const;

type Action = keyof typeof HELP;

const FLAGS = {
  ...STORAGE_FLAGS,
  session: { type: "string" },
  reason: { type: "string" },
  id: { type: "string" },
  wait: { type: "string" },
  json: { type: "boolean" },
  now: { type: "boolean" },
  cell: { type: "string" },
} as const;

/** The request a command line asks for. */
function requestOf(action: Action, p: Parsed): SteerRequest {
  const reason = str(p, "reason") ?? "";
  if (reason.length > 2000) throw new UsageError(`cairn ${action}: --reason is longer than 2000 characters.`);
  if (flag(p, "now") && action !== "pause") throw new UsageError(`cairn ${action}: --now belongs to cairn pause.`);
  if (str(p, "cell") !== undefined && action !== "approve" && action !== "deny") throw new UsageError(`cairn ${action}: --cell belongs to cairn approve and cairn deny.`);
  switch (action) {
    case "pause":
      return { action, reason, now: flag(p, "now") };
    case "unpause":
    case "cancel":
      return { action, reason };
    case "approve":
    case "deny": {
      const cell = positiveInt(p, action, "cell");
      if (cell === undefined) throw new UsageError(`cairn ${action}: --cell is required (the cell waiting for approval; \`cairn status\` lists them).`);
      if (action === "deny" && reason.trim() === "") throw new UsageError("cairn deny: --reason is required: the model is told why, so that it can act on it.");
      return { action, cell_id: cell, reason };
    }
  }
}

/** The --id and --wait of an operator's request (`cairn pause`, `fork`...), checked. */
export function requestFlags(p: Parsed, command: string): { id?: string; waitMs: number } {
  const id = str(p, "id");
  if (id !== undefined) {
    try {
      checkRequestId(id);
    } catch (err) {
      throw new UsageError(`cairn ${command}: --id: ${(err as Error).message}`);
    }
  }
  const waitText = str(p, "wait");
  const waitMs = waitText === undefined ? 30_000 : waitText.trim() === "0" ? 0 : durationSeconds(command, "wait", waitText) * 1000;
  return { ...(id !== undefined ? { id } : {}), waitMs };
}

/** Prints an outcome (JSON with --json; a refusal on stderr) and returns its exit code. */
export function report(o: RequestOutcome, p: Parsed, io: Io): number {
  if (flag(p, "json")) io.out(JSON.stringify(o));
  else if (o.status === "refused") io.err(`cairn: ${o.message}`);
  else io.out(`cairn: ${o.message}`);
  return o.status === "refused" ? EXIT.usage : o.status === "unconfirmed" ? EXIT.storage : EXIT.ok;
}

/** Runs `cairn ACTION ...`. */
export async function steerCommand(action: Action, argv: readonly string[], io: Io): Promise<number> {
  const p = parse(action, argv, FLAGS);
  if (p.values.help) {
    io.out(HELP[action]);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn ${action} takes no arguments besides flags, got "${p.positionals.join(" ")}"${action === "deny" || action === "pause" || action === "cancel" ? " (quote --reason)" : ""}.`);
  const name = dbName(p, action);
  const session = required(p, action, "session", "the run, e.g. s1");
  const request = requestOf(action, p);
  const options = requestFlags(p, action);
  const choice = await chooseStorage(p, action, io.env);
  try {
    return report(await steerRun(choice.storage, name, session, request, options), p, io);
  } finally {
    await choice.storage.close().catch(() => undefined);
  }
}

/**
 * The `--require-approval RULE` flags of a command (all, script, argv:WORDS, glob:PATTERN), parsed;
 * a bad one is a UsageError naming it.
 */
export function approvalFlags(p: Parsed, command: string): ApprovalRule[] {
  return list(p, "require-approval").map((text) => {
    const r = parseRule(text);
    if (typeof r === "string") throw new UsageError(`cairn ${command}: --require-approval ${r}.`);
    return r;
  });
}

export const APPROVAL_HELP = `  --require-approval RULE  cells matching RULE wait for a person's \`cairn approve\` before they run
                          (repeatable): all, script, argv:WORDS (a command's first words, e.g.
                          argv:git push), glob:PATTERN (on the command line; * and ?)`;
