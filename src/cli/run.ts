/**
 * `cairn run` and `cairn resume`: own the database, drive runs to their end, print progress.
 */
import { existsSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { Harness, type RunOutcome } from "../harness/harness.js";
import { createModel } from "../model/providers.js";
import type { Model } from "../model/contract.js";
import { createLogger, parseLogLevel, type Logger } from "../observability/logger.js";
import type { Budgets } from "../state/events.js";
import { durationSeconds, flag, list, parse, positiveInt, required, splitCommand, str, UsageError, type Parsed } from "./args.js";
import { EXIT } from "./exit.js";
import { hasCode } from "../errors.js";
import type { Io } from "./main.js";
import { followProgress } from "./progress.js";
import { chaosFaults } from "./chaos.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";

const RUN_FLAGS = {
  ...STORAGE_FLAGS,
  model: { type: "string" },
  "base-url": { type: "string" },
  cwd: { type: "string" },
  validator: { type: "string", multiple: true },
  json: { type: "boolean" },
  "max-rounds": { type: "string" },
  "max-tokens": { type: "string" },
  "max-wall": { type: "string" },
  "log-level": { type: "string" },
} as const;

const MODEL_HELP = `  --model SPEC            anthropic/MODEL, openai/MODEL (any OpenAI-compatible server) or
                          scripted:FILE (an offline replay); keys from ANTHROPIC_API_KEY / OPENAI_API_KEY
  --base-url URL          the provider's base URL (or ANTHROPIC_BASE_URL / OPENAI_BASE_URL)
  --json                  print one committed event per line instead of progress
  --log-level LEVEL       fatal|error|warn|info|debug|trace|silent (default warn), on stderr`;

const RUN_HELP = `usage: cairn run [GOAL] --db NAME --model SPEC [flags]

Starts a run toward GOAL in database NAME and drives it to its end.
${STORAGE_HELP}
${MODEL_HELP}
  --cwd DIR               where cells and validators run (default: the current directory)
  --validator "CMD ARGS"  a command that must pass before success is accepted (repeatable; no shell)
  --max-rounds N          end the run as a failure after N model rounds
  --max-tokens N          ... after N tokens in and out
  --max-wall DURATION     ... after this much wall time (90s, 15m, 2h, 1d)`;

const RESUME_HELP = `usage: cairn resume --db NAME --model SPEC [flags]

Continues every unfinished run in database NAME (on this machine or, with replicated storage, any
other). Takes no goal. Cells that were running when the last owner died are reported to the model
as UnknownExecution and never re-run.
${STORAGE_HELP}
${MODEL_HELP}`;

export async function runCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("run", argv, RUN_FLAGS);
  if (p.values.help) {
    io.out(RUN_HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 1) throw new UsageError(`cairn run: give the goal as one argument (quote it), got ${p.positionals.length} words.`);
  const goal = p.positionals[0];
  if (goal === undefined || goal.trim() === "") throw new UsageError(`cairn run: say what the agent should achieve: cairn run "GOAL" --db NAME --model SPEC.`);
  const cwd = resolve(str(p, "cwd") ?? ".");
  if (!existsSync(cwd) || !statSync(cwd).isDirectory()) throw new UsageError(`cairn run: --cwd ${cwd} is not a directory.`);
  const validators = list(p, "validator").map((v) => splitCommand("run", v));
  const budgets = readBudgets(p);
  return drive("run", p, io, async (h) => [await h.start({ goal, cwd, validators, budgets })]);
}

export async function resumeCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("resume", argv, RUN_FLAGS);
  if (p.values.help) {
    io.out(RESUME_HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn resume continues the runs already in the database and takes no goal; to start a new run use \`cairn run "GOAL" --db NAME\`.`);
  for (const f of ["cwd", "validator", "max-rounds", "max-tokens", "max-wall"]) {
    if (p.values[f] !== undefined) throw new UsageError(`cairn resume: --${f} belongs to a new run; a resumed run keeps the settings it started with.`);
  }
  return drive("resume", p, io, async (h, say) => {
    const r = await h.resume();
    if (r.sessions.length === 0) say("cairn: nothing to resume: every run in this database has ended");
    else say(`cairn: resuming ${r.sessions.length} run(s): ${r.sessions.join(", ")}${r.recovered ? `; ${r.recovered} interrupted cell(s) recorded as UnknownExecution` : ""}`);
    return r.sessions;
  });
}

function readBudgets(p: Parsed): Budgets {
  const b: { max_rounds?: number; max_tokens?: number; max_wall_seconds?: number } = {};
  const rounds = positiveInt(p, "run", "max-rounds");
  if (rounds !== undefined) b.max_rounds = rounds;
  const tokens = positiveInt(p, "run", "max-tokens");
  if (tokens !== undefined) b.max_tokens = tokens;
  const wall = str(p, "max-wall");
  if (wall !== undefined) b.max_wall_seconds = durationSeconds("run", "max-wall", wall);
  return b;
}

export function makeLogger(p: Parsed, fallback: string): Logger {
  const level = parseLogLevel(str(p, "log-level") ?? fallback);
  return createLogger({ level });
}

export function makeModel(p: Parsed, command: string, env: NodeJS.ProcessEnv): Model {
  const spec = required(p, command, "model", "anthropic/MODEL, openai/MODEL or scripted:FILE");
  const baseUrl = str(p, "base-url");
  return createModel(spec, { env, ...(baseUrl !== undefined ? { baseUrl } : {}) });
}

/**
 * Opens the database, lets `begin` start or resume runs, prints progress, and waits for every one of
 * them to end. Exit: 0 all succeeded, 1 one failed, 3 fenced, 4 storage lost, 130/143 interrupted.
 */
async function drive(command: "run" | "resume", p: Parsed, io: Io, begin: (h: Harness, say: (s: string) => void) => Promise<readonly string[]>): Promise<number> {
  const json = flag(p, "json");
  const say = (s: string) => (json ? io.err(s) : io.out(s));
  const name = dbName(p, command);
  const logger = makeLogger(p, "warn");
  const model = makeModel(p, command, io.env);
  const faults = chaosFaults(io.env);
  const choice = await chooseStorage(p, command, io.env, logger);
  let h: Harness;
  try {
    h = await Harness.open({ storage: choice.storage, name, model, workDir: choice.dataDir, create: command === "run", logger, ...(faults ? { faults } : {}) });
  } catch (err) {
    await choice.storage.close().catch(() => undefined);
    throw err;
  }
  say(`cairn: database "${name}" (${choice.describe}), epoch ${h.epoch}, model ${model.name}`);
  const unfollow = followProgress(h, json, io.out);
  let interrupted: number | null = null;
  const onSignal = (sig: NodeJS.Signals) => {
    interrupted = sig === "SIGINT" ? 130 : 143;
    io.err(`cairn: ${sig}: stopping; running cells are stopped and recorded as they are (resume later with \`cairn resume --db ${name}\`)`);
    void h.close();
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  try {
    const sessions = await begin(h, say);
    const outcomes: RunOutcome[] = [];
    for (const s of sessions) outcomes.push(await h.wait(s));
    for (const o of outcomes) say(`cairn: run ${o.session} ${o.result === "success" ? "succeeded" : "failed"}: ${o.reason}`);
    return outcomes.some((o) => o.result === "failure") ? EXIT.failure : EXIT.ok;
  } catch (err) {
    if (interrupted !== null) return interrupted;
    if (h.status === "fenced") {
      io.err(`cairn: fenced: another process opened database "${name}"; this one stopped its cells and exits. Do not restart it here unless the other owner is gone.`);
      return EXIT.fenced;
    }
    if (h.status === "open" && !hasCode(err, "reset")) io.err(`cairn: the run is not over; continue it with \`cairn resume --db ${name}\` once the cause below is fixed.`);
    throw err;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    unfollow();
    await h.close();
    await model.close?.().catch(() => undefined);
    await choice.storage.close().catch(() => undefined);
  }
}
