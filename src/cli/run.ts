/**
 * `cairn run` and `cairn resume`: own the database, drive runs to their end, print progress.
 */
import { existsSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { Harness, type RunOutcome } from "../harness/harness.js";
import { RunBlocked } from "../harness/model-retry.js";
import { createModel } from "../model/providers.js";
import type { Model } from "../model/contract.js";
import { createLogger, parseLogLevel, type Logger } from "../observability/logger.js";
import { startTracing } from "../observability/tracing.js";
import type { Budgets } from "../state/events.js";
import { durationSeconds, flag, list, parse, positiveInt, required, splitCommand, str, UsageError, type Parsed } from "./args.js";
import { EXIT } from "./exit.js";
import { hasCode } from "../errors.js";
import type { Io } from "./main.js";
import { followProgress } from "./progress.js";
import { visibleLine } from "../ui/visible.js";
import { chaosFaults } from "./chaos.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP, type StorageChoice } from "./storage.js";
import { closeOwner, describeHolder, fencedLine, isFence, MAX_REOPENS, OwnerLease, takeLease } from "./owner.js";
import { assignedSubmitId, checkUserSessionId, sameRequest, START_REQUEST_KIND, StartRequest, startRequestId } from "../harness/start-request.js";
import { Reducer } from "../state/reducer.js";
import { parseLogEvent, type LogEvent } from "../state/events.js";
import type { SessionProjection } from "../state/projection.js";
import type { HeldLease, Storage } from "../storage/contract.js";
import { StorageRejected } from "../storage/errors.js";
import type { ProgressView } from "./progress.js";
import { CELL_FLAGS, CELL_HELP, cellNetwork, sandboxOptions, secretFiles } from "./cells.js";
import { APPROVAL_HELP, approvalFlags } from "./steer.js";
import { chooseSandbox } from "../exec/sandbox.js";
import type { SandboxOptions } from "../harness/boundary.js";

const RUN_FLAGS = {
  ...STORAGE_FLAGS,
  ...CELL_FLAGS,
  model: { type: "string" },
  "base-url": { type: "string" },
  cwd: { type: "string" },
  validator: { type: "string", multiple: true },
  json: { type: "boolean" },
  "max-rounds": { type: "string" },
  "max-tokens": { type: "string" },
  "max-wall": { type: "string" },
  "log-level": { type: "string" },
  session: { type: "string" },
  "require-approval": { type: "string", multiple: true },
  "model-timeout": { type: "string" },
  "model-retry-budget": { type: "string" },
  "max-output-tokens": { type: "string" },
} as const;

const MODEL_HELP = `  --model SPEC            anthropic/MODEL, openai/MODEL (any OpenAI-compatible server) or
                          scripted:FILE (an offline replay); keys from ANTHROPIC_API_KEY / OPENAI_API_KEY
  --base-url URL          the provider's base URL (or ANTHROPIC_BASE_URL / OPENAI_BASE_URL)
  --model-timeout DURATION       one model call's time limit (default 5m)
  --model-retry-budget DURATION  how long to keep retrying a failing provider (429, 5xx, resets,
                          timeouts; exponential backoff with jitter, Retry-After honoured) before the
                          run is parked as blocked (default: as long as the run's wall budget allows)
  --max-output-tokens N   the model reply's token limit (default 8192)
  --json                  print one committed event per line instead of progress
  --log-level LEVEL       fatal|error|warn|info|debug|trace|silent (default warn), on stderr`;

const RUN_HELP = `usage: cairn run [GOAL] --db NAME --model SPEC [flags]

Starts a run toward GOAL in database NAME and drives it to its end. When a live worker (cairn serve)
owns NAME, the run is handed to it through the mailbox and followed here: nothing is taken over.
Otherwise this process owns NAME: it first recovers every unfinished run (stopping survivors of
the last owner), continues them too, and exits when all have ended.
${STORAGE_HELP}
${MODEL_HELP}
  --cwd DIR               where cells and validators run (default: the current directory)
  --validator "CMD ARGS"  a command that must pass before success is accepted (repeatable; no shell)
  --max-rounds N          end the run as a failure after N model rounds
  --max-tokens N          ... after N tokens in and out
  --max-wall DURATION     ... after this much wall time (90s, 15m, 2h, 1d)
  --session ID            the run's id (letters, digits, . _ -; not s1, s2... which Cairn assigns):
                          the same command again continues or reports that run, never a second one
${APPROVAL_HELP}
${CELL_HELP}`;

const RESUME_HELP = `usage: cairn resume --db NAME --model SPEC [flags]

Continues every unfinished run in database NAME (on this machine or, with replicated storage, any
other). Takes no goal. Cells that were running when the last owner died are reported to the model
as UnknownExecution and never re-run.
${STORAGE_HELP}
${MODEL_HELP}
${APPROVAL_HELP.replace("cells matching RULE", "this worker's rule, for every run it drives: cells matching RULE")}
${CELL_HELP}`;

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
  const chosen = str(p, "session");
  if (chosen !== undefined) {
    const bad = checkUserSessionId(chosen);
    if (bad !== null) throw new UsageError(`cairn run: ${bad}`);
  }
  const network = cellNetwork(p, "run", io.env);
  const approval = approvalFlags(p, "run");
  const request = { goal, validators, budgets, ...(network === "host" ? { cell_network: "host" as const } : {}), ...(approval.length > 0 ? { approval } : {}) };
  return drive("run", p, io, { request, cwd, session: chosen });
}

export async function resumeCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("resume", argv, RUN_FLAGS);
  if (p.values.help) {
    io.out(RESUME_HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn resume continues the runs already in the database and takes no goal; to start a new run use \`cairn run "GOAL" --db NAME\`.`);
  for (const f of ["cwd", "validator", "max-rounds", "max-tokens", "max-wall", "session"]) {
    if (p.values[f] !== undefined) throw new UsageError(`cairn resume: --${f} belongs to a new run; a resumed run keeps the settings it started with.`);
  }
  return drive("resume", p, io, null);
}

export function readBudgets(p: Parsed, command = "run"): Budgets {
  const b: { max_rounds?: number; max_tokens?: number; max_wall_seconds?: number } = {};
  const rounds = positiveInt(p, command, "max-rounds");
  if (rounds !== undefined) b.max_rounds = rounds;
  const tokens = positiveInt(p, command, "max-tokens");
  if (tokens !== undefined) b.max_tokens = tokens;
  const wall = str(p, "max-wall");
  if (wall !== undefined) b.max_wall_seconds = durationSeconds(command, "max-wall", wall);
  return b;
}

export function makeLogger(p: Parsed, fallback: string): Logger {
  const level = parseLogLevel(str(p, "log-level") ?? fallback);
  return createLogger({ level });
}

export function makeModel(p: Parsed, command: string, env: NodeJS.ProcessEnv): Model {
  const spec = required(p, command, "model", "anthropic/MODEL, openai/MODEL or scripted:FILE");
  const baseUrl = str(p, "base-url");
  const timeout = str(p, "model-timeout");
  const maxTokens = positiveInt(p, command, "max-output-tokens");
  return createModel(spec, {
    env,
    ...(baseUrl !== undefined ? { baseUrl } : {}),
    ...(timeout !== undefined ? { timeoutMs: Math.ceil(durationSeconds(command, "model-timeout", timeout) * 1000) } : {}),
    ...(maxTokens !== undefined ? { maxTokens } : {}),
  });
}

/** Harness limits from flags (`--model-retry-budget`). */
export function modelLimits(p: Parsed, command: string): { modelRetryBudgetMs?: number } {
  const budget = str(p, "model-retry-budget");
  return budget === undefined ? {} : { modelRetryBudgetMs: Math.ceil(durationSeconds(command, "model-retry-budget", budget) * 1000) };
}

interface RunPlan {
  readonly request: StartRequest;
  readonly cwd: string;
  /** The id the user chose (--session), or undefined. */
  readonly session: string | undefined;
}

/**
 * `cairn run` and `cairn resume`. `resume` is an explicit takeover: it takes the owner lease from a
 * live holder and opens (fencing it). `run` never fences a live owner: when one holds the database it
 * hands the run over through the mailbox (a start request, as `cairn submit` does) and follows it,
 * taking over only if that owner's lease ends first. As owner, either command first recovers every
 * unfinished run (stopping survivors), then continues them all and starts its own; it returns when
 * every run it drives has ended. Exit: 0 all succeeded, 1 one failed, 3 fenced, 4 storage lost,
 * 130/143 interrupted.
 */
async function drive(command: "run" | "resume", p: Parsed, io: Io, plan: RunPlan | null): Promise<number> {
  const json = flag(p, "json");
  const say = (s: string) => (json ? io.err(s) : io.out(s));
  const name = dbName(p, command);
  const logger = makeLogger(p, "warn");
  const model = makeModel(p, command, io.env);
  const limits = modelLimits(p, command);
  const faults = chaosFaults(io.env);
  let choice: StorageChoice;
  let sandbox: SandboxOptions;
  try {
    choice = await chooseStorage(p, command, io.env, logger);
    sandbox = sandboxOptions(p, command, io.env, "auto", [choice.dataDir, ...secretFiles(io.env, p)]);
    // Said once, before anything is opened: `required` without a sandbox stops here (exit 2).
    const chosen = chooseSandbox(sandbox.mode ?? "auto");
    if (chosen.kind === "none" && sandbox.mode !== "none") {
      io.err(`cairn: warning: cells will run WITHOUT a sandbox (${chosen.reason}): they can read and write what this user can, reach the network and this host's services. Install bubblewrap (apt-get install bubblewrap) to contain them, or pass --sandbox required to refuse to run without one.`);
    }
  } catch (err) {
    await model.close?.().catch(() => undefined);
    throw err;
  }
  const storage = choice.storage;
  let interrupted: number | null = null;
  let wake: (() => void) | null = null;
  const onSignal = (sig: NodeJS.Signals) => {
    interrupted = sig === "SIGINT" ? 130 : 143;
    io.err(`cairn: ${sig}: stopping; running cells are stopped and recorded as they are (resume later with \`cairn resume --db ${name}\`)`);
    wake?.();
    void h?.close();
  };
  process.once("SIGINT", onSignal);
  process.once("SIGTERM", onSignal);
  let h: Harness | null = null;
  let lease: HeldLease | "no-leases" | null = null;
  let unfollow = () => {};
  const tracing = await startTracing(io.env, logger);
  try {
    // A run given by id that exists already: report it, or continue it (a scheduler's retry).
    let session: string | undefined = plan?.session;
    let posted = false;
    if (plan !== null && session !== undefined) {
      const known = await lookUp(storage, name, session);
      if (known.kind === "session") {
        if (!sameRequest(plan.request, known.session)) throw new UsageError(`cairn run: run "${session}" already exists in database "${name}" with another goal or settings; choose another --session.`);
        if (known.session.terminal !== null) {
          say(`cairn: run ${session} already ended: ${known.session.terminal.result}: ${known.session.terminal.reason}`);
          return known.session.terminal.result === "success" ? EXIT.ok : EXIT.failure;
        }
        posted = true; // it exists: whoever owns the database drives it
      } else if (known.kind === "pending") {
        if (!sameRequest(plan.request, known.request)) throw new UsageError(`cairn run: a run "${session}" with another goal or settings is already waiting in database "${name}"'s mailbox; choose another --session.`);
        posted = true;
      }
    }
    // Take the owner lease; while a live owner holds it, hand the run over and follow it.
    let follower: Follower | null = null;
    let outcome: number | null = null;
    lease = await takeLease({
      storage,
      name,
      role: command,
      force: command === "resume",
      logger,
      stopped: () => interrupted !== null || outcome !== null,
      wake: (w) => (wake = w),
      onStandby: async (view) => {
        if (plan === null) return;
        if (follower === null) {
          const f = new Follower();
          await f.poll(storage, name);
          if (!posted) {
            session ??= assignedSubmitId();
            await postStart(storage, name, session, plan.request);
            posted = true;
          }
          say(`cairn: database "${name}" is ${view ? describeHolder(view) : "owned by a live worker"}; handed run ${session} to it (no takeover); following it${p.values.cwd !== undefined ? " (it runs in that worker's --cwd, not --cwd given here)" : ""}`);
          unfollow = followProgress(f, json, io.out);
          follower = f;
        }
        await follower.poll(storage, name).catch(() => undefined);
        const s = follower.session(session!);
        if (s?.terminal) {
          say(`cairn: run ${session} ${ended(s.terminal.result)}: ${s.terminal.reason}`);
          outcome = s.terminal.result === "success" ? EXIT.ok : EXIT.failure;
        }
      },
    });
    unfollow();
    if (lease === null) return interrupted ?? outcome ?? EXIT.ok;
    const owned = lease === "no-leases" ? null : new OwnerLease(lease, storage.leases?.ttlMs ?? 0, logger);
    // `resume --require-approval` is this worker's rule for every run; `run`'s is its run's, in its log.
    const approval = command === "resume" ? approvalFlags(p, "resume") : [];
    for (let opens = 1; ; opens++) {
      const openedAt = performance.now();
      try {
        h = await Harness.open({ storage, name, model, workDir: choice.dataDir, create: command === "run", logger, tracing, limits, sandbox, approval, submitCwd: plan?.cwd ?? process.cwd(), ...(faults ? { faults } : {}) });
        owned?.attach(h, openedAt);
        const harness = h;
        say(`cairn: database "${name}" (${choice.describe}), epoch ${harness.epoch}, model ${model.name}, cells ${harness.sandbox.kind === "bwrap" ? "sandboxed (bubblewrap)" : "NOT sandboxed"}`);
        unfollow = followProgress(harness, json, io.out);
        // Recovery of every unfinished run (survivors stopped) comes before anything new launches.
        const r = await harness.resume();
        if (command === "resume") {
          if (r.sessions.length === 0) say("cairn: nothing to resume: every run in this database has ended");
          else say(`cairn: resuming ${r.sessions.length} run(s): ${r.sessions.join(", ")}${r.recovered ? `; ${r.recovered} interrupted cell(s) recorded as UnknownExecution` : ""}`);
        } else if (r.sessions.length > 0) {
          say(`cairn: continuing ${r.sessions.length} unfinished run(s) of the last owner: ${r.sessions.join(", ")}${r.recovered ? `; ${r.recovered} interrupted cell(s) recorded as UnknownExecution` : ""}`);
        }
        const sessions = [...r.sessions];
        if (plan !== null) {
          if (posted && session !== undefined) {
            // Exists, or waits in the mailbox: the drain at open starts it; wait for it below.
            if (!sessions.includes(session)) sessions.push(session);
          } else {
            const id = await harness.start({
              goal: plan.request.goal,
              cwd: plan.cwd,
              validators: plan.request.validators,
              budgets: plan.request.budgets,
              ...(plan.request.cell_network !== undefined ? { cellNetwork: plan.request.cell_network } : {}),
              ...(plan.request.approval !== undefined ? { approval: plan.request.approval } : {}),
              ...(session !== undefined ? { id: session } : {}),
            });
            sessions.push(id);
            session = id;
            posted = true;
          }
        }
        if (sessions.length > 0 && session !== undefined && !sessions.includes(session)) sessions.push(session);
        // Every run is waited for: one that stops on an error (or is blocked) never stops the others.
        // A run paused by an operator, or whose cell waits for approval, has nothing in flight that keeps
        // this process alive (the storage's timers are unref'd): the owner waits for the person.
        const keepAlive = setInterval(() => undefined, 1 << 30);
        const settled = await Promise.allSettled(sessions.map((s) => harness.wait(s))).finally(() => clearInterval(keepAlive));
        const outcomes: RunOutcome[] = [];
        let stopped: unknown = null;
        settled.forEach((r, i) => {
          if (r.status === "fulfilled") outcomes.push(r.value);
          else {
            stopped ??= r.reason;
            if (sessions.length > 1) io.err(`cairn: run ${sessions[i]} stopped: ${r.reason instanceof Error ? r.reason.message.split("\n", 1)[0] : String(r.reason)}`);
          }
        });
        // The reason is the model's own text: printed with its control characters visible, as progress is.
        for (const o of outcomes) say(`cairn: run ${o.session} ${ended(o.result)}: ${visibleLine(o.reason)}`);
        if (stopped !== null) throw stopped;
        // A cancelled run did not succeed: exit 1, as a failure.
        return outcomes.some((o) => o.result !== "success") ? EXIT.failure : EXIT.ok;
      } catch (err) {
        // Fenced by an opener that took the owner lease before this process did (and claimed after
        // it): the lease is still ours, so this process claims again and the other one stops, fenced.
        if (interrupted !== null || owned === null || opens > MAX_REOPENS || !((h !== null && h.status === "fenced") || (h === null && isFence(err)))) throw err;
        if (!(await owned.raced(h?.epoch ?? 0, openedAt))) throw err;
        logger.warn({ db: name, opens }, "fenced by an opener that no longer holds the owner lease: claiming the database again");
        unfollow();
        await h?.close().catch(() => undefined);
        h = null;
      }
    }
  } catch (err) {
    if (interrupted !== null) return interrupted;
    // (Set inside the loop above; the compiler's narrowing does not follow it there.)
    const cur = h as Harness | null;
    // Fenced while running, or while it opened (it lost a race to open): one answer.
    if ((cur !== null && cur.status === "fenced") || (cur === null && isFence(err))) {
      io.err(fencedLine(name));
      return EXIT.fenced;
    }
    if (err instanceof RunBlocked) io.err(`cairn: the run is blocked, not over: fix the cause below, then \`cairn resume --db ${name}\` continues it where it was.`);
    else if (cur !== null && cur.status === "open" && !hasCode(err, "reset")) io.err(`cairn: the run is not over; continue it with \`cairn resume --db ${name}\` once the cause below is fixed.`);
    throw err;
  } finally {
    process.off("SIGINT", onSignal);
    process.off("SIGTERM", onSignal);
    unfollow();
    await closeOwner(h, lease);
    await tracing.shutdown();
    await model.close?.().catch(() => undefined);
    await storage.close().catch(() => undefined);
  }
}

/** Follows a database as a reader (no ownership): progress of a run handed to its live owner. */
class Follower implements ProgressView {
  private readonly reducer = new Reducer();
  private readonly listeners = new Set<(events: readonly LogEvent[]) => void>();

  sessions(): readonly string[] {
    return this.reducer.projection().order;
  }

  session(id: string): SessionProjection | undefined {
    return this.reducer.session(id);
  }

  follow(listener: (events: readonly LogEvent[]) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  async poll(storage: Storage, name: string): Promise<void> {
    let reader;
    try {
      reader = await storage.reader(name);
    } catch (err) {
      if (hasCode(err, "not_found")) return;
      throw err;
    }
    try {
      for (;;) {
        const batch = await reader.read(this.reducer.headSeq, 5000);
        if (batch.length === 0) return;
        const events = batch.map((e) => parseLogEvent(e));
        this.reducer.apply(events);
        for (const l of this.listeners) l(events);
      }
    } finally {
      await reader.close().catch(() => undefined);
    }
  }
}

/** What a database holds under a session id: the run, a start request waiting in the mailbox, or nothing. */
export async function lookUp(
  storage: Storage,
  name: string,
  session: string,
): Promise<{ kind: "session"; session: SessionProjection } | { kind: "pending"; request: StartRequest } | { kind: "none" }> {
  let reader;
  try {
    reader = await storage.reader(name);
  } catch (err) {
    if (hasCode(err, "not_found")) return { kind: "none" };
    throw err;
  }
  try {
    const r = new Reducer();
    for (;;) {
      const batch = await reader.read(r.headSeq, 5000);
      if (batch.length === 0) break;
      r.apply(batch.map((e) => parseLogEvent(e)));
    }
    const s = r.session(session);
    if (s !== undefined) return { kind: "session", session: s };
    const mail = (await reader.pending?.()) ?? [];
    const m = mail.find((x) => x.kind === START_REQUEST_KIND && x.id === startRequestId(session));
    if (m !== undefined) {
      const parsed = StartRequest.safeParse(m.payload);
      if (parsed.success) return { kind: "pending", request: parsed.data };
    }
    return { kind: "none" };
  } finally {
    await reader.close().catch(() => undefined);
  }
}

/**
 * Posts the start request of run `session` to `name`'s mailbox (creating the database when it does
 * not exist: `run` and `submit` may). A retry with the same request is a no-op.
 */
export async function postStart(storage: Storage, name: string, session: string, request: StartRequest): Promise<void> {
  const message = { id: startRequestId(session), session, kind: START_REQUEST_KIND, payload: request, at: new Date().toISOString() };
  try {
    await storage.post(name, message);
  } catch (err) {
    if (hasCode(err, "not_found")) {
      // Nobody has created it: create it (epoch 1, no owner fenced: there was none) and post again.
      const db = await storage.open(name, { create: true });
      await db.close();
      await storage.post(name, message);
      return;
    }
    if (err instanceof StorageRejected && err.reason === "conflict") {
      // The same id posted before (another `at`): the same request is a retry; another one is a conflict.
      const known = await lookUp(storage, name, session);
      if (known.kind === "pending" && sameRequest(request, known.request)) return;
      if (known.kind === "session" && sameRequest(request, known.session)) return;
      throw new UsageError(`run "${session}" was already submitted to database "${name}" with another goal or settings; choose another --session.`);
    }
    throw err;
  }
}

/** How a run ended, in words. */
function ended(result: "success" | "failure" | "cancelled"): string {
  return result === "success" ? "succeeded" : result === "cancelled" ? "was cancelled" : "failed";
}
