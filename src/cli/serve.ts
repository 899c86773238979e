/**
 * `cairn serve`: the long-running worker a job scheduler starts, safe under any restart policy.
 *
 * Start-up order: every flag is parsed and validated, the listen port is bound, then the database is
 * looked at (it must exist unless --create), then the owner lease is taken: while a live owner holds it
 * the worker waits in standby (/readyz 503 "standby: owned by HOST since ..."), and takes over when
 * that lease ends. It never fences a live owner on its own; `--takeover` (or `cairn resume`) does.
 * As owner it resumes unfinished runs, starts submitted ones, serves /metrics, /healthz and /readyz
 * (and the timeline page with --ui, behind the same access gate as `cairn ui`), idles at near-zero
 * CPU, stops cleanly on SIGTERM, and exits 3 when fenced (after --fenced-linger, so that scrapes see
 * the fence).
 */
import { existsSync, statSync } from "node:fs";
import { resolve } from "node:path";
import { Harness } from "../harness/harness.js";
import { Metrics, type WorkerState } from "../observability/metrics.js";
import { parseListen, startObservabilityServer, type ObservabilityServer } from "../observability/server.js";
import { startTracing } from "../observability/tracing.js";
import type { HeldLease, LeaseView } from "../storage/contract.js";
import { durationSeconds, flag, parse, str, UsageError } from "./args.js";
import { EXIT } from "./exit.js";
import type { Io } from "./main.js";
import { makeLogger, makeModel, modelLimits } from "./run.js";
import { chaosFaults } from "./chaos.js";
import { closeOwner, describeHolder, envName, fencedLine, fillFromEnv, isFence, MAX_REOPENS, OwnerLease, takeLease } from "./owner.js";
import { chooseStorage, dbName, STORAGE_FLAGS, STORAGE_HELP } from "./storage.js";
import { createTimelineHandler, type TimelineHandler } from "../ui/server.js";
import { hasCode } from "../errors.js";
import { CELL_FLAGS, CELL_HELP, sandboxOptions, secretFiles } from "./cells.js";
import { chooseSandbox } from "../exec/sandbox.js";
import { ACCESS_FLAGS, ACCESS_HELP, accessFromFlags } from "./http-access.js";
import { APPROVAL_HELP, approvalFlags } from "./steer.js";
import { createApiHandler } from "./api.js";

export const SERVE_FLAGS = {
  ...STORAGE_FLAGS,
  ...CELL_FLAGS,
  model: { type: "string" },
  "base-url": { type: "string" },
  "model-timeout": { type: "string" },
  "model-retry-budget": { type: "string" },
  "max-output-tokens": { type: "string" },
  listen: { type: "string" },
  "log-level": { type: "string" },
  cwd: { type: "string" },
  create: { type: "boolean" },
  takeover: { type: "boolean" },
  lease: { type: "string" },
  "fenced-linger": { type: "string" },
  ui: { type: "boolean" },
  "require-approval": { type: "string", multiple: true },
  "api-wait": { type: "string" },
  ...ACCESS_FLAGS,
} as const;

const HELP = `usage: cairn serve --db NAME --model SPEC [--listen HOST:PORT] [flags]

The worker a job scheduler runs (restart it on any exit). Binds --listen first, then waits in standby
while another live process owns database NAME (its owner lease is renewed), takes it over when that
lease ends, recovers and continues its unfinished runs, and starts runs submitted with \`cairn
submit\`. Serves /metrics (Prometheus), /healthz (alive) and /readyz (200 only while it owns the
database) on --listen; with --ui, the timeline page at / and its API (every run's transcripts).
/healthz and /readyz answer any client. /metrics and the page answer only to this server's own Host
names, and need the token when one is in force (given, or generated for a non-loopback --listen).
SIGTERM: stop launching, stop running cells (recorded as they are), exit 0.
Fenced by an explicit takeover elsewhere: /readyz 503 for --fenced-linger, then exit 3.
${STORAGE_HELP}
  --model SPEC            as for cairn run (the model of every run this worker drives)
  --base-url URL          the provider's base URL
  --model-timeout, --model-retry-budget, --max-output-tokens   as for cairn run (a spent retry
                          budget parks the run as blocked; a restart or \`cairn resume\` continues it)
  --listen HOST:PORT      default 127.0.0.1:9464 (port 0 picks a free one)
  --ui                    serve the timeline page and its API on --listen too (read-only)
${ACCESS_HELP}
  The HTTP API (/api/v1/..., docs/api.md) needs the token, as "Authorization: Bearer TOKEN" only:
  submit runs, read status and events, follow them live, post observations, pause, unpause, cancel,
  approve, deny, fork.
  --api-wait DURATION     how long an API steer request waits for the owner to apply it before
                          answering 202 (default 30s; a request may ask for less)
  --cwd DIR               where submitted runs execute (default: the current directory)
${APPROVAL_HELP.replace("cells matching RULE", "this worker's rule, for every run it drives: cells matching RULE")}
  --create                create the database when it does not exist (otherwise that is exit 2)
  --takeover              take the database from a live owner (fences it); for operators only
  --lease DURATION        the owner lease length (default 10s): a standby takes over at most this
                          long after the owner stopped renewing
  --fenced-linger DURATION  how long a fenced worker keeps answering before exit 3 (default 30s)
  --log-level LEVEL       default info; JSON lines on stderr (human-readable on a terminal)
${CELL_HELP.replace("auto (default for run and resume)", "auto").replace("required (default for serve)", "required (the default here)")}

Every flag can also come from the environment: CAIRN_ + the flag in upper case with underscores
(CAIRN_DB, CAIRN_MODEL, CAIRN_LISTEN, CAIRN_DATA_DIR, CAIRN_TAKEOVER=true, ...; --etcd is
CAIRN_ETCD_ENDPOINTS, --url is CAIRN_DS_URL). The command line wins.`;

/**
 * /readyz: ready while this process owns the database, the storage holds its quorum (replicated) and
 * the ownership lease is held; otherwise 503 with the reason.
 */
export function readiness(h: Harness, name: string): { ready: boolean; reason: string } {
  if (h.status !== "open") return { ready: false, reason: `${h.status}: this process no longer owns "${name}"` };
  const { stats, leaseHeld } = h.storageState();
  if (stats.fenced) return { ready: false, reason: `fenced: another process opened "${name}"` };
  if (stats.poisoned) return { ready: false, reason: `a commit's outcome is unknown: this process must reopen "${name}"` };
  if (stats.quorumHeld === false) {
    return { ready: false, reason: `storage unavailable: the etcd quorum is lost (${stats.membersReachable ?? "?"} of ${stats.membersTotal ?? "?"} members answer); commits wait` };
  }
  if (leaseHeld === false) return { ready: false, reason: `the ownership lease of "${name}" is not held` };
  return { ready: true, reason: `owns "${name}" at epoch ${h.epoch}; storage reachable` };
}

/** Without --ui: the page's paths say where the page is instead of a bare 404. */
const NO_PAGE: TimelineHandler = {
  async handle(req, res) {
    const path = new URL(req.url ?? "/", "http://localhost").pathname; // the server already refused a target that does not parse
    if (path !== "/" && !path.startsWith("/api/") && !path.startsWith("/ui/")) return false;
    res.writeHead(404, { "content-type": "text/plain; charset=utf-8", "cache-control": "no-store" });
    res.end("not found: this port serves /metrics, /healthz and /readyz; the timeline page is served here only with `cairn serve --ui` (or run `cairn ui`)\n");
    return true;
  },
  async close() {},
};

export async function serveCommand(argv: readonly string[], io: Io): Promise<number> {
  const p = parse("serve", argv, SERVE_FLAGS);
  if (p.values.help) {
    io.out(HELP);
    return EXIT.ok;
  }
  if (p.positionals.length > 0) throw new UsageError(`cairn serve takes no goal; it drives the runs in the database (submit new ones with \`cairn submit\`).`);
  // 1. Every flag, before anything touches the network or the database.
  fillFromEnv(p, "serve", io.env, SERVE_FLAGS);
  const name = dbName(p, "serve");
  const listen = str(p, "listen") ?? "127.0.0.1:9464";
  let bindHost: string;
  try {
    bindHost = parseListen(listen).host;
  } catch (err) {
    throw new UsageError(`cairn serve: ${(err as Error).message}${p.values.listen !== undefined && io.env[envName("listen")] === listen ? " (from CAIRN_LISTEN)" : ""}`);
  }
  const ui = flag(p, "ui");
  const access = accessFromFlags(p, "serve", io.env, bindHost, ui ? "/metrics, the timeline page and every run's transcripts (cells' output, patches)" : "/metrics");
  const apiWait = str(p, "api-wait");
  const apiWaitMs = apiWait === undefined ? 30_000 : apiWait.trim() === "0" ? 0 : durationSeconds("serve", "api-wait", apiWait) * 1000;
  const lingerMs = durationSeconds("serve", "fenced-linger", str(p, "fenced-linger") ?? "30s") * 1000;
  const cwd = resolve(str(p, "cwd") ?? ".");
  if (!existsSync(cwd) || !statSync(cwd).isDirectory()) throw new UsageError(`cairn serve: --cwd ${cwd} is not a directory.`);
  const create = flag(p, "create");
  const takeover = flag(p, "takeover");
  const logger = makeLogger(p, "info");
  const faults = chaosFaults(io.env);
  const model = makeModel(p, "serve", io.env);
  const limits = modelLimits(p, "serve");
  const approval = approvalFlags(p, "serve");
  let choice;
  let sandbox;
  try {
    choice = await chooseStorage(p, "serve", io.env, logger);
    // A worker runs cells nobody watches: without a sandbox it refuses to start unless told --sandbox none.
    sandbox = sandboxOptions(p, "serve", io.env, "required", [choice.dataDir, ...secretFiles(io.env, p)]);
    if (chooseSandbox(sandbox.mode ?? "required").kind === "none") {
      io.err("cairn: warning: --sandbox none: cells run with this worker's full reach (its files, network, credentials on disk, other processes)");
    }
  } catch (err) {
    await model.close?.().catch(() => undefined);
    throw err;
  }
  const storage = choice.storage;
  const metrics = new Metrics({ adapter: choice.adapter, db: name });
  let state: WorkerState = "starting";
  let holder: LeaseView | null = null;
  let h: Harness | null = null;
  let reason = "starting";
  const setState = (s: WorkerState, why: string) => {
    state = s;
    reason = why;
    metrics.workerState(s, s === "owner");
  };
  setState("starting", "starting: checking the database");
  metrics.onScrape(() => {
    if (h !== null && h.status === "open") h.refreshMetrics();
    metrics.workerState(state, state === "owner" && h !== null && h.status === "open");
  });

  // 2. Bind the port: a busy or forbidden port is a configuration problem (exit 2), found before the
  // database is touched, so it can never cost a healthy owner its database.
  let server: ObservabilityServer;
  // The timeline page (read-only, through a reader) only when asked for: it carries every transcript.
  const page: TimelineHandler = ui ? createTimelineHandler({ storage, databases: async () => [name], logger }) : NO_PAGE;
  // The API (docs/api.md) answers /api/v1/ before the page, whose own paths are /api/* without a version.
  const api = createApiHandler({ storage, name, logger, tokenInForce: access.policy.token !== null, waitMs: apiWaitMs });
  const routes: TimelineHandler = {
    handle: async (req, res) => (await api.handle(req, res)) || page.handle(req, res),
    close: async () => {
      await api.close();
      await page.close();
    },
  };
  try {
    server = await startObservabilityServer({
      listen,
      metrics,
      logger,
      routes,
      access: access.policy,
      ready: () => {
        if (state === "owner" && h !== null && h.status === "open") return readiness(h, name);
        if (state === "owner" && h !== null) return { ready: false, reason: `${h.status}: this process no longer owns "${name}"` };
        return { ready: false, reason };
      },
    });
  } catch (err) {
    await model.close?.().catch(() => undefined);
    await storage.close().catch(() => undefined);
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === "EADDRINUSE" ? "the port is already in use" : code === "EACCES" ? "permission denied (ports below 1024 need privileges)" : code === "EADDRNOTAVAIL" ? "no interface has that address" : (err as Error).message;
    throw new UsageError(`cairn serve: cannot listen on ${listen}: ${why}; choose another --listen.`);
  }
  if (access.notice !== null) for (const line of access.notice.split("\n")) io.err(line);

  let terminated = false;
  let wakeStandby: (() => void) | null = null;
  let onSig = () => {};
  const terminatedP = new Promise<"term">((resolvePromise) => {
    onSig = () => {
      terminated = true;
      wakeStandby?.();
      resolvePromise("term");
    };
  });
  process.once("SIGTERM", onSig);
  process.once("SIGINT", onSig);
  let lease: HeldLease | "no-leases" | null = null;
  const tracing = await startTracing(io.env, logger);
  try {
    // 3. The database must exist (a typo must not create an empty one and report ready).
    if (!create) {
      try {
        await (await storage.reader(name)).close();
      } catch (err) {
        if (hasCode(err, "not_found")) {
          throw new UsageError(`cairn serve: database "${name}" does not exist in ${choice.describe}; check --db, or pass --create to create it.`);
        }
        throw err;
      }
    }
    // 4. Standby until the owner lease is ours.
    lease = await takeLease({
      storage,
      name,
      role: "serve",
      force: takeover,
      logger,
      stopped: () => terminated,
      wake: (w) => (wakeStandby = w),
      onStandby: (view) => {
        const first = state !== "standby";
        holder = view;
        setState("standby", view === null ? `standby: cannot read the owner lease of "${name}" yet; retrying` : `standby: ${describeHolder(view)}; waiting for its lease to end`);
        if (first) {
          logger.info({ db: name, owner: holder?.owner ?? null }, "standby: another live process owns the database");
          io.err(`cairn: standby: database "${name}" is ${view === null ? "not reachable yet" : describeHolder(view)}; taking over when its lease ends (or run with --takeover)`);
        }
      },
    });
    if (lease === null) {
      logger.info({}, "SIGTERM in standby: exiting");
      return EXIT.ok;
    }
    const owned = lease === "no-leases" ? null : new OwnerLease(lease, storage.leases?.ttlMs ?? 0, logger);
    let why: "fenced" | "poisoned" | "unreachable" | "closed" | "term";
    const stop: { error: Error | null } = { error: null };
    for (let opens = 1; ; opens++) {
      const openedAt = performance.now();
      try {
        h = await Harness.open({ storage, name, model, workDir: choice.dataDir, logger, metrics, tracing, create, submitCwd: cwd, limits, sandbox, approval, ...(faults ? { faults } : {}) });
        owned?.attach(h, openedAt);
        const harness = h;
        setState("owner", `owns "${name}" at epoch ${harness.epoch}`);
        logger.info({ url: server.url, epoch: harness.epoch }, "serving");
        io.err(`cairn: serving database "${name}" (${choice.describe}) at epoch ${harness.epoch}; metrics on ${server.url}/metrics`);
        const stopped = new Promise<"fenced" | "poisoned" | "unreachable" | "closed">((r) =>
          harness.onStop((status, err) => {
            stop.error = err;
            r(status === "open" ? "closed" : status);
          }),
        );
        await harness.resume();
        why = terminated ? "term" : await Promise.race([stopped, terminatedP]);
      } catch (err) {
        // Fenced while it opened or recovered (it lost a race to open): told as any fence below.
        if (!((h !== null && h.status === "fenced") || (h === null && isFence(err)))) throw err;
        why = "fenced";
      }
      // Fenced by an opener that took the owner lease before this process did (and claimed after
      // it): the lease is still ours, so this process claims again and the other one stops, fenced.
      if (why !== "fenced" || terminated || owned === null || opens > MAX_REOPENS || !(await owned.raced(h?.epoch ?? 0, openedAt))) break;
      logger.warn({ db: name, opens }, "fenced by an opener that no longer holds the owner lease: claiming the database again");
      await h?.close().catch(() => undefined);
      h = null;
    }
    if (why === "fenced") {
      setState("fenced", `fenced: this process no longer owns "${name}"`);
      logger.error({ db: name }, "fenced: another process took the database over; exiting with code 3");
      io.err(`${fencedLine(name)} Restarted, this worker waits in standby.`);
      // Keep answering for a while: /readyz says why (503) and scrapes see cairn_worker_state{state="fenced"}.
      await Promise.race([new Promise((r) => setTimeout(r, lingerMs)), terminatedP]);
      return EXIT.fenced;
    }
    if (why === "unreachable") {
      io.err(`cairn: ${stop.error?.message ?? `lost the ownership lease of "${name}"`}`);
      return EXIT.storage;
    }
    if (why === "poisoned") {
      io.err(`cairn: a commit's outcome is unknown; exiting so that a fresh process can reopen "${name}" and read the truth.`);
      return EXIT.storage;
    }
    logger.info({}, "SIGTERM: shutting down");
    return EXIT.ok;
  } finally {
    process.off("SIGTERM", onSig);
    process.off("SIGINT", onSig);
    setState("stopping", "stopping");
    await closeOwner(h, lease);
    await tracing.shutdown();
    await routes.close();
    await server.close();
    await model.close?.().catch(() => undefined);
    await storage.close().catch(() => undefined);
  }
}
