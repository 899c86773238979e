/**
 * `cairn fork`: a new run in the same database whose State is another run's after round N, made by
 * whichever process owns the database (the request goes through its mailbox, as `cairn pause` does;
 * src/harness/operator.ts, shared with the HTTP API).
 *
 * Exit: 0 made (or already made, or waiting for an owner), 2 refused (the reason is printed), 4 an
 * owner is live but did not complete it in time (it stays in the mailbox until it is complete).
 */
import { forkRun } from "../harness/operator.js";
import { ConfigError } from "../errors.js";
import { parse, required, str, UsageError } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { report, requestFlags } from "./steer.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";

const HELP = `usage: cairn fork --db NAME --session ID --at-round N [--new-session NEW] [--reason TEXT]

Makes a new run whose State is run ID's after round N (0: as it was created), to try again from a
good round, e.g. with another model (the worker that owns the database drives it). Run ID is not
changed. Cells in flight at round N are never run by the fork: each appears as what run ID's log
recorded of it (its result, or UnknownExecution when none was recorded yet). The fork's model is
told where the run comes from; \`cairn status\` and \`cairn log\` show it.
  --at-round N            the round after which to fork (\`cairn status\` shows a run's rounds)
  --new-session NEW       the new run's id (default: one Cairn assigns, printed)
  --reason TEXT           why (told to the fork's model)
  --id ID                 this request's id (default: a fresh one); the same id again is the same
                          request, so a retried command never makes two forks
  --wait DURATION         how long to wait for a live owner to complete it (default 30s; 0: do not wait)
  --json                  print the outcome as JSON: {"status", "message", "request", "session"}
${STORAGE_HELP}`;

const FLAGS = {
  ...STORAGE_FLAGS,
  session: { type: "string" },
  "at-round": { type: "string" },
  "new-session": { type: "string" },
  reason: { type: "string" },
  id: { type: "string" },
  wait: { type: "string" },
  json: { type: "boolean" },
} as const;

/** Runs `cairn fork ...`. */
export async function forkCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("fork", argv, FLAGS);
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn fork takes no arguments besides flags, got "${p.positionals.join(" ")}" (quote --reason).`);
  const name = dbName(p, "fork");
  const session = required(p, "fork", "session", "the run to fork, e.g. s1");
  const roundText = required(p, "fork", "at-round", "the round after which to fork, e.g. 3");
  if (!/^\d{1,9}$/.test(roundText.trim())) throw new UsageError(`cairn fork: --at-round must be a whole number from 0, got "${roundText}".`);
  const atRound = Number(roundText.trim());
  const reason = str(p, "reason") ?? "";
  if (reason.length > 2000) throw new UsageError("cairn fork: --reason is longer than 2000 characters.");
  const options = requestFlags(p, "fork");
  const newSession = str(p, "new-session");
  const choice = await chooseStorage(p, "fork", io.env);
  try {
    let o;
    try {
      o = await forkRun(choice.storage, name, session, { atRound, ...(newSession !== undefined ? { newSession } : {}), reason }, options);
    } catch (err) {
      if (err instanceof ConfigError && newSession !== undefined && /the new run's id/.test(err.message)) throw new UsageError(`cairn fork: ${err.message.replace("the new run's id", "--new-session")}`);
      throw err;
    }
    return report(o, p, io);
  } finally {
    await choice.storage.close().catch(() => undefined);
  }
}
