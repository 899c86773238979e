/**
 * `cairn submit`: hands a new run to whichever process owns the database (or will): commits a start
 * request through the mailbox, never taking ownership, and prints the run's id. With --session the
 * command is idempotent: the same id and request again reports that run instead of starting another.
 * Submitted runs use the worker's model, settings and working directory; a request sets only the
 * goal, validators and budgets (see src/harness/start-request.ts).
 */
import { checkUserSessionId, assignedSubmitId } from "../harness/start-request.js";
import { list, parse, splitCommand, str, UsageError } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { liveHolder, describeHolder } from "./owner.js";
import { lookUp, postStart, readBudgets } from "./run.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";
import { sameRequest, type StartRequest } from "../harness/start-request.js";
import type { Storage } from "../storage/contract.js";
import { cellNetwork } from "./cells.js";
import { APPROVAL_HELP, approvalFlags } from "./steer.js";

const HELP = `usage: cairn submit GOAL --db NAME [--session ID] [--validator "CMD ARGS"]... [--max-rounds N]
                   [--max-tokens N] [--max-wall DURATION]

Commits a start request for a run toward GOAL to database NAME's mailbox and prints the run's id on
stdout. The process that owns NAME (cairn serve, run or resume) starts it with its own model,
settings and --cwd; while nobody owns NAME the request waits. Creates NAME when it does not exist.
  --session ID            the run's id (letters, digits, . _ -, starting with a letter; not s1, s2...
                          or s-..., which Cairn assigns). Submitting the same id and request again
                          prints the id and changes nothing; another request under that id is refused.
  --validator, --max-rounds, --max-tokens, --max-wall   as for cairn run
  --cell-network host     this run's cells get the host's network (default: the worker's setting)
${APPROVAL_HELP}
${STORAGE_HELP}`;

export async function submitCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("submit", argv, {
    ...STORAGE_FLAGS,
    session: { type: "string" },
    validator: { type: "string", multiple: true },
    "max-rounds": { type: "string" },
    "max-tokens": { type: "string" },
    "max-wall": { type: "string" },
    "cell-network": { type: "string" },
    "require-approval": { type: "string", multiple: true },
  });
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 1) throw new UsageError(`cairn submit: give the goal as one argument (quote it), got ${p.positionals.length} words.`);
  const goal = p.positionals[0];
  if (goal === undefined || goal.trim() === "") throw new UsageError(`cairn submit: say what the agent should achieve: cairn submit "GOAL" --db NAME.`);
  const name = dbName(p, "submit");
  const chosen = str(p, "session");
  if (chosen !== undefined) {
    const bad = checkUserSessionId(chosen);
    if (bad !== null) throw new UsageError(`cairn submit: ${bad}`);
  }
  const network = cellNetwork(p, "submit", io.env);
  const approval = approvalFlags(p, "submit");
  const request = {
    goal,
    validators: list(p, "validator").map((v) => splitCommand("submit", v)),
    budgets: readBudgets(p, "submit"),
    ...(network === "host" ? { cell_network: "host" as const } : {}),
    ...(approval.length > 0 ? { approval } : {}),
  };
  const choice = await chooseStorage(p, "submit", io.env);
  try {
    let o;
    try {
      o = await submitRun(choice.storage, name, request, chosen);
    } catch (err) {
      if (err instanceof UsageError) throw new UsageError(`cairn submit: ${err.message}`);
      throw err;
    }
    io.err(`cairn: ${o.message}`);
    io.out(o.session);
    return EXIT.ok;
  } finally {
    await choice.storage.close().catch(() => undefined);
  }
}

/** What became of a submit: `submitted` (posted now), `exists` (that run exists), `pending` (it already waits for an owner). */
export interface SubmitOutcome {
  readonly session: string;
  readonly status: "submitted" | "exists" | "pending";
  /** One sentence for the submitter: what happened and who starts the run. */
  readonly message: string;
}

/**
 * Submits a run toward `request` to database `name` (created when it does not exist), as `cairn
 * submit` and `POST /api/v1/runs` do: one start request in the mailbox, never taking ownership.
 * With `chosen` (a run id already checked by checkUserSessionId) it is idempotent: the same id and
 * request again reports the run (`exists` or `pending`) and posts nothing. Throws UsageError when
 * the id is taken by another request, and the storage's errors.
 */
export async function submitRun(storage: Storage, name: string, request: StartRequest, chosen?: string): Promise<SubmitOutcome> {
  const session = chosen ?? assignedSubmitId();
  if (chosen !== undefined) {
    const known = await lookUp(storage, name, chosen);
    if (known.kind === "session") {
      if (!sameRequest(request, known.session)) throw new UsageError(`run "${chosen}" already exists in database "${name}" with another goal or settings; choose another run id.`);
      return { session, status: "exists", message: `run ${chosen} already exists in "${name}" (${known.session.terminal === null ? "running" : `ended: ${known.session.terminal.result}`}); nothing submitted` };
    }
    if (known.kind === "pending") {
      if (!sameRequest(request, known.request)) throw new UsageError(`a run "${chosen}" with another goal or settings already waits in database "${name}"'s mailbox; choose another run id.`);
      return { session, status: "pending", message: `run ${chosen} was already submitted to "${name}" and waits for its owner; nothing more to do` };
    }
  }
  await postStart(storage, name, session, request);
  const holder = await liveHolder(storage, name).catch(() => null);
  return {
    session,
    status: "submitted",
    message: `submitted run ${session} to "${name}"; ${holder ? `its owner starts it (${describeHolder(holder)})` : "no live worker owns it now: the request waits until one does (cairn serve, run or resume)"}`,
  };
}
